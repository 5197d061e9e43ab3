#include "server/tool_calls.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "core/enum_names.hpp"
#include "core/json.hpp"
#include "jinja/json.hpp"
#include "server/json_schema.hpp"
#include "server/request_fields.hpp"

namespace ember::server {

namespace {

using ojson = nlohmann::ordered_json;
using Sym = Grammar::Symbol;
using Seq = Grammar::Sequence;

constexpr size_t kMaxTools = 128;

bool contains(const std::string& s, const char* x) { return s.find(x) != std::string::npos; }

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

const Tool* find_tool(const ToolRequest& r, const std::string& name) {
  for (const Tool& t : r.tools)
    if (t.name == name) return &t;
  return nullptr;
}

size_t skip_ws(std::string_view t, size_t i) {
  while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\t' || t[i] == '\r')) ++i;
  return i;
}

// A call object {"name", "arguments" | "parameters"} of one of the request's tools.
std::optional<ToolCall> call_of(const ojson& j, const ToolRequest& r) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  if (!find_tool(r, name)) return std::nullopt;
  ojson args = j.contains("arguments") ? j["arguments"] : j.contains("parameters") ? j["parameters"] : ojson::object();
  if (args.is_string()) {  // some models write the arguments as a JSON string
    ojson parsed = parse_json<ojson>(args.get<std::string>());
    if (!parsed.is_discarded()) args = parsed;
  }
  return ToolCall{"", name, args.dump()};
}

// A value's type as a short text: "string", "integer", "array of string", "\"c\" | \"f\"" (an
// enum), "{a: integer, b?: string}" (an object's properties: the arguments and one level inside them), "any".
std::string schema_type(const ojson& s, int depth) {
  if (!s.is_object()) return "any";
  const auto alternatives = [&](const ojson& list, const char* sep) {
    std::string out;
    size_t k = 0;
    for (const ojson& v : list) {
      if (k == 8) return out + sep + "...";
      out += (k++ ? sep : "") + (v.is_object() ? schema_type(v, depth) : v.dump());
    }
    return out;
  };
  if (s.contains("enum") && s["enum"].is_array() && !s["enum"].empty()) {
    std::string out;
    for (size_t k = 0; k < s["enum"].size() && k < 8; ++k) out += (k ? " | " : "") + s["enum"][k].dump();
    return s["enum"].size() > 8 ? out + " | ..." : out;
  }
  if (s.contains("const")) return s["const"].dump();
  for (const char* any : {"anyOf", "oneOf"})
    if (s.contains(any) && s[any].is_array() && !s[any].empty()) return alternatives(s[any], " | ");
  const ojson type = s.contains("type") ? s["type"] : ojson();
  if (type.is_array()) {
    std::string out;
    for (const ojson& t : type) out += (out.empty() ? "" : " | ") + (t.is_string() ? t.get<std::string>() : "any");
    return out.empty() ? "any" : out;
  }
  const std::string t = type.is_string() ? type.get<std::string>() : "";
  if (t == "array") return s.contains("items") ? "array of " + schema_type(s["items"], depth) : "array";
  if (t == "object" || (t.empty() && s.contains("properties"))) {
    if (depth > 1 || !s.contains("properties") || !s["properties"].is_object() || s["properties"].empty()) return "object";
    std::string out = "{";
    size_t k = 0;
    for (const auto& [name, v] : s["properties"].items()) {
      const bool required = s.contains("required") && s["required"].is_array() &&
                            std::find(s["required"].begin(), s["required"].end(), name) != s["required"].end();
      out += (k++ ? ", " : "") + name + (required ? ": " : "?: ") + schema_type(v, depth + 1);
    }
    return out + "}";
  }
  return t.empty() ? "any" : t;
}

// A tool as the generic format describes it: what a model needs to call it, not its whole
// schema (a client such as Open WebUI sends dozens of tools: their schemas would fill a small
// model's context). "name(city: string, unit?: "c" | "f") - what it does" (the description's
// first line, at most 200 bytes).
std::string tool_signature_line(const Tool& t) {
  std::string args = schema_type(t.parameters, 0);
  if (args.front() == '{') args = args.substr(1, args.size() - 2);
  else if (args == "object") args.clear();
  std::string line = t.name + "(" + args + ")";
  std::string what = t.description.substr(0, t.description.find('\n'));
  if (what.size() > 200) {
    size_t cut = 200;
    while (cut > 0 && (static_cast<unsigned char>(what[cut]) & 0xC0) == 0x80) --cut;  // a whole character
    what = what.substr(0, cut) + "...";
  }
  return what.empty() ? line : line + " - " + what;
}

}  // namespace

const char* tool_format_name(ToolFormat f) {
  static constexpr EnumName<ToolFormat> kNames[] = {{ToolFormat::hermes, "hermes"},
                                                    {ToolFormat::llama3, "llama3"},
                                                    {ToolFormat::mistral, "mistral"},
                                                    {ToolFormat::generic, "generic"}};
  return enum_name(kNames, f);
}

ToolFormat tool_format(const std::string& src) {
  if (contains(src, "<tool_call>")) return ToolFormat::hermes;
  if (contains(src, "[TOOL_CALLS]")) return ToolFormat::mistral;
  if (contains(src, "<|start_header_id|>") && contains(src, "tools") &&
      (contains(src, "\"parameters\"") || contains(src, "<|python_tag|>")))
    return ToolFormat::llama3;
  return ToolFormat::generic;
}

std::optional<ApiError> parse_tools(const ojson& body, ToolRequest& out) {
  const auto field_of = [&](const char* k) -> const ojson* {
    const auto it = body.find(k);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  if (const ojson* t = field_of("tools")) {
    if (!t->is_array()) return bad("tools", "'tools' must be an array of {\"type\": \"function\", \"function\": {...}}");
    if (t->size() > kMaxTools) return bad("tools", fmt::format("'tools' holds {} tools; at most {}", t->size(), kMaxTools));
    for (size_t i = 0; i < t->size(); ++i) {
      const ojson& x = (*t)[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!x.is_object()) return bad(at, at + " must be an object");
      if (!x.contains("type") || x["type"] != "function")
        return bad(at + ".type", at + ".type must be \"function\" (the only kind of tool)");
      if (!x.contains("function") || !x["function"].is_object()) return bad(at + ".function", at + ".function must be an object");
      const ojson& f = x["function"];
      Tool tool;
      if (!f.contains("name") || !f["name"].is_string() || !valid_name(f["name"].get<std::string>()))
        return bad(at + ".function.name", at + ".function.name must be 1 to 64 letters, digits, '_' or '-'");
      tool.name = f["name"].get<std::string>();
      if (find_tool(out, tool.name)) return bad(at + ".function.name", fmt::format("two tools are named '{}'", tool.name));
      if (f.contains("description") && !f["description"].is_null()) {
        if (!f["description"].is_string()) return bad(at + ".function.description", at + ".function.description must be a string");
        tool.description = f["description"].get<std::string>();
      }
      tool.parameters = f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"] : ojson{{"type", "object"}};
      if (!tool.parameters.is_object())
        return bad(at + ".function.parameters", at + ".function.parameters must be a JSON schema (an object)");
      out.tools.push_back(std::move(tool));
    }
  }
  if (const ojson* c = field_of("tool_choice")) {
    if (c->is_string()) {
      const std::string s = c->get<std::string>();
      if (s == "none") out.choice.mode = ToolChoice::Mode::none;
      else if (s == "auto") out.choice.mode = ToolChoice::Mode::automatic;
      else if (s == "required") out.choice.mode = ToolChoice::Mode::required;
      else return bad("tool_choice", fmt::format("'tool_choice' '{}' is not one of none, auto, required", s));
    } else if (c->is_object() && c->contains("function") && (*c)["function"].is_object() &&
               (*c)["function"].contains("name") && (*c)["function"]["name"].is_string()) {
      out.choice.mode = ToolChoice::Mode::named;
      out.choice.name = (*c)["function"]["name"].get<std::string>();
      if (!find_tool(out, out.choice.name))
        return bad("tool_choice", fmt::format("'tool_choice' names the function '{}', which is not in 'tools'", out.choice.name));
    } else {
      return bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                "\"function\": {\"name\": ...}}");
    }
    if (out.tools.empty() && out.choice.mode != ToolChoice::Mode::none && out.choice.mode != ToolChoice::Mode::automatic)
      return bad("tool_choice", "'tool_choice' asks for a call but 'tools' is empty");
  }
  if (const ojson* p = field_of("parallel_tool_calls")) {
    if (!p->is_boolean()) return bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    out.parallel = p->get<bool>();
  }
  return std::nullopt;
}

std::optional<ApiError> parse_message_tools(const nlohmann::json& msg, const std::string& at, ChatMessage& m) {
  using ojson = nlohmann::json;  // (the messages' JSON: key order does not matter here)
  if (const auto it = msg.find("tool_calls"); it != msg.end() && !it->is_null()) {
    if (m.role != "assistant") return bad(at + ".tool_calls", at + ".tool_calls belongs to assistant messages");
    if (!it->is_array()) return bad(at + ".tool_calls", at + ".tool_calls must be an array");
    for (size_t k = 0; k < it->size(); ++k) {
      const ojson& c = (*it)[k];
      const std::string ca = fmt::format("{}.tool_calls[{}]", at, k);
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
        return bad(ca, ca + " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
      const ojson& f = c["function"];
      if (!f.contains("name") || !f["name"].is_string()) return bad(ca + ".function.name", ca + ".function.name must be a string");
      ToolCall call;
      call.name = f["name"].get<std::string>();
      call.id = c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : fmt::format("call_{}", k);
      if (f.contains("arguments") && f["arguments"].is_string()) call.arguments = f["arguments"].get<std::string>();
      else if (f.contains("arguments") && f["arguments"].is_object()) call.arguments = f["arguments"].dump();
      else if (f.contains("arguments") && !f["arguments"].is_null())
        return bad(ca + ".function.arguments", ca + ".function.arguments must be a JSON string");
      else call.arguments = "{}";
      m.tool_calls.push_back(std::move(call));
    }
  }
  if (m.role == "tool") {
    const auto id = msg.find("tool_call_id");
    if (id == msg.end() || !id->is_string())
      return bad(at + ".tool_call_id", at + ".tool_call_id is required in a tool message: the id of the call it answers");
    m.tool_call_id = id->get<std::string>();
    if (const auto n = msg.find("name"); n != msg.end() && n->is_string()) m.name = n->get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> check_tool_results(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "tool") continue;
    bool answered = false;
    for (size_t k = 0; k < i && !answered; ++k)
      for (const ToolCall& c : messages[k].tool_calls) answered = answered || c.id == messages[i].tool_call_id;
    if (!answered)
      return bad(fmt::format("messages[{}].tool_call_id", i),
                 fmt::format("messages[{}] (a tool message) answers no call: no earlier assistant message has a tool "
                             "call with the id '{}'", i, messages[i].tool_call_id.substr(0, 64)));
  }
  return std::nullopt;
}

ToolPrompt tool_prompt(ToolFormat f, const ToolRequest& r, std::vector<ChatMessage> messages) {
  ToolPrompt p;
  // A tool message's function name, where the client left it out: the call's.
  for (ChatMessage& m : messages)
    if (m.role == "tool" && m.name.empty())
      for (const ChatMessage& a : messages)
        for (const ToolCall& c : a.tool_calls)
          if (c.id == m.tool_call_id) m.name = c.name;
  if (f != ToolFormat::generic) {
    if (r.active()) {
      ojson tools = ojson::array();
      for (const Tool& t : r.tools) {
        if (r.choice.mode == ToolChoice::Mode::named && t.name != r.choice.name) continue;
        ojson fn = {{"name", t.name}};
        if (!t.description.empty()) fn["description"] = t.description;
        fn["parameters"] = t.parameters;
        tools.push_back({{"type", "function"}, {"function", fn}});
      }
      p.tools = jinja::from_json(tools);
    }
    p.messages = std::move(messages);
    return p;
  }
  // Generic: earlier calls as the JSON the model writes; a run of results as one user message
  // that asks for the answer (a small model otherwise repeats its call: SmolLM2-135M did).
  const std::string ask = r.active() ? "Now answer the question (or call another tool)."
                                     : "Now answer the question, without calling tools.";
  bool in_results = false;
  const auto end_results = [&] {
    if (in_results) p.messages.back().content += "\n" + ask;
    in_results = false;
  };
  for (ChatMessage& m : messages) {
    if (m.role == "tool") {
      const std::string line = fmt::format("The tool {} returned {}", m.name.empty() ? m.tool_call_id : m.name, m.content);
      if (in_results) p.messages.back().content += "\n" + line;
      else p.messages.push_back({"user", line});
      in_results = true;
      continue;
    }
    end_results();
    if (!m.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const ToolCall& c : m.tool_calls) {
        ojson args = parse_json<ojson>(c.arguments);
        calls.push_back({{"name", c.name}, {"arguments", args.is_discarded() ? ojson(c.arguments) : args}});
      }
      m.content += (m.content.empty() ? "" : "\n") + ojson{{"tool_calls", calls}}.dump();
      m.tool_calls.clear();
    }
    p.messages.push_back(std::move(m));
  }
  end_results();
  if (!r.active()) return p;
  std::string text = "You can call these tools (name(argument: type, ...; ? marks an optional one) - what it does):\n";
  for (const Tool& t : r.tools)
    if (r.choice.mode != ToolChoice::Mode::named || t.name == r.choice.name) text += tool_signature_line(t) + "\n";
  const std::string form = R"({"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}]})";
  if (r.choice.mode == ToolChoice::Mode::named)
    text += fmt::format("Call the tool {}: reply with only this JSON: {}", r.choice.name, form);
  else if (r.choice.mode == ToolChoice::Mode::required)
    text += "Call a tool: reply with only this JSON: " + form;
  else
    text += "To call tools, reply with only this JSON: " + form + "\nOtherwise reply to the user as usual.";
  if (!p.messages.empty() && p.messages[0].role == "system") p.messages[0].content += "\n\n" + text;
  else p.messages.insert(p.messages.begin(), ChatMessage{"system", text});
  return p;
}

std::shared_ptr<const Grammar> tool_call_grammar(ToolFormat f, const ToolRequest& r) {
  SchemaGrammarBuilder b;
  Grammar& g = b.grammar();
  const int call = g.add_rule("call");
  const char* args_key = f == ToolFormat::llama3 ? "parameters" : "arguments";
  for (size_t i = 0; i < r.tools.size(); ++i) {
    const Tool& t = r.tools[i];
    if (r.choice.mode == ToolChoice::Mode::named && t.name != r.choice.name) continue;
    int args;
    try {
      args = b.value(t.parameters);
    } catch (const SchemaError& e) {
      throw SchemaError(fmt::format("tools[{}].function.parameters: {}", i, e.what()));
    }
    Seq s;
    Grammar::append_literal(s, fmt::format(R"({{"name": {}, "{}": )", ojson(t.name).dump(), args_key));
    s.push_back(Sym::ref(args));
    Grammar::append_literal(s, "}");
    g.add_alternative(call, s);
  }
  // One call, or (parallel) a list: call (sep call)*, right-recursive.
  const std::string sep = f == ToolFormat::hermes ? "\n</tool_call>\n<tool_call>\n" : f == ToolFormat::llama3 ? "\n" : ", ";
  int calls = call;
  if (r.parallel) {
    calls = g.add_rule("calls");
    g.add_alternative(calls, {Sym::ref(call)});
    Seq more{Sym::ref(call)};
    Grammar::append_literal(more, sep);
    more.push_back(Sym::ref(calls));
    g.add_alternative(calls, more);
  }
  const std::pair<const char*, const char*> around = f == ToolFormat::hermes    ? std::pair{"<tool_call>\n", "\n</tool_call>"}
                                                     : f == ToolFormat::mistral ? std::pair{"[TOOL_CALLS][", "]"}
                                                     : f == ToolFormat::generic ? std::pair{R"({"tool_calls": [)", "]}"}
                                                                                : std::pair{"", ""};
  const int root = g.add_rule("tool_calls");
  Seq s;
  Grammar::append_literal(s, around.first);
  s.push_back(Sym::ref(calls));
  Grammar::append_literal(s, around.second);
  g.add_alternative(root, s);
  return b.finish(root);
}

ToolOutput parse_tool_output(ToolFormat f, const ToolRequest& r, std::string_view text, const std::string& id_prefix) {
  ToolOutput out;
  const auto add = [&](std::optional<ToolCall> c) {
    if (!c) return false;
    c->id = fmt::format("call_{}_{}", id_prefix, out.calls.size());
    out.calls.push_back(std::move(*c));
    return true;
  };
  const auto parse_at = [&](size_t b, size_t& end) -> ojson {
    end = json_value_end(text, b);
    if (end == std::string_view::npos) return ojson();
    return parse_json<ojson>(text.substr(b, end - b));
  };
  if (f == ToolFormat::hermes) {
    size_t pos = 0;
    for (;;) {
      const size_t open = text.find("<tool_call>", pos);
      if (open == std::string_view::npos) break;
      const size_t b = skip_ws(text, open + 11);
      size_t end = 0;
      const ojson j = b < text.size() && text[b] == '{' ? parse_at(b, end) : ojson();
      if (j.is_discarded() || j.is_null() || !add(call_of(j, r))) break;  // not a call: the rest is text
      out.content += text.substr(pos, open - pos);
      pos = skip_ws(text, end);
      if (text.substr(pos).starts_with("</tool_call>")) pos = skip_ws(text, pos + 12);
    }
    out.content += text.substr(pos);
  } else if (f == ToolFormat::mistral) {
    const size_t open = text.find("[TOOL_CALLS]");
    size_t end = 0;
    const size_t b = open == std::string_view::npos ? text.size() : skip_ws(text, open + 12);
    const ojson j = b < text.size() && text[b] == '[' ? parse_at(b, end) : ojson();
    if (j.is_array()) {
      for (const ojson& c : j) add(call_of(c, r));
      out.content = std::string(text.substr(0, open)) + std::string(text.substr(end));
    } else {
      out.content = text;
    }
  } else {  // llama3 and generic: the reply is the JSON, or it is text
    size_t b = skip_ws(text, 0);
    if (f == ToolFormat::llama3 && text.substr(b).starts_with("<|python_tag|>")) b = skip_ws(text, b + 14);
    std::vector<ToolCall> found;
    size_t pos = b;
    while (pos < text.size() && text[pos] == '{') {
      size_t end = 0;
      const ojson j = parse_at(pos, end);
      if (j.is_discarded() || j.is_null()) break;
      if (f == ToolFormat::generic && j.contains("tool_calls") && j["tool_calls"].is_array()) {
        for (const ojson& c : j["tool_calls"]) add(call_of(c, r));
      } else if (!add(call_of(f == ToolFormat::generic && j.contains("tool_call") ? j["tool_call"] : j, r))) {
        break;
      }
      pos = skip_ws(text, end);
      if (pos < text.size() && text[pos] == ';') pos = skip_ws(text, pos + 1);
    }
    out.content = out.calls.empty() ? std::string(text) : std::string(text.substr(pos));
  }
  while (!out.content.empty() && std::isspace(static_cast<unsigned char>(out.content.back()))) out.content.pop_back();
  if (!out.calls.empty()) {
    const size_t b = out.content.find_first_not_of(" \n\t\r");
    out.content = b == std::string::npos ? "" : out.content.substr(b);
  }
  return out;
}

std::string HeldToolText::add(std::string_view piece) {
  all_ += piece;
  const size_t upto = request_.forced() ? 0 : content_before_calls(format_, all_);
  if (upto <= sent_) return {};
  std::string out = all_.substr(sent_, upto - sent_);
  sent_ = upto;
  return out;
}

HeldToolText::End HeldToolText::finish(const std::string& id_prefix) {
  ToolOutput out = parse_tool_output(format_, request_, all_, id_prefix);
  End end{std::move(out.calls), {}};
  if (end.calls.empty()) end.content = all_.substr(sent_);
  else if (out.content.size() > sent_ && out.content.starts_with(all_.substr(0, sent_))) end.content = out.content.substr(sent_);
  sent_ = all_.size();
  return end;
}

size_t content_before_calls(ToolFormat f, std::string_view text) {
  if (f == ToolFormat::hermes || f == ToolFormat::mistral) {
    const std::string_view marker = f == ToolFormat::hermes ? "<tool_call>" : "[TOOL_CALLS]";
    const size_t at = text.find(marker);
    if (at != std::string_view::npos) return at;
    // A tail that may be the start of the marker waits.
    for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; --k)
      if (marker.starts_with(text.substr(text.size() - k))) return text.size() - k;
    return text.size();
  }
  // llama3 and generic: a reply that starts with '{' (or <|python_tag|>) may be a call.
  const size_t b = skip_ws(text, 0);
  if (b == text.size()) return 0;
  const std::string_view rest = text.substr(b);
  if (rest[0] == '{') return 0;
  if (f == ToolFormat::llama3 && std::string_view("<|python_tag|>").starts_with(rest.substr(0, 14))) return 0;
  return text.size();
}

}  // namespace ember::server
