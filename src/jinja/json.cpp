#include "jinja/json.hpp"

namespace ember::jinja {

namespace {

template <class J>
Value convert(const J& j) {
  switch (j.type()) {
    case J::value_t::null: return Value::none();
    case J::value_t::boolean: return Value(j.template get<bool>());
    case J::value_t::number_integer: return Value(j.template get<int64_t>());
    case J::value_t::number_unsigned: return Value(static_cast<int64_t>(j.template get<uint64_t>()));
    case J::value_t::number_float: return Value(j.template get<double>());
    case J::value_t::string: return Value(j.template get<std::string>());
    case J::value_t::array: {
      Value::Array a;
      for (const J& x : j) a.push_back(convert(x));
      return Value::array(std::move(a));
    }
    case J::value_t::object: {
      Value o = Value::object();
      for (auto it = j.begin(); it != j.end(); ++it) o.as_object().set(it.key(), convert(it.value()));
      return o;
    }
    default: return Value();
  }
}

}  // namespace

Value from_json(const nlohmann::ordered_json& j) { return convert(j); }
Value from_json(const nlohmann::json& j) { return convert(j); }

}  // namespace ember::jinja
