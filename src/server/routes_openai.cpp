// OpenAI's routes (server.hpp): /v1/chat/completions and /v1/completions (and without /v1), their
// streams as server-sent events; /v1/models; and llama.cpp's /tokenize, /detokenize and /props.
#include "server/http_server.hpp"

#include <optional>
#include <random>

#include "core/log.hpp"
#include "server/request_fields.hpp"
#include "server/routes_common.hpp"
#include "server/server.hpp"

namespace ember::server {

void Server::openai_completion(const http::Request& req, http::Response& res, bool chat) {
  const auto arrived = std::chrono::steady_clock::now();
  ++n_requests_;
  if (draining_ || stopping_) {
    set_retry_after(res, shutting_down_error());
    return send_error(res, shutting_down_error());
  }
  // The request's connection, held while it is answered: the watchdog leaves it alone, and a
  // non-streaming request watches it for the client hanging up.
  const int fd = req.fd;  // the request's connection: a client that hangs up is seen there
  auto parsed = parse_gated([&] { return parse_completion_request(req.body, chat, served_); });
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  const CompletionRequest& creq = std::get<CompletionRequest>(parsed);
  auto prepared = prepare_request(creq, tok_, served_, std::random_device{}());
  if (auto* e = std::get_if<ApiError>(&prepared)) return send_error(res, *e);
  auto prep = std::make_shared<const PreparedRequest>(std::move(std::get<PreparedRequest>(prepared)));
  // Several prompts (completions, not streaming): a choice each, run in turn on one sequence.
  std::vector<std::shared_ptr<const PreparedRequest>> preps{prep};
  for (size_t i = 1; i < creq.prompts.size(); ++i) {
    CompletionRequest one = creq;
    one.prompt = creq.prompts[i].text;
    one.prompt_ids = creq.prompts[i].ids;
    auto p = prepare_request(one, tok_, served_, std::random_device{}());
    if (auto* e = std::get_if<ApiError>(&p)) {
      e->message = fmt::format("prompt[{}]: {}", i, e->message);
      return send_error(res, *e);
    }
    preps.push_back(std::make_shared<const PreparedRequest>(std::move(std::get<PreparedRequest>(p))));
  }
  std::unique_ptr<SlotQueue::Ticket> ticket = admit(prep);
  if (!ticket) {
    set_retry_after(res, busy_error());
    return send_error(res, busy_error());
  }
  ResponseMeta meta{(chat ? "chatcmpl-" : "cmpl-") + unguessable_id(),
                    unix_now(), served_.id, chat};

  if (!creq.stream) {
    const int slot = wait_for_sequence(*ticket, [&] { return http::peer_closed(fd); }, std::chrono::milliseconds(250));
    if (slot < 0) {
      if (http::peer_closed(fd)) ++n_cancelled_;  // (a client that left reads nothing)
      set_retry_after(res, shutting_down_error());
      return send_error(res, shutting_down_error());
    }
    json body;
    Usage usage;
    for (size_t i = 0; i < preps.size(); ++i) {
      const PreparedRequest& pi = *preps[i];
      std::string text;
      std::vector<TokenLogprobs> lps;
      const auto done = generate_text(
          slot, pi, arrived, text, [&](const TokenLogprobs& t) { lps.push_back(t); }, [&] { return http::peer_closed(fd); });
      if (const auto* e = std::get_if<ApiError>(&done)) return send_error(res, *e);
      const GenerateResult& r = std::get<GenerateResult>(done);
      // Cut off by shutdown: an error, never a 200 that looks complete.
      if (cut_by_shutdown(r)) return send_error(res, cut_off_error(r.n_generated));
      const json lp = pi.gen.n_logprobs >= 0 ? logprobs_json(meta.chat, lps, tok_) : json(nullptr);
      ToolOutput out{pi.echo + text, {}};
      if (pi.tools) out = parse_tool_output(pi.tool_format, *pi.tools, text, meta.id.substr(meta.id.find('-') + 1));
      const Usage u{r.n_prompt, r.n_generated, r.n_cached};
      json one = completion_json(meta, out.content, r.finish, u, lp, &out.calls);
      usage = {usage.prompt_tokens + u.prompt_tokens, usage.completion_tokens + u.completion_tokens,
               usage.cached_tokens + u.cached_tokens};
      if (i == 0) {
        body = std::move(one);
      } else {
        one["choices"][0]["index"] = i;
        body["choices"].push_back(std::move(one["choices"][0]));
      }
    }
    ticket.reset();
    body["usage"] = usage_json(usage);
    res.set_content(dump(body), "application/json");
    return;
  }

  const bool include_usage = creq.include_usage;
  // The provider may be copied; the ticket lives in one shared place so that releasing it
  // from any copy frees the sequence.
  auto held = std::make_shared<std::unique_ptr<SlotQueue::Ticket>>(std::move(ticket));
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream", [this, held, meta, include_usage, prep, arrived](size_t, http::DataSink& sink) {
        if (!*held) return false;  // already ran
        auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
        bool waited = false;
        const int slot = wait_for_stream_sequence(*held, sink, waited);
        if (slot < 0) return waited;
        try {
          if ((meta.chat && !write(sse(dump(role_chunk_json(meta))))) ||
              (!prep->echo.empty() && !write(sse(dump(chunk_json(meta, prep->echo, std::nullopt, nullptr)))))) {
            ++n_cancelled_;
            held->reset();
            return false;
          }
          // Log-probabilities of the tokens sampled since the last chunk ride on the next one
          // (text held back by a stop string or split UTF-8 arrives later than its token).
          const bool want_lp = prep->gen.n_logprobs >= 0;
          std::vector<TokenLogprobs> pending;
          int64_t offset = 0;
          const auto take_lp = [&]() -> json {
            if (!want_lp) return nullptr;
            json j = logprobs_json(meta.chat, pending, tok_, &offset);
            pending.clear();
            return j;
          };
          // With tools, text that may be a call waits (server/tool_calls.hpp): all of it where the
          // call is forced, from where one may start otherwise; the end decides.
          std::optional<HeldToolText> held_text;
          if (prep->tools) held_text.emplace(prep->tool_format, *prep->tools);
          const auto send_content = [&](const std::string& piece) {
            return piece.empty() || write(sse(dump(chunk_json(meta, piece, std::nullopt, take_lp()))));
          };
          const GenerateResult r = generate(
              slot, *prep, arrived,
              [&](std::string_view piece) {
                if (stopping_.load()) return false;
                return send_content(held_text ? held_text->add(piece) : std::string(piece));
              },
              [&](const TokenLogprobs& t) { pending.push_back(t); }, nullptr);
          held->reset();  // the sequence is free for the next request from here on
          // Cut off by shutdown: an error event ends the stream (no finish reason, no [DONE]).
          if (cut_by_shutdown(r)) {
            if (write(sse(error_body(cut_off_error(r.n_generated))))) sink.done();
            return true;
          }
          if (r.finish == FinishReason::cancelled) return false;
          bool ok = true;
          bool called = false;
          if (held_text) {  // the held-back text: calls, and what text is left
            const HeldToolText::End end = held_text->finish(meta.id.substr(meta.id.find('-') + 1));
            called = !end.calls.empty();
            if (!called) ok = send_content(end.content);
            else if (!end.content.empty()) ok = write(sse(dump(chunk_json(meta, end.content, std::nullopt, nullptr))));
            if (ok && called) ok = write(sse(dump(tool_calls_chunk_json(meta, end.calls))));
          }
          if (ok) ok = write(sse(dump(chunk_json(meta, "", r.finish, pending.empty() ? json(nullptr) : take_lp(), called))));
          if (ok && include_usage) ok = write(sse(dump(usage_chunk_json(meta, {r.n_prompt, r.n_generated, r.n_cached}))));
          if (ok) ok = write("data: [DONE]\n\n");
          if (ok) sink.done();
          return ok;
        } catch (const std::exception& e) {
          held->reset();
          if (write(sse(error_body(failed(e))))) sink.done();  // a whole response: its error
          return true;
        }
      });
}

void Server::install_openai_routes() {
  http::HttpServer& s = *http_;
  s.Get("/v1/models", [this](const http::Request&, http::Response& res) {
    res.set_content(dump(models_json(served_)), "application/json");
  });
  s.Get(R"(/v1/models/(.+))", [this](const http::Request& req, http::Response& res) {
    if (req.matches[1] != served_.id)
      return send_error(res, ApiError{404, fmt::format("The model '{}' does not exist", req.matches[1]),
                                      "invalid_request_error", "model", "model_not_found"});
    res.set_content(dump(models_json(served_)["data"][0]), "application/json");
  });
  for (const char* path : {"/v1/chat/completions", "/chat/completions"})  // (clients set up without /v1)
    s.Post(path, [this](const http::Request& req, http::Response& res) { openai_completion(req, res, true); });
  for (const char* path : {"/v1/completions", "/completions"})
    s.Post(path, [this](const http::Request& req, http::Response& res) { openai_completion(req, res, false); });

  // llama.cpp's: text to token ids and back, and the server's defaults.
  s.Post("/tokenize", [this](const http::Request& req, http::Response& res) {
    auto parsed = parse_tokenize_request(req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    res.set_content(dump(tokenize_json(std::get<TokenizeRequest>(parsed), tok_, served_.n_ctx)), "application/json");
  });
  s.Post("/detokenize", [this](const http::Request& req, http::Response& res) {
    auto parsed = parse_detokenize_request(req.body, tok_);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    const std::string& text = std::get<std::string>(parsed);
    res.set_content(dump(json{{"content", text}, {"prompt", text}}), "application/json");
  });
  s.Get("/tokenizer_info", [this](const http::Request&, http::Response& res) {
    res.set_content(dump(tokenizer_info_json(served_, tok_)), "application/json");
  });
  s.Get("/props", [this](const http::Request&, http::Response& res) {
    res.set_content(dump(props_json(served_, static_cast<int64_t>(opts_.parallel))), "application/json");
  });
}

}  // namespace ember::server
