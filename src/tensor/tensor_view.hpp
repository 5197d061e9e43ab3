// A non-owning view of a tensor's bytes (usually inside the mmap'd model file).
// ne[0] is the contiguous (innermost) dimension, as in GGUF. A weight matrix used as
// y = W x has ne[0] = input size (k) and ne[1] = output rows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/dtype.hpp"

namespace ember {

struct TensorView {
  std::string name;
  DType type = DType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  const uint8_t* data = nullptr;
  size_t nbytes = 0;  // of the tensor's own rows (rows() x row_bytes), also when they are interleaved
  // Bytes from the start of one row to the next: 0 for rows stored one after the other
  // (row_bytes(type, ne[0]) apart). More where a matrix's rows are interleaved with other
  // matrices' (model/repack.cpp bundles each FFN neuron's up and down rows, and its gate row
  // where the gate is gathered, so that a neuron's rows are one contiguous read).
  size_t stride = 0;

  int64_t cols() const { return ne[0]; }
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  size_t row_stride() const { return stride ? stride : row_bytes(type, ne[0]); }
  // Bytes of one row's own data (what a copy of the row takes; row_stride() may be more).
  size_t row_size() const { return row_bytes(type, ne[0]); }
  bool contiguous() const { return stride == 0 || stride == row_bytes(type, ne[0]); }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_stride(); }
  // Bytes from data to the end of the last row: the address range the rows lie in (nbytes where
  // they are contiguous; with other matrices' rows between them where interleaved).
  size_t span_bytes() const {
    return rows() > 0 ? static_cast<size_t>(rows() - 1) * row_stride() + row_size() : 0;
  }
  bool valid() const { return data != nullptr; }
};

// A 2-D view of `rows` rows of `cols` elements of type t stored contiguously at `data`.
inline TensorView matrix_view(DType t, const void* data, int64_t rows, int64_t cols) {
  TensorView v;
  v.type = t;
  v.n_dims = 2;
  v.ne[0] = cols;
  v.ne[1] = rows;
  v.data = static_cast<const uint8_t*>(data);
  v.nbytes = row_bytes(t, cols) * static_cast<size_t>(rows);
  return v;
}

}  // namespace ember
