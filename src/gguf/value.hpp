// GGUF metadata values: every scalar type, strings, and (nested) arrays.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ember::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);
bool is_integer(ValueType t);
bool is_float(ValueType t);
// Whether an array of t keeps its elements packed (numbers and bools), and the bytes of one.
bool is_packed_scalar(ValueType t);
size_t packed_size(ValueType t);
struct Value;
// Appends scalar e's bytes, as a file stores them, to an array's packed elements.
void pack_scalar(std::string& packed, const Value& e);

struct Value {
  ValueType type = ValueType::U32;
  // Scalars: integers are held in `i` (U64 values above INT64_MAX wrap; `u()` returns them
  // unchanged), floats in `f`, bools in `i`.
  int64_t i = 0;
  double f = 0;
  // Strings; and for an array of scalars (numbers, bools) read from a file or made by floats() /
  // ints(), its elements packed as the file stores them (a long array costs its bytes, not a
  // Value each: a prepared 7B file's per-neuron arrays are 458,752 entries).
  std::string s;
  ValueType elem_type = ValueType::U8;  // for arrays
  std::vector<Value> arr;               // elements of other arrays (and of arrays built with array())

  // An array's length and its element k, wherever they are kept.
  size_t length() const;
  Value at(size_t k) const;

  uint64_t u() const { return static_cast<uint64_t>(i); }

  static Value make_int(ValueType t, int64_t v) { Value x; x.type = t; x.i = v; return x; }
  static Value u32(uint32_t v) { return make_int(ValueType::U32, v); }
  static Value i32(int32_t v) { return make_int(ValueType::I32, v); }
  static Value u64(uint64_t v) { return make_int(ValueType::U64, static_cast<int64_t>(v)); }
  static Value boolean(bool v) { return make_int(ValueType::BOOL, v ? 1 : 0); }
  static Value f32(float v) { Value x; x.type = ValueType::F32; x.f = v; return x; }
  static Value f64(double v) { Value x; x.type = ValueType::F64; x.f = v; return x; }
  static Value str(std::string v) { Value x; x.type = ValueType::STRING; x.s = std::move(v); return x; }
  static Value array(ValueType elem, std::vector<Value> items) {
    Value x; x.type = ValueType::ARRAY; x.elem_type = elem; x.arr = std::move(items); return x;
  }
  static Value strings(const std::vector<std::string>& v);
  static Value floats(const std::vector<float>& v);
  static Value ints(const std::vector<int32_t>& v);

  // Human-readable rendering (arrays abbreviated after `max_items`).
  std::string to_string(size_t max_items = 8) const;
};

}  // namespace ember::gguf
