// The key/value cache of one sequence: per layer, K and V rows of n_head_kv * head_dim values
// for each position up to the context size, stored as F32 or F16 (as llama.cpp's default F16
// cache: half the memory and half the bytes attention reads). Allocated once for the whole
// context.
#pragma once
#include <cstdint>
#include <string>

#include "core/aligned_buffer.hpp"
#include "core/error.hpp"
#include "tensor/dtype.hpp"

namespace ember {

struct KvCache {
  int64_t n_layer = 0;
  int64_t n_ctx = 0;
  int64_t row = 0;  // values per position: n_head_kv * head_dim
  DType type = DType::F32;
  AlignedBuffer<uint8_t> k, v;

  void init(int64_t layers, int64_t ctx, int64_t row_values, DType t = DType::F32) {
    EMBER_CHECK(t == DType::F32 || t == DType::F16, "KV cache type {} is not supported (f32 or f16)", dtype_name(t));
    n_layer = layers;
    n_ctx = ctx;
    row = row_values;
    type = t;
    k.resize(layer_bytes() * static_cast<size_t>(layers));
    v.resize(layer_bytes() * static_cast<size_t>(layers));
  }
  static size_t value_bytes(DType t) { return t == DType::F16 ? 2 : 4; }
  size_t value_bytes() const { return value_bytes(type); }
  size_t layer_bytes() const { return static_cast<size_t>(n_ctx * row) * value_bytes(); }
  uint8_t* k_layer(int64_t il) { return k.data() + static_cast<size_t>(il) * layer_bytes(); }
  uint8_t* v_layer(int64_t il) { return v.data() + static_cast<size_t>(il) * layer_bytes(); }
  size_t bytes() const { return bytes_for(n_layer, n_ctx, row, type); }
  // What init(layers, ctx, row_values, t) allocates.
  static size_t bytes_for(int64_t layers, int64_t ctx, int64_t row_values, DType t) {
    return 2 * static_cast<size_t>(layers * ctx * row_values) * value_bytes(t);
  }
};

// Parses a KV cache type name: "f32" or "f16".
inline DType parse_kv_type(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "f16") return DType::F16;
  fail("unknown KV cache type '{}' (expected f16 or f32)", name);
}

}  // namespace ember
