// Reading a request body's fields with errors that name them, shared by the APIs (OpenAI's in
// api.cpp, Ollama's in ollama.cpp): a field that is null counts as absent, a value of the wrong type
// or out of range gives a 400 ApiError naming the field and what was expected.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <string_view>
#include <variant>

#include "server/api.hpp"

namespace ember::server {

ApiError bad(std::string param, std::string message, std::string code = "");
// A request body as a JSON object, or a 400: not JSON, nested deeper than kMaxJsonDepth
// (core/json.hpp), or not an object. `example` shows the expected object in the message.
template <class J = json>
std::variant<J, ApiError> parse_body(std::string_view body, std::string_view example);
// A value as errors quote it: its JSON, cut to 40 bytes.
std::string brief(const json& v);
// "an object", "a string", ... (for messages)
const char* type_name(const json& v);
// The field, or null where it is absent or null.
const json* field(const json& obj, const char* name);
std::optional<ApiError> get_number(const json& obj, const char* name, double lo, double hi, float& out);
// An integer: JSON integers, or floats with an integral value (as JavaScript sends 5.0). `why`
// explains the range, in range errors only.
std::optional<ApiError> get_int(const json& obj, const char* name, int64_t lo, int64_t hi, std::optional<int64_t>& out,
                                const std::string& why = "");
std::optional<ApiError> get_bool(const json& obj, const char* name, bool& out);
// Token ids (an array of integers in [0, n_vocab); n_vocab 0: no upper bound) appended to `out`;
// an error names `param` and the element (`at`[i]).
std::optional<ApiError> read_token_ids(const json& arr, const std::string& param, const std::string& at,
                                       int64_t n_vocab, std::vector<int32_t>& out);
// OpenAI's presence_penalty and frequency_penalty (-2 to 2) and logit_bias ({"token id": bias},
// biases -100 to 100, ids below model.n_vocab), into the sampling parameters.
std::optional<ApiError> get_penalties(const json& obj, const ServedModel& model, SamplerParams& out);

}  // namespace ember::server
