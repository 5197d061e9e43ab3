// OpenAI's routes (server.hpp): /v1/chat/completions and /v1/completions (and without /v1), their
// streams as server-sent events; /v1/models; and llama.cpp's /tokenize, /detokenize and /props.
#include "server/http_server.hpp"

#include <optional>
#include <random>

#include "core/log.hpp"
#include "server/request_fields.hpp"
#include "server/routes_common.hpp"
#include "server/server.hpp"
#include "server/wire.hpp"

namespace ember::server {

namespace {

// OpenAI's completions and chat completions: a JSON body, or server-sent events of chunks ending
// in "data: [DONE]".
class OpenAiWire final : public Wire {
 public:
  OpenAiWire(ResponseMeta meta, const Tokenizer& tok, bool include_usage, bool want_logprobs, std::string echo)
      : meta_(std::move(meta)), tok_(tok), include_usage_(include_usage), want_lp_(want_logprobs),
        echo_(std::move(echo)) {}

  void error(http::Response& res, const ApiError& e) const override { send_error(res, e); }
  std::string call_id_prefix() const override { return meta_.id.substr(meta_.id.find('-') + 1); }

  void whole(http::Response& res, const std::vector<WholeChoice>& choices) const override {
    json body;
    Usage usage;
    for (size_t i = 0; i < choices.size(); ++i) {
      const WholeChoice& c = choices[i];
      const GenerateResult& r = c.result;
      const json lp = c.prep->gen.n_logprobs >= 0 ? logprobs_json(meta_.chat, c.logprobs, tok_) : json(nullptr);
      const Usage u{r.n_prompt, r.n_generated, r.n_cached};
      // Echo: the prompt's text before the answer's (not where the answer was read for calls).
      json one = completion_json(meta_, c.prep->tools ? c.out.content : c.prep->echo + c.out.content, r.finish, u, lp,
                                 &c.out.calls);
      usage = {usage.prompt_tokens + u.prompt_tokens, usage.completion_tokens + u.completion_tokens,
               usage.cached_tokens + u.cached_tokens};
      if (i == 0) {
        body = std::move(one);
      } else {
        one["choices"][0]["index"] = i;
        body["choices"].push_back(std::move(one["choices"][0]));
      }
    }
    body["usage"] = usage_json(usage);
    res.set_content(dump(body), "application/json");
  }

  const char* stream_type() const override { return "text/event-stream"; }
  bool waits_by_comments() const override { return true; }
  bool begin(const Write& w) override {
    return (!meta_.chat || w(sse(dump(role_chunk_json(meta_))))) &&
           (echo_.empty() || w(sse(dump(chunk_json(meta_, echo_, std::nullopt, nullptr)))));
  }
  // Log-probabilities of the tokens sampled since the last chunk ride on the next one (text held
  // back by a stop string or split UTF-8 arrives later than its token).
  void logprobs(const TokenLogprobs& t) override {
    if (want_lp_) pending_.push_back(t);
  }
  bool text(const Write& w, const std::string& piece) override {
    return w(sse(dump(chunk_json(meta_, piece, std::nullopt, take_logprobs()))));
  }
  bool end(const Write& w, const GenerateResult& r, const std::string& rest,
           const std::vector<ToolCall>& calls) override {
    const bool called = !calls.empty();
    bool ok = true;
    if (!called) ok = rest.empty() || text(w, rest);
    else if (!rest.empty()) ok = w(sse(dump(chunk_json(meta_, rest, std::nullopt, nullptr))));
    if (ok && called) ok = w(sse(dump(tool_calls_chunk_json(meta_, calls))));
    if (ok) ok = w(sse(dump(chunk_json(meta_, "", r.finish, pending_.empty() ? json(nullptr) : take_logprobs(), called))));
    if (ok && include_usage_) ok = w(sse(dump(usage_chunk_json(meta_, {r.n_prompt, r.n_generated, r.n_cached}))));
    return ok && w("data: [DONE]\n\n");
  }
  std::string error_event(const ApiError& e) override { return sse(error_body(e)); }

 private:
  json take_logprobs() {
    if (!want_lp_) return nullptr;
    json j = logprobs_json(meta_.chat, pending_, tok_, &offset_);
    pending_.clear();
    return j;
  }

  const ResponseMeta meta_;
  const Tokenizer& tok_;
  const bool include_usage_, want_lp_;
  const std::string echo_;
  std::vector<TokenLogprobs> pending_;
  int64_t offset_ = 0;
};

}  // namespace

void Server::openai_completion(const http::Request& req, http::Response& res, bool chat) {
  const auto arrived = std::chrono::steady_clock::now();
  ++n_requests_;
  if (draining_ || stopping_) return send_error(res, shutting_down_error());
  auto parsed = parse_gated([&] { return parse_completion_request(req.body, chat, served_); });
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  const CompletionRequest& creq = std::get<CompletionRequest>(parsed);
  // Several prompts (completions, not streaming): a choice each, run in turn on one sequence.
  std::vector<std::shared_ptr<const PreparedRequest>> preps;
  for (size_t i = 0; i < std::max<size_t>(creq.prompts.size(), 1); ++i) {
    std::optional<CompletionRequest> other;
    if (i > 0) other = creq, other->prompt = creq.prompts[i].text, other->prompt_ids = creq.prompts[i].ids;
    auto p = prepare_request(other ? *other : creq, tok_, served_, std::random_device{}());
    if (auto* e = std::get_if<ApiError>(&p)) {
      if (i > 0) e->message = fmt::format("prompt[{}]: {}", i, e->message);
      return send_error(res, *e);
    }
    preps.push_back(std::make_shared<const PreparedRequest>(std::move(std::get<PreparedRequest>(p))));
  }
  const PreparedRequest& first = *preps.front();
  auto wire = std::make_shared<OpenAiWire>(
      ResponseMeta{(chat ? "chatcmpl-" : "cmpl-") + unguessable_id(), unix_now(), served_.id, chat}, tok_,
      creq.include_usage, first.gen.n_logprobs >= 0, first.echo);
  drive(req, res, std::move(wire), std::move(preps), creq.stream, arrived);
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
