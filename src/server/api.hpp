// The OpenAI-compatible API as plain data: request bodies parsed and validated into structs,
// errors in OpenAI's shape, and the JSON of responses and stream chunks. No sockets here, so
// all of it is unit-tested directly.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/embedding.hpp"
#include "engine/generator.hpp"
#include "server/api_error.hpp"
#include "server/tool_calls.hpp"
#include "tokenizer/chat_format.hpp"

namespace ember {
class Tokenizer;
}

namespace ember::server {

using json = nlohmann::json;

json error_json(const ApiError& e);
// error_json as text; never throws (invalid UTF-8 in a message is replaced).
std::string error_body(const ApiError& e);
// Serializes any JSON we send, replacing invalid UTF-8 rather than throwing.
std::string dump(const json& j);

// The served file as Ollama's /api/tags, /api/show and /api/ps describe it.
struct ModelFileInfo {
  std::string path, architecture;
  std::string quantization;  // the type holding most of its matrices' bytes (Q4_1, Q4_K, ...)
  uint64_t bytes = 0, parameters = 0;
  int64_t modified = 0;      // unix time of the file
  std::string digest;        // a stable id of the file (its path, size and time), 64 hex digits
  json metadata;             // its scalar metadata (arrays left out), key -> value
};

// What the server serves, which requests are checked against.
struct ServedModel {
  std::string id;           // the name clients pass as "model"
  int64_t n_ctx = 0;        // context of each session, tokens
  int64_t n_vocab = 0;      // tokens of the vocabulary (logit_bias's ids are below it; 0: unchecked)
  std::string chat_template;  // model_chat_template(): the file's source or a style name ("" = ChatML)
  // Renders chats: the file's template (Jinja) or its family style. Null: chat_template's style
  // with no BOS / EOS text (the parsers' tests).
  std::shared_ptr<const ChatFormatter> chat;
  int64_t created = 0;      // unix time, for /v1/models
  // The tokens' bytes, for structured output's grammars (one per served tokenizer).
  std::shared_ptr<const TokenGrammar> grammar_vocab;
  // Sampling where a request leaves it out: the model's recommended (default_sampling).
  SamplerParams sampling;
  ModelFileInfo file;
  int64_t n_embd = 0;                 // an embedding's dimensions
  Pooling pooling = Pooling::mean;    // how embeddings pool the tokens' states (--pooling)
  // Set while the server stops: a chat template rendering then ends (jinja::Limits::cancel).
  const std::atomic<bool>* stopping = nullptr;
};

// Whether a browser page of `origin` ("http://host:port", the Origin header) may call the server:
// a local page (localhost, 127.0.0.0/8, [::1]), the server's own origin (its authority equals
// the request's Host), or one of `listed` ("*": any). Anything else, "null" included, may not.
bool origin_allowed(const std::vector<std::string>& listed, std::string_view origin, std::string_view host);

// A new response or call id's random part: 24 hex digits from the system's random source, so
// that no client can guess another's.
std::string unguessable_id();

// OpenAI's "model" field: optional, but where given the served model's name (else 404).
std::optional<ApiError> check_model_field(const json& j, const ServedModel& model);

// A completions prompt: text, or (ids not empty) token ids taken as they are.
struct CompletionPrompt {
  std::string text;
  std::vector<int32_t> ids;
};

struct CompletionRequest {
  bool chat = false;
  std::vector<ChatMessage> messages;  // chat
  std::string prompt;                 // completions: the prompt prepare_request reads, text
  std::vector<int32_t> prompt_ids;    // ... or token ids (not empty)
  // completions: every prompt given, a choice each, in order (prompt / prompt_ids: the first).
  std::vector<CompletionPrompt> prompts;
  bool echo = false;  // completions: the prompt's text before the answer's, with logprobs its tokens'
  std::optional<int64_t> max_tokens;  // absent: chat until the context is full, completions 16
  SamplerParams sampling;             // ServedModel::sampling, overridden by the request
  std::optional<uint64_t> seed;       // absent: random
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Log-probabilities: -1 none; else the sampled tokens' and this many alternatives each (chat:
  // "logprobs": true with "top_logprobs" 0-20; completions: "logprobs" 0-5).
  int logprobs = -1;
  // Structured output (response_format json_object / json_schema, or a forced tool_choice's
  // calls): the grammar the text must follow (server/json_schema.hpp); null for plain text.
  std::shared_ptr<const Grammar> grammar;
  ToolRequest tools;  // tools, tool_choice, parallel_tool_calls (server/tool_calls.hpp)
};

constexpr int kMaxTopLogprobs = 20;            // chat, as OpenAI
constexpr int kMaxCompletionsLogprobs = 5;     // completions, as OpenAI
constexpr size_t kMaxPrompts = 64;            // completions: prompts in one request

constexpr size_t kMaxStopStrings = 4;  // as OpenAI
constexpr size_t kMaxStopBytes = 1024;
constexpr int64_t kCompletionsDefaultMaxTokens = 16;  // OpenAI's default for /v1/completions

// Parses a request body for /v1/chat/completions (chat) or /v1/completions. Every malformed
// or unsupported field gives an ApiError naming it; an unknown model gives 404.
std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body, bool chat,
                                                                   const ServedModel& model);

// A request ready to run: prompt tokens and generation parameters.
struct PreparedRequest {
  std::vector<int32_t> prompt;
  GenerateParams gen;
  std::string echo;  // completions with echo: the prompt's text, which the answer's text follows
  // Where the request offers tools: they and the model's call format, to read its answer back.
  std::shared_ptr<const ToolRequest> tools;
  ToolFormat tool_format = ToolFormat::generic;
};

// How the served model writes tool calls (its template's family).
ToolFormat served_tool_format(const ServedModel& model);

// Applies the chat template, tokenizes, checks the prompt against the context and sets the
// token limit (never past the end of the context).
std::variant<PreparedRequest, ApiError> prepare_request(const CompletionRequest& req, const Tokenizer& tok,
                                                        const ServedModel& model, uint64_t random_seed);

// "stop" for EOG and stop strings, "length" for the token limit or a full context.
const char* openai_finish_reason(FinishReason r);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prompt cache
};
json usage_json(const Usage& u);

// Identity of one response, shared by all of its chunks.
struct ResponseMeta {
  std::string id;  // chatcmpl-... / cmpl-...
  int64_t created = 0;
  std::string model;
  bool chat = false;
};

// A choice's "logprobs" for these tokens: chat {"content": [{token, logprob, bytes, top_logprobs}],
// "refusal": null}; completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, the
// offsets counted in bytes of the completion's text from *text_offset (0 when null) on, which is
// advanced past these tokens (a stream's next chunk goes on from there).
json logprobs_json(bool chat, const std::vector<TokenLogprobs>& tokens, const Tokenizer& tok,
                   int64_t* text_offset = nullptr);

// `logprobs`: the choice's "logprobs" (null when not asked for). `calls`: the tool calls the
// model made (message.tool_calls; content null when it wrote no text; finish_reason "tool_calls").
json completion_json(const ResponseMeta& m, const std::string& text, FinishReason finish, const Usage& u,
                     const json& logprobs = nullptr, const std::vector<ToolCall>* calls = nullptr);
// [{"id", "type": "function", "function": {"name", "arguments"}}], with "index" in a stream's delta.
json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);
// A stream's chunk of the tool calls (delta.tool_calls, whole calls).
json tool_calls_chunk_json(const ResponseMeta& m, const std::vector<ToolCall>& calls);
// A stream chunk carrying text (finish absent) or the final chunk (empty text, finish set).
// For chat the first chunk should carry the role: role_chunk.
json chunk_json(const ResponseMeta& m, const std::string& text, const std::optional<FinishReason>& finish,
                const json& logprobs = nullptr, bool tool_calls = false);
json role_chunk_json(const ResponseMeta& m);
// The extra chunk of stream_options.include_usage: no choices, usage set.
json usage_chunk_json(const ResponseMeta& m, const Usage& u);
json models_json(const ServedModel& model);

// llama.cpp's /tokenize: {"content", "add_special" = false, "parse_special" = true,
// "with_pieces" = false} -> {"tokens": [ids]} or, with pieces, [{"id", "piece"}] (a piece that is
// not valid UTF-8 alone as its bytes); /detokenize: {"tokens": [ids]} -> the text.
// /tokenize: llama.cpp's {"content", "add_special", "parse_special", "with_pieces"} -> {"tokens"},
// or vLLM's {"prompt", "add_special_tokens"} -> {"tokens", "count", "max_model_len"} (lm-eval's
// remote tokenizer). /detokenize: {"tokens"} -> {"content"} (llama.cpp) and {"prompt"} (vLLM).
struct TokenizeRequest {
  std::string content;
  bool add_special = false, parse_special = true, with_pieces = false;
  bool vllm = false;  // asked in vLLM's shape
};
std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body);
json tokenize_json(const TokenizeRequest& r, const Tokenizer& tok, int64_t n_ctx);
std::variant<std::string, ApiError> parse_detokenize_request(std::string_view body, const Tokenizer& tok);
// /tokenizer_info (vLLM's): the special tokens' text, the chat template, the context.
json tokenizer_info_json(const ServedModel& model, const Tokenizer& tok);
// /props: the defaults a request gets (the model's recommended sampling, the context), the
// sequences, the chat template: what a client (the chat page) shows before it asks anything.
json props_json(const ServedModel& model, int64_t parallel);

}  // namespace ember::server
