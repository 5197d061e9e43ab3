// Tool calls (OpenAI's function calling): the request's `tools`, `tool_choice` and
// `parallel_tool_calls`; the conversation's earlier calls and results; the prompt and sampling
// they need; and the model's text read back as calls.
//
// How a model writes a call depends on its family, found in its chat template:
//   hermes   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>  (Qwen 2.5, Hermes)
//   llama3   {"name": ..., "parameters": {...}}                          (Llama 3.1 - 3.3)
//   mistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}]             (Mistral, Nemo)
//   generic  {"tool_calls": [{"name": ..., "arguments": {...}}]}         (any other template)
// The first three templates render `tools` and the calls and results themselves; for the others
// (SmolLM2, Gemma, Phi-3.5: templates without tools) the tools are described in the system message
// with the JSON to answer in, an earlier call is that JSON and a result a user message.
//
// tool_choice "required" or a named function constrains sampling (engine/grammar.hpp) to the
// family's call syntax around arguments that validate against the function's schema, so even a
// small model's call always parses; "auto" lets the model choose and finds the calls in its text;
// "none" leaves the tools out.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar.hpp"
#include "jinja/value.hpp"
#include "server/api_error.hpp"
#include "tokenizer/chat_template.hpp"

namespace ember::server {

enum class ToolFormat { hermes, llama3, mistral, generic };
const char* tool_format_name(ToolFormat f);
// The format of a model's chat template source.
ToolFormat tool_format(const std::string& template_source);

struct Tool {
  std::string name, description;
  nlohmann::ordered_json parameters;  // a JSON schema of the arguments ({"type": "object"} when absent)
};

struct ToolChoice {
  enum class Mode { none, automatic, required, named };
  Mode mode = Mode::automatic;
  std::string name;  // named
};

struct ToolRequest {
  std::vector<Tool> tools;
  ToolChoice choice;
  // parallel_tool_calls: several calls in one answer. Off unless asked for, as llama.cpp's server
  // has it: a small model that may repeat calls forever under a forced choice does.
  bool parallel = false;
  bool active() const { return !tools.empty() && choice.mode != ToolChoice::Mode::none; }
  bool forced() const { return choice.mode == ToolChoice::Mode::required || choice.mode == ToolChoice::Mode::named; }
};

// Reads `tools`, `tool_choice` and `parallel_tool_calls` of a request body (OpenAI's shapes);
// an ApiError names the field (an unknown function in tool_choice, a malformed tool, ...).
std::optional<ApiError> parse_tools(const nlohmann::ordered_json& body, ToolRequest& out);
// An assistant message's `tool_calls` ([{id, type: "function", function: {name, arguments}}],
// arguments a JSON string) and a tool message's `tool_call_id` and `name`, into `m`. `at` names
// the message ("messages[3]").
std::optional<ApiError> parse_message_tools(const nlohmann::json& msg, const std::string& at, ChatMessage& m);
// Every tool message answers a call an earlier assistant message made (its tool_call_id among
// their ids), as OpenAI requires; else a 400 naming the message.
std::optional<ApiError> check_tool_results(const std::vector<ChatMessage>& messages);

// What the template renders for a request: the messages (the generic format's tool
// description, calls and results folded in) and its `tools` variable (native formats).
struct ToolPrompt {
  std::vector<ChatMessage> messages;
  jinja::Value tools;
};
ToolPrompt tool_prompt(ToolFormat f, const ToolRequest& r, std::vector<ChatMessage> messages);

// The grammar of the calls a forced tool_choice allows: the named function or any of them, one
// or (parallel) several, each's arguments valid against its schema. Throws SchemaError naming
// the tool ("tools[1].function.parameters: ...") for a schema the grammar cannot enforce.
std::shared_ptr<const Grammar> tool_call_grammar(ToolFormat f, const ToolRequest& r);

// The model's text read back: its calls (of the request's functions; arguments as compact JSON
// text, ids "call_<prefix>_<n>") and the text around them.
struct ToolOutput {
  std::string content;
  std::vector<ToolCall> calls;
};
ToolOutput parse_tool_output(ToolFormat f, const ToolRequest& r, std::string_view text, const std::string& id_prefix);

// While streaming: how much of the text so far is surely not part of a call (sent as content
// now; the rest waits for the end, where parse_tool_output decides).
size_t content_before_calls(ToolFormat f, std::string_view text);

// A streamed answer where tools are offered (both APIs' routes): the text that may be a call is
// held back (all of it under a forced choice), and the end decides what it was.
class HeldToolText {
 public:
  HeldToolText(ToolFormat f, const ToolRequest& r) : format_(f), request_(r) {}
  // Takes a piece of the answer; returns the text that can go out as content now (may be empty).
  std::string add(std::string_view piece);
  // At the end: the calls, and the content still to send (held-back text that was no call).
  struct End {
    std::vector<ToolCall> calls;
    std::string content;
  };
  End finish(const std::string& id_prefix);

 private:
  ToolFormat format_;
  const ToolRequest& request_;
  std::string all_;
  size_t sent_ = 0;
};

}  // namespace ember::server
