#include "gguf/value.hpp"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

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

bool is_packed_scalar(ValueType t) { return is_integer(t) || is_float(t) || t == ValueType::BOOL; }

size_t packed_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    default: return 8;
  }
}

namespace {
template <class T>
T packed_at(const std::string& s, size_t k) {
  T x;
  std::memcpy(&x, s.data() + k * sizeof(T), sizeof(T));
  return x;
}
template <class T>
void pack(std::string& s, T x) {
  s.append(reinterpret_cast<const char*>(&x), sizeof(T));
}
}  // namespace

size_t Value::length() const {
  if (!arr.empty() || !is_packed_scalar(elem_type)) return arr.size();
  return s.size() / packed_size(elem_type);
}

Value Value::at(size_t k) const {
  if (!arr.empty() || !is_packed_scalar(elem_type)) return arr.at(k);
  if (k >= length()) throw std::out_of_range("gguf array index");
  switch (elem_type) {
    case ValueType::U8: return make_int(elem_type, packed_at<uint8_t>(s, k));
    case ValueType::I8: return make_int(elem_type, packed_at<int8_t>(s, k));
    case ValueType::U16: return make_int(elem_type, packed_at<uint16_t>(s, k));
    case ValueType::I16: return make_int(elem_type, packed_at<int16_t>(s, k));
    case ValueType::U32: return make_int(elem_type, packed_at<uint32_t>(s, k));
    case ValueType::I32: return make_int(elem_type, packed_at<int32_t>(s, k));
    case ValueType::U64: return make_int(elem_type, static_cast<int64_t>(packed_at<uint64_t>(s, k)));
    case ValueType::I64: return make_int(elem_type, packed_at<int64_t>(s, k));
    case ValueType::BOOL: return make_int(elem_type, packed_at<uint8_t>(s, k));
    case ValueType::F32: return f32(packed_at<float>(s, k));
    default: return f64(packed_at<double>(s, k));
  }
}

void pack_scalar(std::string& s, const Value& e) {
  switch (e.type) {
    case ValueType::U8: case ValueType::BOOL: pack(s, static_cast<uint8_t>(e.i)); break;
    case ValueType::I8: pack(s, static_cast<int8_t>(e.i)); break;
    case ValueType::U16: pack(s, static_cast<uint16_t>(e.i)); break;
    case ValueType::I16: pack(s, static_cast<int16_t>(e.i)); break;
    case ValueType::U32: pack(s, static_cast<uint32_t>(e.i)); break;
    case ValueType::I32: pack(s, static_cast<int32_t>(e.i)); break;
    case ValueType::U64: pack(s, e.u()); break;
    case ValueType::I64: pack(s, e.i); break;
    case ValueType::F32: pack(s, static_cast<float>(e.f)); break;
    case ValueType::F64: pack(s, e.f); break;
    default: break;
  }
}

Value Value::strings(const std::vector<std::string>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (const auto& s : v) items.push_back(str(s));
  return array(ValueType::STRING, std::move(items));
}

Value Value::floats(const std::vector<float>& v) {
  Value x = array(ValueType::F32, {});
  x.s.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return x;
}

Value Value::ints(const std::vector<int32_t>& v) {
  Value x = array(ValueType::I32, {});
  x.s.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
  return x;
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
      std::string out = fmt::format("[{} x {}: ", length(), value_type_name(elem_type));
      for (size_t k = 0; k < length() && k < max_items; ++k) out += (k ? ", " : "") + at(k).to_string(max_items);
      if (length() > max_items) out += ", ...";
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
