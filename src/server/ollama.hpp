// Ollama's API as plain data (https://github.com/ollama/ollama/blob/main/docs/api.md), beside
// OpenAI's (api.hpp), so that tools written for Ollama point at `ember serve` unchanged:
//   POST /api/chat      {model, messages, tools, format, options, stream = true}   NDJSON chunks
//   POST /api/generate  {model, prompt, system, raw, format, options, stream = true}
//   GET  /api/tags, POST /api/show, GET /api/ps, GET /api/version
// Requests become the CompletionRequest the engine path takes (a /api/generate prompt goes through
// the chat template, as Ollama applies the model's template, unless raw), with Ollama's option
// names: num_predict (-1: until the model ends or the context is full; -2: fill the context),
// num_ctx (at most the server's context: a smaller one limits prompt and answer), temperature,
// top_k, top_p, min_p, seed, stop, repeat_penalty, repeat_last_n; `format` "json" or a JSON
// schema (sampling constrained by its grammar); /api/chat's `tools` (OpenAI's shapes) on the
// machinery of OpenAI's route (server/tool_calls.hpp: the model's call format, its calls read back),
// the model choosing whether to call, and `tool` messages answering earlier calls. Errors are
// {"error": "message"} with a status.
#pragma once
#include <string>
#include <string_view>
#include <variant>

#include "server/api.hpp"

namespace ember::server::ollama {

struct Request {
  CompletionRequest completion;  // chat: the messages; stream as asked (Ollama's default: true)
  bool chat = false;             // /api/chat (a message in each chunk) or /api/generate (response)
  int64_t num_ctx = 0;           // 0: the server's context
  bool fill_context = false;     // num_predict -2
};
// Parses a /api/chat (chat) or /api/generate body; an ApiError names what is wrong (404 for a
// model this server does not serve: Ollama's clients may add the tag ":latest").
std::variant<Request, ApiError> parse_request(std::string_view body, bool chat, const ServedModel& model);

// The generation limits of a prepared request under num_ctx / num_predict -2 (the prompt must fit
// the smaller context; the answer never passes its end).
std::optional<ApiError> apply_limits(const Request& r, PreparedRequest& p);

// The model named in a request's `key` (required; Ollama's clients may add ":latest" to a name
// without a tag): 404 for another.
std::optional<ApiError> check_model(const json& j, const ServedModel& model, const char* key = "model");

// {"error": message}
std::string error_body(const ApiError& e);

// The times and counts of a finished generation, nanoseconds.
struct Timings {
  int64_t total_ns = 0, prompt_ns = 0, eval_ns = 0;
  int64_t prompt_tokens = 0, tokens = 0;
};
// A chunk of the answer (done false), or the last one (done true, with done_reason and timings):
// /api/chat {"model", "created_at", "message": {"role": "assistant", "content"}, "done"},
// /api/generate {"model", "created_at", "response", "done"}.
// With tool calls (/api/chat with tools): the last chunk's message carries them (not streaming),
// or a chunk of their own comes before it (streaming), as Ollama writes them:
// "tool_calls": [{"function": {"index", "name", "arguments": {...}}}] (arguments an object).
json chunk(const ServedModel& m, bool chat, const std::string& text);
json final_chunk(const ServedModel& m, bool chat, const std::string& text, FinishReason finish, const Timings& t,
                 const std::vector<ToolCall>* calls = nullptr);
json tool_calls(const std::vector<ToolCall>& calls);
json tool_calls_chunk(const ServedModel& m, const std::vector<ToolCall>& calls);

json version();
json tags(const ServedModel& m);
json show(const ServedModel& m);
json ps(const ServedModel& m, uint64_t device_bytes);
// Parses /api/show's body: {"model"} (or the older "name"); 404 for another model.
std::optional<ApiError> check_show(std::string_view body, const ServedModel& m);

// RFC 3339 UTC time with nanoseconds, as Ollama writes created_at: 2026-11-27T21:43:18.123456789Z.
std::string timestamp_now();
std::string timestamp(int64_t unix_seconds);

}  // namespace ember::server::ollama
