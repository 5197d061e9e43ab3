#include "server/api.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <random>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/json.hpp"
#include "server/json_schema.hpp"
#include "server/request_fields.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer/unicode.hpp"

namespace ember::server {

json error_json(const ApiError& e) {
  // A message quotes what the client sent at most this much of (a name, a value, a path).
  constexpr size_t kMaxMessage = 1000;
  const std::string message = e.message.size() > kMaxMessage ? e.message.substr(0, kMaxMessage) + "..." : e.message;
  json err = {{"message", message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", err}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const ApiError& e) { return dump(error_json(e)); }

namespace {

// Message content: a string, or an array of {"type": "text", "text": ...} parts.
std::optional<ApiError> get_content(const json& msg, size_t i, std::string& out) {
  const std::string param = fmt::format("messages[{}].content", i);
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) {
    // An assistant message that calls tools may have no text.
    if (auto c = msg.find("tool_calls"); c != msg.end() && c->is_array() && !c->empty()) return std::nullopt;
    return bad(param, fmt::format("'{}' is required", param));
  }
  if (it->is_string()) {
    out = it->get<std::string>();
    return std::nullopt;
  }
  if (!it->is_array()) return bad(param, fmt::format("'{}' must be a string or an array of text parts, got {}", param, type_name(*it)));
  for (const json& part : *it) {
    if (!part.is_object()) return bad(param, fmt::format("each part of '{}' must be an object", param));
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || *type != "text")
      return bad(param, fmt::format("'{}': only parts of type \"text\" are supported", param));
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) return bad(param, fmt::format("'{}': a text part needs a string 'text'", param));
    out += text->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

bool origin_allowed(const std::vector<std::string>& listed, std::string_view origin, std::string_view host) {
  const auto same = [](std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
  };
  for (const std::string& o : listed)
    if (o == "*" || same(o, origin)) return true;
  const size_t scheme = origin.find("://");
  if (scheme == std::string_view::npos) return false;
  const std::string_view authority = origin.substr(scheme + 3);
  if (!host.empty() && same(authority, host)) return true;
  std::string_view name = authority;
  if (name.starts_with("[")) name = name.substr(0, name.find(']') + 1);
  else name = name.substr(0, name.find(':'));
  if (same(name, "localhost") || name == "[::1]") return true;
  if (!name.starts_with("127.")) return false;  // 127.0.0.0/8, written as four numbers
  int dots = 0;
  for (char c : name) {
    if (c == '.') ++dots;
    else if (c < '0' || c > '9') return false;
  }
  return dots == 3;
}

std::string unguessable_id() {
  std::random_device rd;  // getrandom(2) on Linux
  return fmt::format("{:08x}{:08x}{:08x}", rd(), rd(), rd());
}

std::optional<ApiError> check_model_field(const json& j, const ServedModel& model) {
  const json* m = field(j, "model");
  if (!m) return std::nullopt;
  if (!m->is_string()) return bad("model", fmt::format("'model' must be a string, got {}", type_name(*m)));
  const std::string name = m->get<std::string>();
  if (name == model.id) return std::nullopt;
  return ApiError{404, fmt::format("The model '{}' does not exist; this server serves '{}'", name, model.id),
                  "invalid_request_error", "model", "model_not_found"};
}

namespace {

// /v1/completions' prompt: a string, token ids, or an array of several of either (a choice each).
std::optional<ApiError> read_prompts(const json& p, int64_t n_vocab, std::vector<CompletionPrompt>& out) {
  const auto ids = [&](const json& a, const std::string& at, CompletionPrompt& c) -> std::optional<ApiError> {
    if (auto e = read_token_ids(a, "prompt", at, n_vocab, c.ids)) return e;
    if (c.ids.empty()) return bad("prompt", at + " is empty");
    return std::nullopt;
  };
  if (p.is_string()) {
    out.push_back({p.get<std::string>(), {}});
    return std::nullopt;
  }
  if (!p.is_array() || p.empty())
    return bad("prompt", fmt::format("'prompt' must be a string, token ids, or an array of them, got {}",
                                     p.is_array() ? "an empty array" : type_name(p)));
  if (p[0].is_number()) {
    out.emplace_back();
    return ids(p, "prompt", out.back());
  }
  if (p.size() > kMaxPrompts) return bad("prompt", fmt::format("'prompt' holds {} prompts; at most {}", p.size(), kMaxPrompts));
  for (size_t i = 0; i < p.size(); ++i) {
    const std::string at = fmt::format("prompt[{}]", i);
    out.emplace_back();
    if (p[i].is_string()) out.back().text = p[i].get<std::string>();
    else if (!p[i].is_array()) return bad("prompt", fmt::format("{} must be a string or token ids, got {}", at, type_name(p[i])));
    else if (auto e = ids(p[i], at, out.back())) return *e;
  }
  return std::nullopt;
}

}  // namespace

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body, bool chat,
                                                                   const ServedModel& model) {
  auto parsed = parse_body(body, chat ? R"({"model": ..., "messages": ...})" : R"({"model": ..., "prompt": ...})");
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);

  CompletionRequest r;
  r.chat = chat;
  r.sampling = model.sampling;

  if (auto e = check_model_field(j, model)) return *e;

  if (chat) {
    const json* msgs = field(j, "messages");
    if (!msgs) return bad("messages", "'messages' is required: an array of {\"role\", \"content\"} objects");
    if (!msgs->is_array()) return bad("messages", fmt::format("'messages' must be an array, got {}", type_name(*msgs)));
    if (msgs->empty()) return bad("messages", "'messages' must contain at least one message");
    for (size_t i = 0; i < msgs->size(); ++i) {
      const json& msg = (*msgs)[i];
      if (!msg.is_object()) return bad(fmt::format("messages[{}]", i), fmt::format("messages[{}] must be an object", i));
      auto role = msg.find("role");
      if (role == msg.end() || !role->is_string())
        return bad(fmt::format("messages[{}].role", i), fmt::format("messages[{}].role must be a string", i));
      std::string r_name = role->get<std::string>();
      if (r_name == "developer") r_name = "system";
      if (r_name != "system" && r_name != "user" && r_name != "assistant" && r_name != "tool")
        return bad(fmt::format("messages[{}].role", i),
                   fmt::format("messages[{}].role '{}' is not supported (use system, user, assistant or tool)", i, r_name));
      ChatMessage cm{r_name, {}};
      if (auto e = get_content(msg, i, cm.content)) return *e;
      if (auto e = parse_message_tools(msg, fmt::format("messages[{}]", i), cm)) return *e;
      r.messages.push_back(std::move(cm));
    }
    if (auto e = check_tool_results(r.messages)) return *e;
  } else {
    const json* p = field(j, "prompt");
    if (!p) return bad("prompt", "'prompt' is required");
    if (auto e = read_prompts(*p, model.n_vocab, r.prompts)) return *e;
    r.prompt = r.prompts[0].text;
    r.prompt_ids = r.prompts[0].ids;
    if (auto e = get_bool(j, "echo", r.echo)) return *e;
    bool stream = false;
    if (auto e = get_bool(j, "stream", stream)) return *e;
    if (stream && r.prompts.size() > 1)
      return bad("prompt", "several prompts are answered together only without streaming ('stream': false)");
  }
  if (chat && field(j, "echo")) return bad("echo", "'echo' belongs to /v1/completions");

  // Token limit: max_completion_tokens (newer chat API) or max_tokens. At most the context.
  std::optional<int64_t> max_tokens;
  const std::string ctx = fmt::format(" (the context holds {} tokens)", model.n_ctx);
  if (auto e = get_int(j, "max_tokens", chat ? 1 : 0, model.n_ctx, max_tokens, ctx)) return *e;
  if (max_tokens == 0 && !r.echo)
    return bad("max_tokens", "'max_tokens' 0 asks for no answer: only with 'echo' (the prompt's logprobs), else at least 1");
  if (chat) {
    std::optional<int64_t> mct;
    if (auto e = get_int(j, "max_completion_tokens", 1, model.n_ctx, mct, ctx)) return *e;
    if (mct) max_tokens = mct;
  }
  r.max_tokens = max_tokens;

  if (auto e = get_number(j, "temperature", 0.0, 2.0, r.sampling.temperature)) return *e;
  if (auto e = get_number(j, "top_p", 0.0, 1.0, r.sampling.top_p)) return *e;
  if (auto e = get_number(j, "min_p", 0.0, 1.0, r.sampling.min_p)) return *e;  // llama.cpp extension
  if (auto e = get_penalties(j, model, r.sampling)) return *e;
  std::optional<int64_t> top_k;
  if (auto e = get_int(j, "top_k", 0, 1 << 24, top_k)) return *e;  // llama.cpp extension
  if (top_k) r.sampling.top_k = static_cast<int>(*top_k);
  std::optional<int64_t> seed;
  if (auto e = get_int(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), seed))
    return *e;
  if (seed) r.seed = static_cast<uint64_t>(*seed);
  std::optional<int64_t> n;
  if (auto e = get_int(j, "n", 1, 1, n)) {
    e->message = "only n = 1 is supported";
    return *e;
  }
  if (auto e = get_bool(j, "stream", r.stream)) return *e;
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (!r.stream) return bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (auto e = get_bool(*so, "include_usage", r.include_usage)) {
      e->param = "stream_options.include_usage";
      return *e;
    }
  }
  if (const json* s = field(j, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > kMaxStopStrings) return bad("stop", fmt::format("'stop' may hold at most {} strings", kMaxStopStrings));
      for (const json& x : *s) {
        if (!x.is_string()) return bad("stop", fmt::format("'stop' must hold strings, got {}", type_name(x)));
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      return bad("stop", fmt::format("'stop' must be a string or an array of strings, got {}", type_name(*s)));
    }
    for (const auto& x : r.stop)
      if (x.size() > kMaxStopBytes) return bad("stop", fmt::format("each stop string must be at most {} bytes", kMaxStopBytes));
  }
  if (chat) {
    bool want = false;
    if (auto e = get_bool(j, "logprobs", want)) return *e;
    std::optional<int64_t> top;
    if (auto e = get_int(j, "top_logprobs", 0, kMaxTopLogprobs, top)) return *e;
    if (top && !want) return bad("top_logprobs", "'top_logprobs' requires 'logprobs': true");
    if (want) r.logprobs = static_cast<int>(top.value_or(0));
  } else {
    std::optional<int64_t> n_lp;
    if (auto e = get_int(j, "logprobs", 0, kMaxCompletionsLogprobs, n_lp)) return *e;
    if (n_lp) r.logprobs = static_cast<int>(*n_lp);
  }
  if (const json* rf = field(j, "response_format")) {
    if (!rf->is_object()) return bad("response_format", fmt::format("'response_format' must be an object, got {}", type_name(*rf)));
    const json* type = field(*rf, "type");
    if (!type || !type->is_string())
      return bad("response_format.type", "'response_format.type' must be one of 'text', 'json_object', 'json_schema'");
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      r.grammar = json_object_grammar();
    } else if (t == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object() || !field(*js, "schema") || !field(*js, "schema")->is_object())
        return bad("response_format.json_schema",
                   "'response_format.json_schema' must be an object with a 'schema' object");
      try {
        // Again, keeping the order of the properties: the model writes them in the schema's order.
        const auto ordered = parse_json<nlohmann::ordered_json>(body);
        r.grammar = json_schema_grammar(ordered.at("response_format").at("json_schema").at("schema"));
      } catch (const SchemaError& e) {
        return bad("response_format.json_schema.schema", fmt::format("unsupported JSON schema: {}", e.what()));
      }
    } else if (t != "text") {
      return bad("response_format.type",
                 fmt::format("'response_format.type' '{}' is not supported (text, json_object or json_schema)", t));
    }
  }
  if (field(j, "tools") || field(j, "tool_choice") || field(j, "parallel_tool_calls")) {
    if (!chat) return bad("tools", "'tools' belong to /v1/chat/completions");
    if (auto e = parse_tools(parse_json<nlohmann::ordered_json>(body), r.tools)) return *e;  // (the schemas' key order)
    if (r.tools.forced() && r.grammar)
      return bad("tool_choice", "a forced 'tool_choice' and 'response_format' cannot both constrain the answer");
    if (r.tools.forced()) {
      try {
        r.grammar = tool_call_grammar(served_tool_format(model), r.tools);
      } catch (const SchemaError& e) {
        const std::string what = e.what();
        return bad(what.substr(0, what.find(':')), fmt::format("this tool's schema cannot be enforced: {}", what));
      }
    }
  }
  return r;
}

ToolFormat served_tool_format(const ServedModel& model) {
  return tool_format(model.chat ? model.chat->source() : model.chat_template);
}

std::variant<PreparedRequest, ApiError> prepare_request(const CompletionRequest& req, const Tokenizer& tok,
                                                        const ServedModel& model, uint64_t random_seed) {
  PreparedRequest p;
  std::string text;
  if (req.chat) {
    try {
      std::optional<ChatFormatter> own;
      if (!model.chat) own.emplace(model.chat_template, "", "");
      p.tool_format = served_tool_format(model);
      ToolPrompt tp = tool_prompt(p.tool_format, req.tools, req.messages);
      jinja::Limits limits;
      limits.cancel = model.stopping;
      text = (model.chat ? *model.chat : *own).render(tp.messages, /*add_generation_prompt=*/true, tp.tools, limits);
      if (req.tools.active()) p.tools = std::make_shared<const ToolRequest>(req.tools);
    } catch (const jinja::Raised& e) {
      return ApiError{400, fmt::format("the model's chat template refuses this conversation: {}", e.what()),
                      "invalid_request_error", "messages", ""};
    } catch (const Error& e) {
      return ApiError{500, fmt::format("cannot apply the model's chat template: {}", e.what()), "server_error", "", ""};
    }
  } else if (!req.prompt_ids.empty()) {
    for (int32_t id : req.prompt_ids)
      if (id < 0 || id >= tok.n_vocab()) return bad("prompt", fmt::format("token id {} is not in the vocabulary", id));
    p.prompt = req.prompt_ids;  // as they are: no start token added
    if (req.echo) text = tok.decode(p.prompt);
  } else {
    text = req.prompt;
  }
  if (req.chat || req.prompt_ids.empty()) p.prompt = tok.encode(text, /*add_special=*/true, /*parse_special=*/true);
  if (req.echo) p.echo = text;
  const std::string param = req.chat ? "messages" : "prompt";
  if (p.prompt.empty()) return bad(param, "the prompt is empty");
  const int64_t n_prompt = static_cast<int64_t>(p.prompt.size());
  if (n_prompt >= model.n_ctx)
    return bad(param,
               fmt::format("This model's maximum context length is {} tokens, but the prompt has {} tokens; "
                           "shorten it (no room is left to generate)",
                           model.n_ctx, n_prompt),
               "context_length_exceeded");
  const int64_t room = model.n_ctx - n_prompt;
  int64_t max_tokens = req.max_tokens.value_or(req.chat ? room : kCompletionsDefaultMaxTokens);
  p.gen.max_tokens = std::min(max_tokens, room);
  p.gen.sampling = req.sampling;
  p.gen.sampling.seed = req.seed.value_or(random_seed);
  p.gen.stop = req.stop;
  p.gen.n_logprobs = req.logprobs;
  p.gen.prompt_logprobs = req.echo;
  if (req.grammar) {
    p.gen.grammar = req.grammar;
    p.gen.grammar_vocab = model.grammar_vocab;
    if (!p.gen.grammar_vocab) return ApiError{500, "structured output is not set up on this server", "server_error", "", ""};
  }
  return p;
}

const char* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::length:
    case FinishReason::context: return "length";
    case FinishReason::eog:
    case FinishReason::stop:
    case FinishReason::cancelled: return "stop";
  }
  return "stop";
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {
json base(const ResponseMeta& m, bool chunk) {
  const char* object = m.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}, {"system_fingerprint", "ember"}};
}
}  // namespace

json logprobs_json(bool chat, const std::vector<TokenLogprobs>& tokens, const Tokenizer& tok, int64_t* text_offset) {
  int64_t offset = text_offset ? *text_offset : 0;
  const auto bytes = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  };
  if (chat) {
    json content = json::array();
    for (const TokenLogprobs& t : tokens) {
      const std::string piece = tok.token_to_piece(t.token);
      json top = json::array();
      for (const auto& [id, lp] : t.top) {
        const std::string p = tok.token_to_piece(id);
        top.push_back({{"token", p}, {"logprob", lp}, {"bytes", bytes(p)}});
      }
      content.push_back({{"token", piece}, {"logprob", t.logprob}, {"bytes", bytes(piece)}, {"top_logprobs", top}});
      offset += static_cast<int64_t>(piece.size());
    }
    if (text_offset) *text_offset = offset;
    return {{"content", content}, {"refusal", nullptr}};
  }
  json pieces = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprobs& t : tokens) {
    const std::string piece = tok.token_to_piece(t.token);
    pieces.push_back(piece);
    lps.push_back(t.known ? json(t.logprob) : json(nullptr));  // the first prompt token's (echo): none
    json top = json::object();
    for (const auto& [id, lp] : t.top) top[tok.token_to_piece(id)] = lp;
    tops.push_back(t.known ? top : json(nullptr));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(piece.size());
  }
  if (text_offset) *text_offset = offset;
  return {{"tokens", pieces}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id}, {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

json completion_json(const ResponseMeta& m, const std::string& text, FinishReason finish, const Usage& u,
                     const json& logprobs, const std::vector<ToolCall>* calls) {
  json j = base(m, false);
  const bool called = calls && !calls->empty();
  json choice = {{"index", 0}, {"logprobs", logprobs},
                 {"finish_reason", called ? "tool_calls" : openai_finish_reason(finish)}};
  if (m.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", called && text.empty() ? json(nullptr) : json(text)}};
    if (called) choice["message"]["tool_calls"] = tool_calls_json(*calls, false);
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(u);
  return j;
}

json chunk_json(const ResponseMeta& m, const std::string& text, const std::optional<FinishReason>& finish,
                const json& logprobs, bool tool_calls) {
  json j = base(m, true);
  json choice = {{"index", 0}, {"logprobs", logprobs}};
  choice["finish_reason"] = finish ? json(tool_calls ? "tool_calls" : openai_finish_reason(*finish)) : json(nullptr);
  if (m.chat) choice["delta"] = finish ? json::object() : json{{"content", text}};
  else choice["text"] = text;
  j["choices"] = json::array({choice});
  return j;
}

json tool_calls_chunk_json(const ResponseMeta& m, const std::vector<ToolCall>& calls) {
  json j = base(m, true);
  j["choices"] = json::array({{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr},
                               {"delta", {{"tool_calls", tool_calls_json(calls, true)}}}}});
  return j;
}

json role_chunk_json(const ResponseMeta& m) {
  json j = base(m, true);
  j["choices"] = json::array(
      {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  return j;
}

json usage_chunk_json(const ResponseMeta& m, const Usage& u) {
  json j = base(m, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(u);
  return j;
}

json models_json(const ServedModel& model) {
  return {{"object", "list"},
          {"data", json::array({{{"id", model.id}, {"object", "model"}, {"created", model.created}, {"owned_by", "ember"},
                                 {"meta", {{"n_ctx", model.n_ctx}}}}})}};
}

std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body) {
  auto parsed = parse_body(body, R"({"content": ...})");
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  TokenizeRequest r;
  r.vllm = !field(j, "content") && field(j, "prompt");
  const char* key = r.vllm ? "prompt" : "content";
  const json* c = field(j, key);
  if (!c || !c->is_string()) return bad(key, fmt::format("'{}' must be a string", key));
  r.content = c->get<std::string>();
  if (r.vllm) r.add_special = true;  // vLLM's default
  if (auto e = get_bool(j, r.vllm ? "add_special_tokens" : "add_special", r.add_special)) return *e;
  if (auto e = get_bool(j, "parse_special", r.parse_special)) return *e;
  if (auto e = get_bool(j, "with_pieces", r.with_pieces)) return *e;
  return r;
}

json tokenize_json(const TokenizeRequest& r, const Tokenizer& tok, int64_t n_ctx) {
  const std::vector<int32_t> ids = tok.encode(r.content, r.add_special, r.parse_special);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (!r.with_pieces) {
      tokens.push_back(id);
      continue;
    }
    const std::string piece = tok.token_to_piece(id);
    json p = piece;
    if (!unicode::valid_utf8(piece)) {  // a part of a character: its bytes
      p = json::array();
      for (unsigned char b : piece) p.push_back(b);
    }
    tokens.push_back({{"id", id}, {"piece", p}});
  }
  if (r.vllm) return {{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", n_ctx}};
  return {{"tokens", tokens}};
}

json tokenizer_info_json(const ServedModel& model, const Tokenizer& tok) {
  const auto text = [&](int32_t id) { return id >= 0 && id < tok.n_vocab() ? json(tok.token_to_piece(id)) : json(nullptr); };
  return {{"tokenizer_class", "ember"},
          {"eos_token", text(tok.eos())},
          {"bos_token", text(tok.bos())},
          {"pad_token", nullptr},
          {"chat_template", model.chat_template},
          {"model_max_length", model.n_ctx}};
}

std::variant<std::string, ApiError> parse_detokenize_request(std::string_view body, const Tokenizer& tok) {
  auto parsed = parse_body(body, R"({"tokens": [...]})");
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  const json* t = field(j, "tokens");
  if (!t || !t->is_array()) return bad("tokens", "'tokens' must be an array of token ids");
  std::vector<int32_t> ids;
  if (auto e = read_token_ids(*t, "tokens", "tokens", tok.n_vocab(), ids)) return *e;
  return tok.decode(ids);
}

json props_json(const ServedModel& model, int64_t parallel) {
  const SamplerParams& s = model.sampling;
  return {{"model", model.id},
          {"default_generation_settings",
           {{"temperature", s.temperature}, {"top_k", s.top_k}, {"top_p", s.top_p}, {"min_p", s.min_p},
            {"repeat_penalty", s.repeat_penalty}, {"n_ctx", model.n_ctx}}},
          {"total_slots", parallel},
          {"chat_template", model.chat_template}};
}

}  // namespace ember::server
