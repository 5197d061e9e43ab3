#include "gguf/value.hpp"

#include <fmt/format.h>

namespace ember::gguf {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "str";
    case ValueType::ARRAY: return "arr";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "?";
}

bool is_integer(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64:
      return true;
    default:
      return false;
  }
}

bool is_float(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }

Value Value::strings(const std::vector<std::string>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (const auto& s : v) items.push_back(str(s));
  return array(ValueType::STRING, std::move(items));
}

Value Value::floats(const std::vector<float>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (float x : v) items.push_back(f32(x));
  return array(ValueType::F32, std::move(items));
}

Value Value::ints(const std::vector<int32_t>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (int32_t x : v) items.push_back(i32(x));
  return array(ValueType::I32, std::move(items));
}

std::string Value::to_string(size_t max_items) const {
  switch (type) {
    case ValueType::STRING: {
      std::string out = "\"";
      for (char c : s.substr(0, 200)) {
        if (c == '\n') out += "\\n";
        else if (c == '"') out += "\\\"";
        else out += c;
      }
      if (s.size() > 200) out += "...";
      return out + "\"";
    }
    case ValueType::ARRAY: {
      std::string out = fmt::format("[{} x {}: ", arr.size(), value_type_name(elem_type));
      for (size_t k = 0; k < arr.size() && k < max_items; ++k) out += (k ? ", " : "") + arr[k].to_string(max_items);
      if (arr.size() > max_items) out += ", ...";
      return out + "]";
    }
    case ValueType::F32:  // shortest text that reads back as the same float: 1e-05, not 9.99999974e-06
      return fmt::format("{}", static_cast<float>(f));
    case ValueType::F64:
      return fmt::format("{}", f);
    case ValueType::BOOL:
      return i ? "true" : "false";
    case ValueType::U64:
      return fmt::format("{}", u());
    default:
      return fmt::format("{}", i);
  }
}

}  // namespace ember::gguf
