#include "server/request_fields.hpp"

#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "core/json.hpp"

namespace ember::server {

ApiError bad(std::string param, std::string message, std::string code) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

template <class J>
std::variant<J, ApiError> parse_body(std::string_view body, std::string_view example) {
  bool deep = false;
  J j = parse_json<J>(body, &deep);
  if (deep)
    return bad("", fmt::format("the request body nests arrays and objects deeper than {} levels", kMaxJsonDepth));
  if (j.is_discarded()) return bad("", fmt::format("the request body is not valid JSON (expected an object such as {})", example));
  if (!j.is_object()) return bad("", fmt::format("the request body must be a JSON object such as {}", example));
  return j;
}
template std::variant<json, ApiError> parse_body<json>(std::string_view, std::string_view);
template std::variant<nlohmann::ordered_json, ApiError> parse_body<nlohmann::ordered_json>(std::string_view,
                                                                                            std::string_view);

std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

// Reads an optional field; null counts as absent. Each getter returns an error on a wrong type.
const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> get_number(const json& obj, const char* name, double lo, double hi, float& out) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) return bad(name, fmt::format("'{}' must be a number, got {}", name, type_name(*v)));
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    return bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, brief(*v)));
  out = static_cast<float>(d);
  return std::nullopt;
}

// An integer: JSON integers, or floats with an integral value (as JavaScript sends 5.0). `why`
// explains the range, in range errors only.
std::optional<ApiError> get_int(const json& obj, const char* name, int64_t lo, int64_t hi, std::optional<int64_t>& out,
                                const std::string& why) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return bad(name, fmt::format("'{}' must be at most {}, got {}{}", name, hi, u, why));
    x = static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15)
      return bad(name, fmt::format("'{}' must be an integer, got {}", name, brief(*v)));
    x = static_cast<int64_t>(d);
  } else {
    return bad(name, fmt::format("'{}' must be an integer, got {}", name, type_name(*v)));
  }
  if (x < lo || x > hi) return bad(name, fmt::format("'{}' must be between {} and {}, got {}{}", name, lo, hi, x, why));
  out = x;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& obj, const char* name, bool& out) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return bad(name, fmt::format("'{}' must be a boolean, got {}", name, type_name(*v)));
  out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_token_ids(const json& arr, const std::string& param, const std::string& at,
                                       int64_t n_vocab, std::vector<int32_t>& out) {
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || (n_vocab > 0 && t.get<int64_t>() >= n_vocab))
      return bad(param, n_vocab > 0 ? fmt::format("{}[{}] must be a token id from 0 to {}, got {}", at, i, n_vocab - 1, brief(t))
                                    : fmt::format("{}[{}] must be a token id, got {}", at, i, brief(t)));
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

std::optional<ApiError> get_penalties(const json& obj, const ServedModel& model, SamplerParams& out) {
  if (auto e = get_number(obj, "presence_penalty", -2.0, 2.0, out.presence_penalty)) return e;
  if (auto e = get_number(obj, "frequency_penalty", -2.0, 2.0, out.frequency_penalty)) return e;
  const json* bias = field(obj, "logit_bias");
  if (!bias) return std::nullopt;
  if (!bias->is_object())
    return bad("logit_bias", fmt::format("'logit_bias' must be an object of token ids to biases, got {}", type_name(*bias)));
  out.logit_bias.clear();
  for (const auto& [key, value] : bias->items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || (model.n_vocab > 0 && id >= model.n_vocab))
      return bad("logit_bias", fmt::format("'logit_bias' keys must be token ids from 0 to {}, got {}", model.n_vocab - 1,
                                           brief(json(key))));
    if (!value.is_number())
      return bad("logit_bias", fmt::format("'logit_bias' values must be numbers, got {}", type_name(value)));
    const double b = value.get<double>();
    if (!(b >= -100 && b <= 100))
      return bad("logit_bias", fmt::format("'logit_bias' values must be between -100 and 100, got {}", brief(value)));
    out.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  return std::nullopt;
}

}  // namespace ember::server
