// Embedding requests as plain data, for OpenAI's and Ollama's routes:
//   POST /v1/embeddings  {model, input, encoding_format = "float" | "base64", dimensions}
//                        -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
//                            "model", "usage": {"prompt_tokens", "total_tokens"}}
//   POST /api/embed      {model, input, truncate = true} -> {"model", "embeddings", timings}
//   POST /api/embeddings {model, prompt} -> {"embedding"} (Ollama's older route: not normalized)
// `input` is a string, an array of strings, an array of token ids or an array of such arrays
// (OpenAI's forms; Ollama's are the first two). Each becomes one vector: the model's final hidden
// states pooled (engine/embedding.hpp, the server's --pooling) and L2-normalized. An input longer
// than the context is a 400 naming it, or cut to the context where Ollama's `truncate` says so.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include "server/api.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::server {

enum class EmbeddingApi { openai, ollama, ollama_legacy };

struct EmbeddingRequest {
  EmbeddingApi api = EmbeddingApi::openai;
  std::vector<std::vector<int32_t>> inputs;  // token ids, the model's BOS first where it adds one
  bool base64 = false;                       // OpenAI's encoding_format
  bool normalize = true;                     // false for /api/embeddings
};

// At most this many inputs in one request (OpenAI's limit).
constexpr size_t kMaxEmbeddingInputs = 2048;

std::variant<EmbeddingRequest, ApiError> parse_embedding_request(std::string_view body, EmbeddingApi api,
                                                                  const ServedModel& model, const Tokenizer& tok);

// The answer for the request's vectors (one per input, in order), in its API's shape.
// prompt_tokens: the inputs' tokens; ns: the time since the request arrived (Ollama's fields).
json embedding_response(const EmbeddingRequest& r, const std::vector<std::vector<float>>& vectors,
                        const ServedModel& model, int64_t prompt_tokens, int64_t ns);

// Little-endian float32 bytes in base64, as OpenAI's encoding_format "base64" sends them.
std::string base64_floats(std::span<const float> v);

}  // namespace ember::server
