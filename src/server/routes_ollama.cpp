// Ollama's routes (server/ollama.hpp): /api/chat and /api/generate (NDJSON streams unless
// "stream": false), /api/tags, /api/show, /api/ps, /api/version, on the same engine steps as
// OpenAI's (server.hpp).
#include "server/http_server.hpp"

#include <atomic>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "core/log.hpp"
#include "server/ollama.hpp"
#include "server/routes_common.hpp"
#include "server/server.hpp"
#include "server/tool_calls.hpp"
#include "server/wire.hpp"

namespace ember::server {

namespace {

std::string line(const json& j) { return dump(j) + "\n"; }

// The prefix of a response's call ids (call_<prefix>_<n>): Ollama's calls carry none, but the
// calls read back are named alike on both routes.
std::string call_id_prefix_of_next() {
  static std::atomic<uint64_t> n{0};
  return fmt::format("ollama{}", n.fetch_add(1));
}

ollama::Timings timings(const GenerateResult& r, std::chrono::steady_clock::time_point arrived) {
  ollama::Timings t;
  t.total_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - arrived).count();
  t.prompt_ns = static_cast<int64_t>(r.prompt_seconds * 1e9);
  t.eval_ns = static_cast<int64_t>(r.gen_seconds * 1e9);
  t.prompt_tokens = r.n_prompt;
  t.tokens = r.n_generated;
  return t;
}

// Ollama's chat and generate: a JSON body, or NDJSON lines ending in one with "done": true.
class OllamaWire final : public Wire {
 public:
  OllamaWire(const ServedModel& served, bool chat, std::chrono::steady_clock::time_point arrived)
      : served_(served), chat_(chat), arrived_(arrived), prefix_(call_id_prefix_of_next()) {}

  void error(http::Response& res, const ApiError& e) const override { send_ollama_error(res, e); }
  std::string call_id_prefix() const override { return prefix_; }
  void whole(http::Response& res, const std::vector<WholeChoice>& choices) const override {
    const WholeChoice& c = choices.front();
    res.set_content(dump(ollama::final_chunk(served_, chat_, c.out.content, c.result.finish,
                                             timings(c.result, arrived_), &c.out.calls)),
                    "application/json");
  }

  const char* stream_type() const override { return "application/x-ndjson"; }
  bool waits_by_comments() const override { return false; }  // NDJSON has no comments
  bool text(const Write& w, const std::string& piece) override { return w(line(ollama::chunk(served_, chat_, piece))); }
  bool end(const Write& w, const GenerateResult& r, const std::string& rest,
           const std::vector<ToolCall>& calls) override {
    bool ok = rest.empty() || text(w, rest);
    if (ok && !calls.empty()) ok = w(line(ollama::tool_calls_chunk(served_, calls)));
    return ok && w(line(ollama::final_chunk(served_, chat_, "", r.finish, timings(r, arrived_))));
  }
  // An error line ends the stream: no "done": true.
  std::string error_event(const ApiError& e) override { return line(json{{"error", e.message}}); }

 private:
  const ServedModel& served_;
  const bool chat_;
  const std::chrono::steady_clock::time_point arrived_;
  const std::string prefix_;
};

}  // namespace

void Server::ollama_completion(const http::Request& req, http::Response& res, bool chat) {
  const auto arrived = std::chrono::steady_clock::now();
  ++n_requests_;
  if (draining_ || stopping_) return send_ollama_error(res, shutting_down_error());
  auto parsed = parse_gated([&] { return ollama::parse_request(req.body, chat, served_); });
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_ollama_error(res, *e);
  const ollama::Request& oreq = std::get<ollama::Request>(parsed);
  auto prepared = prepare_request(oreq.completion, tok_, served_, std::random_device{}());
  if (auto* e = std::get_if<ApiError>(&prepared)) return send_ollama_error(res, *e);
  PreparedRequest& p = std::get<PreparedRequest>(prepared);
  // num_predict -1 (Ollama's default) or -2: until the model ends it or the context is full.
  if (!oreq.completion.max_tokens) p.gen.max_tokens = served_.n_ctx - static_cast<int64_t>(p.prompt.size());
  if (auto e = ollama::apply_limits(oreq, p)) return send_ollama_error(res, *e);
  drive(req, res, std::make_shared<OllamaWire>(served_, chat, arrived),
        {std::make_shared<const PreparedRequest>(std::move(p))}, oreq.completion.stream, arrived);
}

void Server::install_ollama_routes() {
  http::HttpServer& s = *http_;
  s.Post("/api/chat", [this](const http::Request& req, http::Response& res) { ollama_completion(req, res, true); });
  s.Post("/api/generate",
         [this](const http::Request& req, http::Response& res) { ollama_completion(req, res, false); });
  s.Get("/api/version", [](const http::Request&, http::Response& res) {
    res.set_content(dump(ollama::version()), "application/json");
  });
  s.Get("/api/tags", [this](const http::Request&, http::Response& res) {
    res.set_content(dump(ollama::tags(served_)), "application/json");
  });
  s.Get("/api/ps", [this](const http::Request&, http::Response& res) {
    res.set_content(dump(ollama::ps(served_, 0)), "application/json");
  });
  s.Post("/api/show", [this](const http::Request& req, http::Response& res) {
    if (auto e = ollama::check_show(req.body, served_)) return send_ollama_error(res, *e);
    res.set_content(dump(ollama::show(served_)), "application/json");
  });
}

}  // namespace ember::server
