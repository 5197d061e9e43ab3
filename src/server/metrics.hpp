// The server's counters for GET /metrics, in Prometheus' text format (version 0.0.4): requests by
// route family and HTTP status, prompt, generated and embedded tokens, generation throughput over the last
// minute, the time to first token as a histogram, and the gauges the caller reads at scrape time
// (queue depth, busy sequences, KV cache use). Several `ember serve` behind a router or load
// balancer are watched this way. Thread-safe; no allocation on the counting paths but the first
// of a status.
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>

namespace ember::server {

// What the server knows at scrape time.
struct MetricsGauges {
  uint64_t slots_total = 0, slots_busy = 0, queued = 0, queue_limit = 0;
  uint64_t kv_tokens = 0, kv_capacity = 0;  // tokens held in the sequences' caches, and room
  uint64_t rejected = 0, timed_out = 0;     // 503 for a full queue; connections timed out
  // The memory tier (model/expert_cache.hpp), where the model runs one: its counts since load.
  bool expert_cache = false;
  uint64_t expert_hits = 0, expert_misses = 0, expert_bytes_read = 0;
  double expert_read_seconds = 0;
  uint64_t expert_read_ahead = 0, expert_read_ahead_used = 0;  // read ahead; of those, then chosen
  // A dense model larger than its budget (sparse/map_reads.hpp): the pages of FFN rows made
  // resident from the file's map since load, and the time waited on them.
  bool map_reads = false;
  uint64_t map_read_pages = 0;
  uint64_t map_read_rows = 0, map_read_kept_rows = 0;  // neurons asked for; of those, kept resident
  double map_read_seconds = 0;
};

class Metrics {
 public:
  // Time-to-first-token histogram buckets (seconds).
  static constexpr std::array<double, 10> kTtftBuckets = {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

  void request(int status);                                // an answered request, by status
  void generated(int64_t prompt_tokens, int64_t cached_tokens, int64_t tokens);  // a finished generation
  void first_token(double seconds);                        // from arrival to the first text
  void embedded(int64_t inputs, int64_t tokens);           // a finished embedding request
  std::string prometheus(const MetricsGauges& g, const std::string& model) const;

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> by_status_;
  std::atomic<uint64_t> prompt_tokens_{0}, cached_tokens_{0}, tokens_{0}, generations_{0};
  std::atomic<uint64_t> embeddings_{0}, embedding_tokens_{0};
  std::array<uint64_t, kTtftBuckets.size() + 1> ttft_{};  // the last: +Inf
  double ttft_sum_ = 0;
  uint64_t ttft_count_ = 0;
  // Generated tokens by finish time, for the throughput of the last minute.
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> recent_;
};

}  // namespace ember::server
