// The key/value cache of one sequence: per layer, K and V rows of n_head_kv * head_dim floats
// for each position up to the context size. Allocated once for the whole context.
#pragma once
#include <cstdint>

#include "core/aligned_buffer.hpp"

namespace ember {

struct KvCache {
  int64_t n_layer = 0;
  int64_t n_ctx = 0;
  int64_t row = 0;  // floats per position: n_head_kv * head_dim
  AlignedBuffer<float> k, v;

  void init(int64_t layers, int64_t ctx, int64_t row_floats) {
    n_layer = layers;
    n_ctx = ctx;
    row = row_floats;
    k.resize(static_cast<size_t>(layers * ctx * row_floats));
    v.resize(static_cast<size_t>(layers * ctx * row_floats));
  }
  float* k_layer(int64_t il) { return k.data() + il * n_ctx * row; }
  float* v_layer(int64_t il) { return v.data() + il * n_ctx * row; }
  size_t bytes() const { return 2 * static_cast<size_t>(n_layer * n_ctx * row) * sizeof(float); }
};

}  // namespace ember
