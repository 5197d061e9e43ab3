#include "server/responses.hpp"

#include <fmt/format.h>

#include "core/json.hpp"
#include "server/request_fields.hpp"

namespace ember::server::responses {

namespace {

// A content given as a string or as text parts (input_text, output_text): its text.
std::optional<ApiError> part_text(const json& c, const std::string& at, std::string& out) {
  if (c.is_string()) {
    out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return bad(at, at + " must be a string or an array of text parts");
  for (size_t k = 0; k < c.size(); ++k) {
    const std::string pa = fmt::format("{}[{}]", at, k);
    const json* type = c[k].is_object() ? field(c[k], "type") : nullptr;
    const std::string t = type && type->is_string() ? type->get<std::string>() : "";
    if (t != "input_text" && t != "output_text" && t != "text")
      return bad(pa + ".type", fmt::format("{}.type '{}' is not supported: this model reads text (input_text)", pa, t));
    const json* text = field(c[k], "text");
    if (!text || !text->is_string()) return bad(pa + ".text", pa + ".text must be a string");
    out += text->get<std::string>();
  }
  return std::nullopt;
}

// The input items as chat messages: messages, an assistant's function calls (consecutive ones in
// one message), their outputs as tool messages.
std::optional<ApiError> input_messages(const json& input, json& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return bad("input", "'input' must be a string or an array of items");
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string at = fmt::format("input[{}]", i);
    if (!item.is_object()) return bad(at, at + " must be an object");
    const json* type = field(item, "type");
    const std::string t = type && type->is_string() ? type->get<std::string>() : field(item, "role") ? "message" : "";
    if (t == "message") {
      const json* role = field(item, "role");
      const std::string r = role && role->is_string() ? role->get<std::string>() : "";
      if (r != "system" && r != "developer" && r != "user" && r != "assistant")
        return bad(at + ".role", fmt::format("{}.role '{}' is not supported (system, developer, user or assistant)", at, r));
      std::string text;
      const json* content = field(item, "content");
      if (content)
        if (auto e = part_text(*content, at + ".content", text)) return e;
      messages.push_back({{"role", r}, {"content", text}});
    } else if (t == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"})
        if (!field(item, k) || !(*field(item, k)).is_string())
          return bad(fmt::format("{}.{}", at, k), fmt::format("{}.{} must be a string", at, k));
      json call = {{"id", item["call_id"]}, {"type", "function"},
                   {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      if (!messages.empty() && messages.back()["role"] == "assistant" && messages.back().contains("tool_calls"))
        messages.back()["tool_calls"].push_back(std::move(call));
      else
        messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({std::move(call)})}});
    } else if (t == "function_call_output") {
      const json* id = field(item, "call_id");
      if (!id || !id->is_string()) return bad(at + ".call_id", at + ".call_id must be a string");
      std::string output;
      const json* out = field(item, "output");
      if (!out) return bad(at + ".output", at + ".output is required");
      if (auto e = part_text(*out, at + ".output", output)) return e;
      messages.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", output}});
    } else {
      return bad(at + ".type", fmt::format("{}.type '{}' is not supported (message, function_call, function_call_output)",
                                           at, t));
    }
  }
  if (messages.empty()) return bad("input", "'input' holds no item");
  return std::nullopt;
}

// A chat request's error, named by the Responses field it came from.
ApiError renamed(ApiError e) {
  if (e.param == "max_tokens") e.param = "max_output_tokens";
  else if (e.param.starts_with("response_format")) e.param = "text.format";
  else if (e.param.starts_with("messages")) e.param = "input";
  return e;
}

}  // namespace

std::variant<Request, ApiError> parse_request(std::string_view body, const ServedModel& model) {
  auto parsed = parse_body(body, R"({"model": ..., "input": ...})");
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  static constexpr const char* kKnown[] = {"model",  "input",       "instructions", "max_output_tokens", "temperature",
                                           "top_p",  "tools",       "tool_choice",  "parallel_tool_calls", "text",
                                           "stream", "store",       "metadata",     "user", "previous_response_id",
                                           "include", "truncation"};
  for (const auto& [k, v] : j.items()) {
    bool known = false;
    for (const char* n : kKnown) known |= k == n;
    if (!known && !v.is_null()) return bad(k, fmt::format("'{}' is not supported by this server's Responses API", k));
  }
  if (const json* inc = field(j, "include"); inc && !(inc->is_array() && inc->empty()))
    return bad("include", "'include' asks for output this server does not make (reasoning, logprobs, search results): "
                          "send an empty list");
  if (const json* t = field(j, "truncation"); t && *t != "disabled")
    return bad("truncation", "'truncation' must be \"disabled\": an input longer than the context is an error here");
  if (field(j, "previous_response_id"))
    return bad("previous_response_id", "responses are not stored on this server: send the whole conversation in 'input'");
  Request r;
  json chat = json::object();
  if (const json* m = field(j, "model")) chat["model"] = *m;
  json messages = json::array();
  if (const json* ins = field(j, "instructions")) {
    if (!ins->is_string()) return bad("instructions", "'instructions' must be a string");
    r.instructions = ins->get<std::string>();
    messages.push_back({{"role", "system"}, {"content", r.instructions}});
  }
  const json* input = field(j, "input");
  if (!input) return bad("input", "'input' is required: a string or an array of items");
  if (auto e = input_messages(*input, messages)) return *e;
  chat["messages"] = std::move(messages);
  if (const json* v = field(j, "max_output_tokens")) chat["max_tokens"] = *v;
  for (const char* k : {"temperature", "top_p", "parallel_tool_calls", "stream"})
    if (const json* v = field(j, k)) chat[k] = *v;
  if (const json* s = field(j, "store"); s && !s->is_boolean()) return bad("store", "'store' must be a boolean");
  r.tools = json::array();
  if (const json* tools = field(j, "tools")) {
    if (!tools->is_array()) return bad("tools", "'tools' must be an array of function tools");
    json list = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!t.is_object() || !field(t, "type") || (*field(t, "type")) != "function")
        return bad(at + ".type", at + ".type must be \"function\" (the only kind of tool here)");
      json fn = json::object();
      for (const char* k : {"name", "description", "parameters"})
        if (const json* v = field(t, k)) fn[k] = *v;
      list.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    chat["tools"] = std::move(list);
    r.tools = *tools;
  }
  r.tool_choice = "auto";
  if (const json* tc = field(j, "tool_choice")) {
    r.tool_choice = *tc;
    if (tc->is_object() && field(*tc, "type") && (*field(*tc, "type")) == "function" && field(*tc, "name"))
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*tc)["name"]}}}};
    else if (tc->is_string())
      chat["tool_choice"] = *tc;
    else
      return bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\"}");
  }
  if (const json* text = field(j, "text")) {
    const json* format = text->is_object() ? field(*text, "format") : nullptr;
    if (!text->is_object()) return bad("text", "'text' must be an object");
    if (format) {
      r.text_format = *format;
      const json* type = format->is_object() ? field(*format, "type") : nullptr;
      const std::string t = type && type->is_string() ? type->get<std::string>() : "";
      if (t == "json_schema") {
        json js = json::object();
        for (const char* k : {"name", "schema", "strict"})
          if (const json* v = field(*format, k)) js[k] = *v;
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else if (t == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (t != "text") {
        return bad("text.format.type", "'text.format.type' must be text, json_object or json_schema");
      }
    }
  }
  auto c = parse_completion_request(dump(chat), /*chat=*/true, model);
  if (auto* e = std::get_if<ApiError>(&c)) return renamed(*e);
  r.chat = std::move(std::get<CompletionRequest>(c));
  return r;
}

json output_items(const Meta& m, const std::string& text, const std::vector<ToolCall>& calls) {
  json out = json::array();
  const std::string base = m.id.substr(m.id.find('_') + 1);
  if (!text.empty() || calls.empty())
    out.push_back({{"type", "message"},
                   {"id", "msg_" + base},
                   {"status", "completed"},
                   {"role", "assistant"},
                   {"content", json::array({{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}})}});
  for (size_t k = 0; k < calls.size(); ++k)
    out.push_back({{"type", "function_call"},
                   {"id", fmt::format("fc_{}_{}", base, k)},
                   {"call_id", calls[k].id},
                   {"name", calls[k].name},
                   {"arguments", calls[k].arguments},
                   {"status", "completed"}});
  return out;
}

json response_json(const Meta& m, const Request& r, const json& output, FinishReason finish, const Usage& u) {
  const bool cut = finish == FinishReason::length || finish == FinishReason::context;
  const SamplerParams& s = r.chat.sampling;
  return {{"id", m.id},
          {"object", "response"},
          {"created_at", m.created},
          {"status", cut ? "incomplete" : "completed"},
          {"incomplete_details", cut ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
          {"error", nullptr},
          {"model", m.model},
          {"instructions", r.instructions.empty() ? json(nullptr) : json(r.instructions)},
          {"output", output},
          {"parallel_tool_calls", r.chat.tools.parallel},
          {"tool_choice", r.tool_choice},
          {"tools", r.tools},
          {"temperature", s.temperature},
          {"top_p", s.top_p},
          {"max_output_tokens", r.chat.max_tokens ? json(*r.chat.max_tokens) : json(nullptr)},
          {"text", {{"format", r.text_format}}},
          {"store", false},
          {"metadata", json::object()},
          {"usage",
           {{"input_tokens", u.prompt_tokens},
            {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
            {"output_tokens", u.completion_tokens},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}}}};
}

std::string event(const std::string& type, json data, int64_t& sequence) {
  data["type"] = type;
  data["sequence_number"] = sequence++;
  return "event: " + type + "\ndata: " + dump(data) + "\n\n";
}

}  // namespace ember::server::responses
