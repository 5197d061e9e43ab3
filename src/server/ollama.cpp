#include "server/ollama.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>

#include <fmt/format.h>

#include "core/json.hpp"
#include "server/json_schema.hpp"
#include "server/request_fields.hpp"
#include "server/tool_calls.hpp"

namespace ember::server::ollama {

namespace {

constexpr const char* kVersion = "0.12.0";  // the Ollama API version these routes follow

// options.stop: a string or an array of strings.
std::optional<ApiError> read_stop(const json& opts, std::vector<std::string>& out) {
  const json* s = field(opts, "stop");
  if (!s) return std::nullopt;
  if (s->is_string()) {
    out.push_back(s->get<std::string>());
    return std::nullopt;
  }
  if (!s->is_array()) return bad("options.stop", "'options.stop' must be a string or an array of strings");
  for (const json& x : *s) {
    if (!x.is_string()) return bad("options.stop", "'options.stop' must hold strings");
    out.push_back(x.get<std::string>());
  }
  if (out.size() > kMaxStopStrings * 4) return bad("options.stop", "too many stop strings");
  for (const auto& x : out)
    if (x.size() > kMaxStopBytes) return bad("options.stop", fmt::format("each stop string must be at most {} bytes", kMaxStopBytes));
  return std::nullopt;
}

// A message's content: a string (Ollama's messages carry no parts). An assistant's tool_calls
// ({"function": {"name", "arguments": {...}}}, no ids) get ids; a tool message (its function in
// "tool_name", or "name") answers the earliest call of that function not yet answered (any
// function when it names none), as OpenAI's messages say by tool_call_id.
std::optional<ApiError> read_messages(const json& j, std::vector<ChatMessage>& out) {
  const json* msgs = field(j, "messages");
  if (!msgs) return bad("messages", "'messages' is required: an array of {\"role\", \"content\"} objects");
  if (!msgs->is_array()) return bad("messages", fmt::format("'messages' must be an array, got {}", type_name(*msgs)));
  std::vector<ToolCall> open;  // calls not answered yet
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) return bad(at, at + " must be an object");
    const json* role = field(m, "role");
    if (!role || !role->is_string()) return bad(at + ".role", at + ".role must be a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      return bad(at + ".role", fmt::format("{}.role '{}' is not supported (system, user, assistant or tool)", at, r));
    if (const json* im = field(m, "images"); im && !(im->is_array() && im->empty()))
      return bad(at + ".images", "images are not supported: this model reads text");
    const json* content = field(m, "content");
    if (content && !content->is_string()) return bad(at + ".content", at + ".content must be a string");
    ChatMessage cm{r, content ? content->get<std::string>() : std::string()};
    json msg = m;  // in OpenAI's shapes, which parse_message_tools reads
    if (const json* calls = field(m, "tool_calls"); calls && calls->is_array())
      for (size_t k = 0; k < calls->size(); ++k)
        if ((*calls)[k].is_object() && !(*calls)[k].contains("id")) msg["tool_calls"][k]["id"] = fmt::format("call_{}_{}", i, k);
    if (r == "tool" && !field(m, "tool_call_id")) {
      const json* fn = field(m, "tool_name") ? field(m, "tool_name") : field(m, "name");
      if (fn && !fn->is_string()) return bad(at + ".tool_name", at + ".tool_name must be a string");
      const std::string name = fn ? fn->get<std::string>() : std::string();
      const auto call = std::find_if(open.begin(), open.end(), [&](const ToolCall& c) { return name.empty() || c.name == name; });
      if (call == open.end())
        return bad(at, fmt::format("{} (a tool message{}) answers no call: no earlier assistant message calls {} "
                                   "without an answer", at, name.empty() ? "" : " of '" + name.substr(0, 64) + "'",
                                   name.empty() ? "a tool" : "it"));
      msg["tool_call_id"] = call->id;
      msg["name"] = call->name;
    }
    if (auto e = parse_message_tools(msg, at, cm)) return *e;
    for (const ToolCall& c : cm.tool_calls) open.push_back(c);
    const auto answered = std::find_if(open.begin(), open.end(), [&](const ToolCall& c) { return c.id == cm.tool_call_id; });
    if (r == "tool" && answered != open.end()) open.erase(answered);
    out.push_back(std::move(cm));
  }
  if (auto e = check_tool_results(out)) return *e;
  if (out.empty()) return bad("messages", "'messages' must contain at least one message");
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> check_model(const json& j, const ServedModel& model, const char* key) {
  const json* m = field(j, key);
  if (!m) return bad(key, fmt::format("'{}' is required", key));
  if (!m->is_string()) return bad(key, fmt::format("'{}' must be a string, got {}", key, type_name(*m)));
  const std::string name = m->get<std::string>();
  if (name == model.id || name == model.id + ":latest") return std::nullopt;
  return ApiError{404, fmt::format("model '{}' not found; this server serves '{}'", name, model.id), "not_found_error",
                  key, "model_not_found"};
}

std::variant<Request, ApiError> parse_request(std::string_view body, bool chat, const ServedModel& model) {
  auto parsed = parse_body(body, chat ? R"({"model": ..., "messages": ...})" : R"({"model": ..., "prompt": ...})");
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  if (auto e = check_model(j, model)) return *e;
  Request r;
  r.chat = chat;
  CompletionRequest& c = r.completion;
  c.sampling = model.sampling;
  c.stream = true;  // Ollama streams unless told not to
  if (auto e = get_bool(j, "stream", c.stream)) return *e;
  for (const char* unsupported : {"suffix", "images", "template", "context", "tools", "tool_choice"}) {
    if (chat && std::string_view(unsupported) == "tools") continue;
    const json* f = field(j, unsupported);  // (clients send empty ones)
    if (f && !(f->is_array() && f->empty()) && !(f->is_string() && f->get<std::string>().empty()))
      return bad(unsupported, fmt::format("'{}' is not supported by this server{}", unsupported,
                                          std::string_view(unsupported) == "tools" ? " on /api/generate (use /api/chat)" : ""));
  }
  if (chat) {
    c.chat = true;
    if (auto e = read_messages(j, c.messages)) return *e;
    if (field(j, "tools")) {  // OpenAI's shapes; the model chooses whether to call (no tool_choice)
      if (auto e = parse_tools(parse_json<nlohmann::ordered_json>(body), c.tools)) return *e;
      c.tools.parallel = true;  // Ollama returns every call the model writes
    }
  } else {
    const json* p = field(j, "prompt");
    if (p && !p->is_string()) return bad("prompt", fmt::format("'prompt' must be a string, got {}", type_name(*p)));
    const std::string prompt = p ? p->get<std::string>() : "";
    bool raw = false;
    if (auto e = get_bool(j, "raw", raw)) return *e;
    const json* sys = field(j, "system");
    if (sys && !sys->is_string()) return bad("system", "'system' must be a string");
    if (raw) {  // the prompt as it is, no template
      c.chat = false;
      c.prompt = prompt;
    } else {  // as Ollama does: the model's template over the system message and the prompt
      c.chat = true;
      if (sys) c.messages.push_back({"system", sys->get<std::string>()});
      c.messages.push_back({"user", prompt});
    }
    if (prompt.empty()) return bad("prompt", "'prompt' is empty (Ollama loads the model for an empty prompt; this "
                                             "server has it loaded already)");
  }
  if (const json* opts = field(j, "options")) {
    if (!opts->is_object()) return bad("options", fmt::format("'options' must be an object, got {}", type_name(*opts)));
    auto named = [](ApiError e) {
      if (!e.param.empty()) e.param = "options." + e.param;
      return e;
    };
    SamplerParams& s = c.sampling;
    if (auto e = get_number(*opts, "temperature", 0.0, 100.0, s.temperature)) return named(*e);
    if (auto e = get_number(*opts, "top_p", 0.0, 1.0, s.top_p)) return named(*e);
    if (auto e = get_number(*opts, "min_p", 0.0, 1.0, s.min_p)) return named(*e);
    if (auto e = get_number(*opts, "repeat_penalty", 0.01, 100.0, s.repeat_penalty)) return named(*e);
    if (auto e = get_penalties(*opts, model, s)) return named(*e);
    std::optional<int64_t> v;
    if (auto e = get_int(*opts, "top_k", 0, 1 << 24, v)) return named(*e);
    if (v) s.top_k = static_cast<int>(*v);
    v.reset();
    if (auto e = get_int(*opts, "repeat_last_n", -1, 1 << 20, v)) return named(*e);
    if (v) s.repeat_last_n = static_cast<int>(*v < 0 ? model.n_ctx : *v);
    v.reset();
    if (auto e = get_int(*opts, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), v))
      return named(*e);
    if (v) c.seed = static_cast<uint64_t>(*v);
    v.reset();
    if (auto e = get_int(*opts, "num_predict", -2, std::numeric_limits<int32_t>::max(), v)) return named(*e);
    if (v && *v >= 0) c.max_tokens = std::max<int64_t>(*v, 0);
    if (v && *v == -2) r.fill_context = true;
    v.reset();
    if (auto e = get_int(*opts, "num_ctx", 1, std::numeric_limits<int32_t>::max(), v)) return named(*e);
    if (v && *v < model.n_ctx) r.num_ctx = *v;  // larger: the server's own context
    if (auto e = read_stop(*opts, c.stop)) return *e;
  }
  if (c.max_tokens && *c.max_tokens == 0) c.max_tokens = 1;  // num_predict 0: Ollama answers nothing; one token here
  if (const json* f = field(j, "format")) {
    if (f->is_string() && f->get<std::string>() == "json") {
      c.grammar = json_object_grammar();
    } else if (f->is_object()) {
      try {  // parsed again keeping the properties' order: the model writes them in the schema's order
        c.grammar = json_schema_grammar(parse_json<nlohmann::ordered_json>(body).at("format"));
      } catch (const SchemaError& e) {
        return bad("format", fmt::format("unsupported JSON schema: {}", e.what()));
      }
    } else if (!(f->is_string() && f->get<std::string>().empty())) {
      return bad("format", "'format' must be \"json\" or a JSON schema object");
    }
  }
  return r;
}

std::optional<ApiError> apply_limits(const Request& r, PreparedRequest& p) {
  const int64_t n_prompt = static_cast<int64_t>(p.prompt.size());
  if (r.num_ctx > 0) {
    if (n_prompt >= r.num_ctx)
      return bad("options.num_ctx", fmt::format("the prompt has {} tokens, num_ctx is {}: no room to answer", n_prompt,
                                                r.num_ctx), "context_length_exceeded");
    p.gen.max_tokens = std::min(p.gen.max_tokens, r.num_ctx - n_prompt);
  }
  return std::nullopt;
}

std::string error_body(const ApiError& e) { return dump(json{{"error", e.message}}); }

std::string timestamp(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec);
}

std::string timestamp_now() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
  std::string t = timestamp(ns / 1000000000);
  t.pop_back();  // the Z, after the fraction
  return fmt::format("{}.{:09}Z", t, ns % 1000000000);
}

json chunk(const ServedModel& m, bool chat, const std::string& text) {
  json j = {{"model", m.id}, {"created_at", timestamp_now()}, {"done", false}};
  if (chat) j["message"] = {{"role", "assistant"}, {"content", text}};
  else j["response"] = text;
  return j;
}

json tool_calls(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    json args = json::object();
    try {
      args = parse_json<json>(calls[k].arguments);
    } catch (const std::exception&) {  // (parse_tool_output writes them as JSON)
    }
    out.push_back({{"function", {{"index", k}, {"name", calls[k].name}, {"arguments", std::move(args)}}}});
  }
  return out;
}

json tool_calls_chunk(const ServedModel& m, const std::vector<ToolCall>& calls) {
  json j = chunk(m, true, "");
  j["message"]["tool_calls"] = tool_calls(calls);
  return j;
}

json final_chunk(const ServedModel& m, bool chat, const std::string& text, FinishReason finish, const Timings& t,
                 const std::vector<ToolCall>* calls) {
  json j = chunk(m, chat, text);
  if (chat && calls && !calls->empty()) j["message"]["tool_calls"] = tool_calls(*calls);
  j["done"] = true;
  j["done_reason"] = finish == FinishReason::length || finish == FinishReason::context ? "length" : "stop";
  j["total_duration"] = t.total_ns;
  j["load_duration"] = 0;
  j["prompt_eval_count"] = t.prompt_tokens;
  j["prompt_eval_duration"] = t.prompt_ns;
  j["eval_count"] = t.tokens;
  j["eval_duration"] = t.eval_ns;
  return j;
}

json version() { return {{"version", kVersion}}; }

namespace {
std::string parameter_size(uint64_t n) {
  if (n >= 1000000000ull) return fmt::format("{:.1f}B", static_cast<double>(n) / 1e9);
  if (n >= 1000000ull) return fmt::format("{:.0f}M", static_cast<double>(n) / 1e6);
  return fmt::format("{}", n);
}
json details(const ServedModel& m) {
  return {{"parent_model", ""},
          {"format", "gguf"},
          {"family", m.file.architecture},
          {"families", json::array({m.file.architecture})},
          {"parameter_size", parameter_size(m.file.parameters)},
          {"quantization_level", m.file.quantization}};
}
json entry(const ServedModel& m) {
  const std::string name = m.id + ":latest";
  return {{"name", name},
          {"model", name},
          {"modified_at", timestamp(m.file.modified)},
          {"size", m.file.bytes},
          {"digest", m.file.digest},
          {"details", details(m)}};
}
}  // namespace

json tags(const ServedModel& m) { return {{"models", json::array({entry(m)})}}; }

json show(const ServedModel& m) {
  const SamplerParams& s = m.sampling;
  const std::string parameters =
      fmt::format("temperature {}\ntop_k {}\ntop_p {}\nmin_p {}\nnum_ctx {}", s.temperature, s.top_k, s.top_p,
                  s.min_p, m.n_ctx);
  json info = m.file.metadata;
  info["general.parameter_count"] = m.file.parameters;
  return {{"modelfile", fmt::format("# served by ember\nFROM {}\n", m.file.path)},
          {"parameters", parameters},
          {"template", m.chat_template},
          {"details", details(m)},
          {"model_info", info},
          {"capabilities", json::array({"completion", "tools", "embedding"})},
          {"modified_at", timestamp(m.file.modified)}};
}

json ps(const ServedModel& m, uint64_t device_bytes) {
  json e = entry(m);
  e["expires_at"] = timestamp(4102444800);  // 2100: loaded for as long as the server runs
  e["size_vram"] = device_bytes;
  e["context_length"] = m.n_ctx;
  return {{"models", json::array({e})}};
}

std::optional<ApiError> check_show(std::string_view body, const ServedModel& m) {
  auto parsed = parse_body(body, R"({"model": ...})");
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  return check_model(j, m, field(j, "model") ? "model" : "name");
}

}  // namespace ember::server::ollama
