// The key/value cache of one sequence: per layer, K and V rows of n_head_kv * head_dim values
// for each position up to the context size, stored as F32 or F16 (as llama.cpp's default F16
// cache: half the memory and half the bytes attention reads). Allocated once for the whole
// context.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/error.hpp"
#include "tensor/dtype.hpp"

namespace ember {

struct KvCache {
  int64_t n_layer = 0;  // layers of the model
  int64_t n_ctx = 0;
  int64_t row = 0;  // values per position: n_head_kv * head_dim
  DType type = DType::F32;
  AlignedBuffer<uint8_t> k, v;

  // `held` (n_layer entries, or empty: all): the layers whose keys and values live here; the
  // others (a device's attention layers, device/device.hpp) take no memory and have no rows.
  void init(int64_t layers, int64_t ctx, int64_t row_values, DType t = DType::F32,
            const std::vector<char>& held = {}) {
    EMBER_CHECK(t == DType::F32 || t == DType::F16, "KV cache type {} is not supported (f32 or f16)", dtype_name(t));
    EMBER_CHECK(held.empty() || static_cast<int64_t>(held.size()) == layers, "KV cache: {} held flags for {} layers",
                held.size(), layers);
    n_layer = layers;
    n_ctx = ctx;
    row = row_values;
    type = t;
    slot_.clear();
    int64_t n_held = layers;
    if (!held.empty()) {
      n_held = 0;
      for (char h : held) slot_.push_back(h ? n_held++ : -1);
    }
    n_held_ = n_held;
    k = AlignedBuffer<uint8_t>(layer_bytes() * static_cast<size_t>(n_held));
    v = AlignedBuffer<uint8_t>(layer_bytes() * static_cast<size_t>(n_held));
  }
  static size_t value_bytes(DType t) { return t == DType::F16 ? 2 : 4; }
  size_t value_bytes() const { return value_bytes(type); }
  size_t layer_bytes() const { return static_cast<size_t>(n_ctx * row) * value_bytes(); }
  bool holds(int64_t il) const { return slot_.empty() || slot_[static_cast<size_t>(il)] >= 0; }
  uint8_t* k_layer(int64_t il) { return k.data() + static_cast<size_t>(slot(il)) * layer_bytes(); }
  uint8_t* v_layer(int64_t il) { return v.data() + static_cast<size_t>(slot(il)) * layer_bytes(); }
  size_t bytes() const { return bytes_for(n_held_, n_ctx, row, type); }
  // What init(layers, ctx, row_values, t) allocates.
  static size_t bytes_for(int64_t layers, int64_t ctx, int64_t row_values, DType t) {
    return 2 * static_cast<size_t>(layers * ctx * row_values) * value_bytes(t);
  }

 private:
  int64_t slot(int64_t il) const {
    if (slot_.empty()) return il;
    const int64_t s = slot_[static_cast<size_t>(il)];
    EMBER_CHECK(s >= 0, "KV cache: layer {}'s keys and values are held by a device, not here", il);
    return s;
  }
  std::vector<int64_t> slot_;  // per layer: its place, -1 where not held; empty: every layer in order
  int64_t n_held_ = 0;
};

// Parses a KV cache type name: "f32" or "f16".
inline DType parse_kv_type(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "f16") return DType::F16;
  fail("unknown KV cache type '{}' (expected f16 or f32)", name);
}

}  // namespace ember
