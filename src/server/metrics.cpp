#include "server/metrics.hpp"

#include <fmt/format.h>

namespace ember::server {

namespace {
constexpr auto kWindow = std::chrono::seconds(60);

// A label value with Prometheus' escapes (backslash, quote, newline).
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}
}  // namespace

void Metrics::request(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++by_status_[status];
}

void Metrics::generated(int64_t prompt_tokens, int64_t cached_tokens, int64_t tokens) {
  prompt_tokens_ += static_cast<uint64_t>(prompt_tokens);
  cached_tokens_ += static_cast<uint64_t>(cached_tokens);
  tokens_ += static_cast<uint64_t>(tokens);
  ++generations_;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  recent_.push_back({now, tokens});
  while (!recent_.empty() && now - recent_.front().first > kWindow) recent_.pop_front();
}

void Metrics::embedded(int64_t inputs, int64_t tokens) {
  embeddings_ += static_cast<uint64_t>(inputs);
  embedding_tokens_ += static_cast<uint64_t>(tokens);
}

void Metrics::first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t b = 0;
  while (b < kTtftBuckets.size() && seconds > kTtftBuckets[b]) ++b;
  ++ttft_[b];
  ttft_sum_ += seconds;
  ++ttft_count_;
}

std::string Metrics::prometheus(const MetricsGauges& g, const std::string& model) const {
  const std::string m = fmt::format("model=\"{}\"", label(model));
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  // A metric of one sample.
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    metric(name, type, help);
    out += fmt::format("{}{{{}}} {}\n", name, m, v);
  };
  std::lock_guard<std::mutex> lock(mu_);
  metric("ember_requests_total", "counter", "HTTP requests answered, by status.");
  for (const auto& [status, n] : by_status_) out += fmt::format("ember_requests_total{{{},status=\"{}\"}} {}\n", m, status, n);
  one("ember_generations_total", "counter", "Generations finished (any reason).", static_cast<double>(generations_));
  one("ember_prompt_tokens_total", "counter", "Prompt tokens of finished generations.", static_cast<double>(prompt_tokens_));
  one("ember_prompt_tokens_cached_total", "counter", "Of those, served from the prompt cache.",
      static_cast<double>(cached_tokens_));
  one("ember_generated_tokens_total", "counter", "Tokens generated.", static_cast<double>(tokens_));
  one("ember_embeddings_total", "counter", "Inputs embedded (/v1/embeddings, /api/embed).", static_cast<double>(embeddings_));
  one("ember_embedding_tokens_total", "counter", "Tokens of the inputs embedded.", static_cast<double>(embedding_tokens_));
  // Tokens of the generations that finished within the last minute, over the minute.
  const auto now = std::chrono::steady_clock::now();
  int64_t recent = 0;
  for (const auto& [t, n] : recent_)
    if (now - t <= kWindow) recent += n;
  one("ember_tokens_per_second", "gauge", "Tokens of the generations finished in the last minute, per second.",
      static_cast<double>(recent) / std::chrono::duration<double>(kWindow).count());
  metric("ember_time_to_first_token_seconds", "histogram", "From a request's arrival to its first text.");
  uint64_t cum = 0;
  for (size_t b = 0; b <= kTtftBuckets.size(); ++b) {
    cum += ttft_[b];
    const std::string le = b < kTtftBuckets.size() ? fmt::format("{}", kTtftBuckets[b]) : "+Inf";
    out += fmt::format("ember_time_to_first_token_seconds_bucket{{{},le=\"{}\"}} {}\n", m, le, cum);
  }
  out += fmt::format("ember_time_to_first_token_seconds_sum{{{}}} {:.6f}\n", m, ttft_sum_);
  out += fmt::format("ember_time_to_first_token_seconds_count{{{}}} {}\n", m, ttft_count_);
  one("ember_slots", "gauge", "Sequences that generate at once (--parallel).", static_cast<double>(g.slots_total));
  one("ember_slots_busy", "gauge", "Sequences generating now.", static_cast<double>(g.slots_busy));
  one("ember_queue_depth", "gauge", "Requests waiting for a sequence.", static_cast<double>(g.queued));
  one("ember_queue_limit", "gauge", "Requests that may wait (--queue).", static_cast<double>(g.queue_limit));
  one("ember_requests_rejected_total", "counter", "Requests turned away with 503: the queue was full.",
      static_cast<double>(g.rejected));
  one("ember_connections_timed_out_total", "counter", "Connections closed for not sending a whole request in time.",
      static_cast<double>(g.timed_out));
  one("ember_kv_cache_tokens", "gauge", "Tokens held in the sequences' KV caches.", static_cast<double>(g.kv_tokens));
  one("ember_kv_cache_usage_ratio", "gauge", "KV cache positions in use over all there are.",
      g.kv_capacity ? static_cast<double>(g.kv_tokens) / static_cast<double>(g.kv_capacity) : 0.0);
  if (g.expert_cache) {
    one("ember_expert_cache_hits_total", "counter", "Chosen experts the memory tier held.",
        static_cast<double>(g.expert_hits));
    one("ember_expert_cache_misses_total", "counter", "Chosen experts the memory tier read from the file.",
        static_cast<double>(g.expert_misses));
    one("ember_expert_cache_read_bytes_total", "counter", "Bytes the memory tier read from the file.",
        static_cast<double>(g.expert_bytes_read));
    one("ember_expert_cache_read_seconds_total", "counter", "Time the forward passes waited on those reads.",
        g.expert_read_seconds);
    one("ember_expert_cache_read_ahead_total", "counter",
        "Experts the memory tier read ahead of their layer, as the next layer's router guessed them.",
        static_cast<double>(g.expert_read_ahead));
    one("ember_expert_cache_read_ahead_used_total", "counter", "Of those, the experts their layer's router then chose.",
        static_cast<double>(g.expert_read_ahead_used));
  }
  if (g.map_reads) {
    one("ember_map_read_pages_total", "counter",
        "Pages of FFN rows the memory tier made resident from the file's map (a read where the page cache lacked them).",
        static_cast<double>(g.map_read_pages));
    one("ember_map_read_seconds_total", "counter", "Time the forward passes waited on those pages.", g.map_read_seconds);
    one("ember_map_read_rows_total", "counter", "Neurons whose FFN rows the sparse path asked for.",
        static_cast<double>(g.map_read_rows));
    one("ember_map_read_kept_rows_total", "counter",
        "Of those, neurons whose rows the memory tier keeps resident (no read): the hit rate's numerator.",
        static_cast<double>(g.map_read_kept_rows));
  }
  return out;
}

}  // namespace ember::server
