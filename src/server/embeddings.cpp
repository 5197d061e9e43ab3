#include "server/embeddings.hpp"

#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "server/ollama.hpp"
#include "server/request_fields.hpp"

namespace ember::server {

namespace {

// input: a string, [string], [int] or [[int]] (the last two OpenAI's only).
std::optional<ApiError> read_inputs(const json& j, const char* key, bool token_ids, const Tokenizer& tok,
                                    std::vector<std::vector<int32_t>>& out) {
  const json* in = field(j, key);
  if (!in) return bad(key, fmt::format("'{}' is required: a string or an array of strings", key));
  const auto text = [&](const json& s, const std::string& at) -> std::optional<ApiError> {
    const std::string str = s.get<std::string>();
    if (str.empty()) return bad(at, fmt::format("{} is an empty string: there is nothing to embed", at));
    out.push_back(tok.encode(str, /*add_special=*/true, /*parse_special=*/false));
    return std::nullopt;
  };
  if (in->is_string()) return text(*in, key);
  const std::string forms = token_ids ? "a string, an array of strings, an array of token ids or an array of such arrays"
                                      : "a string or an array of strings";
  if (!in->is_array()) return bad(key, fmt::format("'{}' must be {}, got {}", key, forms, type_name(*in)));
  if (in->empty()) return bad(key, fmt::format("'{}' is an empty array: there is nothing to embed", key));
  if (token_ids && (*in)[0].is_number()) {
    out.emplace_back();
    return read_token_ids(*in, key, key, tok.n_vocab(), out.back());
  }
  if (in->size() > kMaxEmbeddingInputs)
    return bad(key, fmt::format("'{}' holds {} inputs; at most {} go in one request", key, in->size(), kMaxEmbeddingInputs));
  for (size_t i = 0; i < in->size(); ++i) {
    const json& x = (*in)[i];
    const std::string at = fmt::format("{}[{}]", key, i);
    if (x.is_string()) {
      if (auto e = text(x, at)) return e;
    } else if (token_ids && x.is_array() && !x.empty()) {
      out.emplace_back();
      if (auto e = read_token_ids(x, at, at, tok.n_vocab(), out.back())) return e;
    } else {
      return bad(at, fmt::format("{} must be {}, got {}", at, token_ids ? "a string or a nonempty array of token ids" : "a string",
                                 type_name(x)));
    }
  }
  return std::nullopt;
}

const char* b64_digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string base64_floats(std::span<const float> v) {
  static_assert(std::endian::native == std::endian::little, "base64 floats are written as the machine's bytes");
  std::vector<uint8_t> b(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  std::string out;
  out.reserve((b.size() + 2) / 3 * 4);
  for (size_t i = 0; i < b.size(); i += 3) {
    const uint32_t n = (uint32_t{b[i]} << 16) | (i + 1 < b.size() ? uint32_t{b[i + 1]} << 8 : 0) |
                       (i + 2 < b.size() ? uint32_t{b[i + 2]} : 0);
    out += b64_digits[(n >> 18) & 63];
    out += b64_digits[(n >> 12) & 63];
    out += i + 1 < b.size() ? b64_digits[(n >> 6) & 63] : '=';
    out += i + 2 < b.size() ? b64_digits[n & 63] : '=';
  }
  return out;
}

std::variant<EmbeddingRequest, ApiError> parse_embedding_request(std::string_view body, EmbeddingApi api,
                                                                  const ServedModel& model, const Tokenizer& tok) {
  const char* key = api == EmbeddingApi::ollama_legacy ? "prompt" : "input";
  auto parsed = parse_body(body, fmt::format(R"({{"model": ..., "{}": ...}})", key));
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  EmbeddingRequest r;
  r.api = api;
  bool truncate = false;
  if (api == EmbeddingApi::openai) {
    if (auto e = check_model_field(j, model)) return *e;
    if (const json* f = field(j, "encoding_format")) {
      if (!f->is_string() || (*f != "float" && *f != "base64"))
        return bad("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
      r.base64 = *f == "base64";
    }
    std::optional<int64_t> dims;
    if (auto e = get_int(j, "dimensions", 1, 1 << 20, dims)) return *e;
    if (dims && *dims != model.n_embd)
      return bad("dimensions", fmt::format("this model's embeddings have {} dimensions; 'dimensions' cannot change "
                                           "that (leave it out)", model.n_embd));
  } else {
    if (auto e = ollama::check_model(j, model)) return *e;
    truncate = api == EmbeddingApi::ollama;  // Ollama's default
    if (auto e = get_bool(j, "truncate", truncate)) return *e;
    r.normalize = api == EmbeddingApi::ollama;
  }
  if (auto e = read_inputs(j, key, api == EmbeddingApi::openai, tok, r.inputs)) return *e;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    std::vector<int32_t>& in = r.inputs[i];
    if (static_cast<int64_t>(in.size()) <= model.n_ctx) continue;
    if (truncate) {
      in.resize(static_cast<size_t>(model.n_ctx));
      continue;
    }
    const std::string at = r.inputs.size() > 1 ? fmt::format("{}[{}]", key, i) : key;
    return ApiError{400,
                    fmt::format("{} has {} tokens but the context holds {}; shorten it{}", at, in.size(), model.n_ctx,
                                api == EmbeddingApi::openai ? "" : " or set \"truncate\": true"),
                    "invalid_request_error", at, "context_length_exceeded"};
  }
  return r;
}

json embedding_response(const EmbeddingRequest& r, const std::vector<std::vector<float>>& vectors,
                        const ServedModel& model, int64_t prompt_tokens, int64_t ns) {
  if (r.api == EmbeddingApi::ollama_legacy) return json{{"embedding", vectors.at(0)}};
  if (r.api == EmbeddingApi::ollama)
    return json{{"model", model.id}, {"embeddings", vectors}, {"total_duration", ns}, {"load_duration", 0},
                {"prompt_eval_count", prompt_tokens}};
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i)
    data.push_back({{"object", "embedding"},
                    {"index", i},
                    {"embedding", r.base64 ? json(base64_floats(vectors[i])) : json(vectors[i])}});
  return json{{"object", "list"},
              {"data", std::move(data)},
              {"model", model.id},
              {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

}  // namespace ember::server
