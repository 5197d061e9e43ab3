// Neuron-major 4-bit down projections with shared scales (DType::Q4_0_NM, Q4_1_NM).
//
// A Q4_0 / Q4_1 down matrix (input-major: output row r holds n_ff values in blocks of 32
// neurons, one fp16 scale d, and for Q4_1 a min m, per block) is transposed for the sparse axpy
// without requantizing: every value keeps its 4-bit code and its block's scale, so the copy is
// the file's matrix bit for bit, in the same number of bytes. (The `exact` Q8_0 copy rounds every
// value a second time and takes 34/18 the bytes.) What makes it possible: the 32 neurons of a
// block share the scale of each output row, so a neuron-major row needs only codes.
//
// Layout of an n_ff x n_embd matrix (n_ff and n_embd multiples of 32):
//   rows:   neuron i at i * n_embd / 2; per 32 outputs 16 bytes, byte k holding output k in its
//           low nibble and output k + 16 in its high nibble (a Q4_0 block's order);
//   tables: after the rows, per neuron block b = i / 32: d[b][0 .. n_embd) as fp16, then for
//           Q4_1 m[b][0 .. n_embd). Value of neuron i at output j: d (q - 8) for Q4_0,
//           d q + m for Q4_1.
//
// The axpy out[j] += sum_i h_i w_ij runs over segments: consecutive list entries with a nonzero
// h, of one neuron block, at most kNm4Segment long (a new segment starts when the block changes).
// Per segment and output j:
//   acc = 0; for each entry in order: acc = fma(h, q', acc)      (q' = q - 8, or q for Q4_1)
//   Q4_1 first: out = fma(m, s, out), s = the entries' h summed in order from 0
//   out = fma(d, acc, out)
// The scalar, AVX2 and AVX-512 kernels all compute exactly this, so they agree bit for bit, and
// a column slice gives the same bits as the whole row. One multiply by the scale per segment
// instead of one per neuron: with several firing neurons in a block (moderate sparsity, hot
// neurons first) that also saves arithmetic.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/thread_pool.hpp"
#include "tensor/tensor_view.hpp"

namespace ember::cpu {

constexpr int kNm4Segment = 8;

inline bool is_nm4(DType t) { return t == DType::Q4_0_NM || t == DType::Q4_1_NM; }
// The neuron-major type of a Q4_0 / Q4_1 down matrix.
DType nm4_type_of(DType down_type);

// fp16 tables of n_embd values per block of 32 neurons: d, and for Q4_1 m.
inline int nm4_tables_per_block(DType t) { return t == DType::Q4_1_NM ? 2 : 1; }
// Bytes of the scale tables, and of the whole matrix (rows and tables).
size_t nm4_table_bytes(DType t, int64_t n_ff, int64_t n_embd);
size_t nm4_bytes(DType t, int64_t n_ff, int64_t n_embd);
// The scale table of neuron block b (d; Q4_1: m follows n_embd values later).
inline const uint16_t* nm4_scales(const TensorView& D, int64_t block) {
  return reinterpret_cast<const uint16_t*>(D.data + static_cast<size_t>(D.rows()) * D.row_stride()) +
         block * nm4_tables_per_block(D.type) * D.cols();
}

// Writes the neuron-major copy of `down` (Q4_0 or Q4_1, ne[0] = n_ff, ne[1] = n_embd) into dst
// (nm4_bytes of it). Threaded over neuron blocks.
void nm4_from_down(ThreadPool& pool, const TensorView& down, uint8_t* dst);

// Row i of D as floats (n_embd values).
void nm4_dequantize_neuron(const TensorView& D, int64_t i, float* dst);

// out[0 .. len) += the segments' sums for outputs [col0, col0 + len) (col0, len multiples of 32),
// one token: h[k] is the factor of neuron rows[k]. Dispatches to the best kernel for the SIMD
// level.
void nm4_axpy(const TensorView& D, const int32_t* rows, const float* h, int64_t n, int64_t col0, int64_t len,
              float* out);

namespace detail {

using Nm4AxpyFn = void (*)(const TensorView& D, const int32_t* rows, const float* h, int64_t n, int64_t col0,
                           int64_t len, float* out);
void nm4_axpy_scalar(const TensorView& D, const int32_t* rows, const float* h, int64_t n, int64_t col0, int64_t len,
                     float* out);
Nm4AxpyFn nm4_axpy_avx2(DType t);
Nm4AxpyFn nm4_axpy_avx512(DType t);

// Calls f(ids, hs, count, block, next) for every segment in list order; `next` is the list
// position after the segment (for prefetching).
template <class F>
inline void nm4_segments(const int32_t* rows, const float* h, int64_t n, F&& f) {
  int32_t ids[kNm4Segment];
  float hs[kNm4Segment];
  int c = 0;
  int64_t block = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (h[i] == 0.0f) continue;
    const int64_t b = rows[i] / 32;
    if (c == kNm4Segment || (c > 0 && b != block)) {
      f(ids, hs, c, block, i);
      c = 0;
    }
    block = b;
    ids[c] = rows[i];
    hs[c] = h[i];
    ++c;
  }
  if (c > 0) f(ids, hs, c, block, n);
}

// The sum of a segment's factors, in order from 0 (Q4_1's min term).
inline float nm4_factor_sum(const float* hs, int c) {
  float s = 0.0f;
  for (int r = 0; r < c; ++r) s += hs[r];
  return s;
}

}  // namespace detail
}  // namespace ember::cpu
