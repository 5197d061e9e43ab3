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

namespace ember::server {

namespace {

std::string line(const json& j) { return dump(j) + "\n"; }

// The prefix of a response's call ids (call_<prefix>_<n>): Ollama's calls carry none, but the
// calls read back are named alike on both routes.
std::string call_id_prefix() {
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

}  // namespace

void Server::ollama_completion(const http::Request& req, http::Response& res, bool chat) {
  const auto arrived = std::chrono::steady_clock::now();
  ++n_requests_;
  if (draining_ || stopping_) return send_ollama_error(res, shutting_down_error());
  const int fd = req.fd;  // the request's connection: a client that hangs up is seen there
  auto parsed = parse_gated([&] { return ollama::parse_request(req.body, chat, served_); });
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_ollama_error(res, *e);
  const ollama::Request& oreq = std::get<ollama::Request>(parsed);
  auto prepared = prepare_request(oreq.completion, tok_, served_, std::random_device{}());
  if (auto* e = std::get_if<ApiError>(&prepared)) return send_ollama_error(res, *e);
  PreparedRequest& p = std::get<PreparedRequest>(prepared);
  // num_predict -1 (Ollama's default) or -2: until the model ends it or the context is full.
  if (!oreq.completion.max_tokens) p.gen.max_tokens = served_.n_ctx - static_cast<int64_t>(p.prompt.size());
  if (auto e = ollama::apply_limits(oreq, p)) return send_ollama_error(res, *e);
  auto prep = std::make_shared<const PreparedRequest>(std::move(p));
  std::unique_ptr<SlotQueue::Ticket> ticket = admit(prep);
  if (!ticket) return send_ollama_error(res, busy_error());

  if (!oreq.completion.stream) {
    const int slot = wait_for_sequence(*ticket, [&] { return http::peer_closed(fd); }, std::chrono::milliseconds(250));
    if (slot < 0) {
      if (http::peer_closed(fd)) ++n_cancelled_;
      return send_ollama_error(res, shutting_down_error());
    }
    std::string text;
    const auto done =
        generate_text(slot, *prep, arrived, text, [](const TokenLogprobs&) {}, [&] { return http::peer_closed(fd); });
    ticket.reset();
    if (const auto* e = std::get_if<ApiError>(&done)) return send_ollama_error(res, *e);
    const GenerateResult& r = std::get<GenerateResult>(done);
    if (cut_by_shutdown(r)) return send_ollama_error(res, cut_off_error(r.n_generated));
    ToolOutput out{text, {}};
    if (prep->tools) out = parse_tool_output(prep->tool_format, *prep->tools, text, call_id_prefix());
    res.set_content(dump(ollama::final_chunk(served_, chat, out.content, r.finish, timings(r, arrived), &out.calls)),
                    "application/json");
    return;
  }

  auto held = std::make_shared<std::unique_ptr<SlotQueue::Ticket>>(std::move(ticket));
  res.set_chunked_content_provider(
      "application/x-ndjson", [this, held, prep, chat, arrived, fd](size_t, http::DataSink& sink) {
        if (!*held) return false;
        auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
        // Waiting: NDJSON has no comments, so the client's hang-up is found by its socket.
        const int slot = wait_for_sequence(**held, [&] { return http::peer_closed(fd); }, std::chrono::milliseconds(500));
        if (slot < 0) {
          held->reset();
          if (!(stopping_ || draining_)) {
            ++n_cancelled_;
            return false;
          }
          if (write(line(json{{"error", shutting_down_error().message}}))) sink.done();
          return true;
        }
        try {
          // With tools, text that may be a call waits (server/tool_calls.hpp); the end decides.
          std::optional<HeldToolText> held_text;
          if (prep->tools) held_text.emplace(prep->tool_format, *prep->tools);
          const auto send_content = [&](const std::string& piece) {
            return piece.empty() || write(line(ollama::chunk(served_, chat, piece)));
          };
          const GenerateResult r = generate(
              slot, *prep, arrived,
              [&](std::string_view piece) {
                if (stopping_.load()) return false;
                return send_content(held_text ? held_text->add(piece) : std::string(piece));
              },
              [](const TokenLogprobs&) {}, nullptr);
          held->reset();
          if (cut_by_shutdown(r)) {  // an error line ends the stream: no "done": true
            if (write(line(json{{"error", cut_off_error(r.n_generated).message}}))) sink.done();
            return true;
          }
          if (r.finish == FinishReason::cancelled) return false;
          bool ok = true;
          if (held_text) {  // the held-back text: calls, and what text is left
            const HeldToolText::End end = held_text->finish(call_id_prefix());
            ok = send_content(end.content);
            if (ok && !end.calls.empty()) ok = write(line(ollama::tool_calls_chunk(served_, end.calls)));
          }
          if (ok) ok = write(line(ollama::final_chunk(served_, chat, "", r.finish, timings(r, arrived))));
          if (ok) sink.done();
          return ok;
        } catch (const std::exception& e) {
          held->reset();
          if (write(line(json{{"error", failed(e).message}}))) sink.done();
          return true;
        }
      });
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
