// Neuron-major 4-bit down projections with shared scales (DType::Q4_0_NM, Q4_1_NM).
//
// A Q4_0 / Q4_1 down matrix (input-major: output row r holds n_ff values in blocks of 32
// neurons, one fp16 scale d, and for Q4_1 a min m, per block) is transposed for the sparse axpy
// without requantizing: every value keeps its 4-bit code and its block's scale, so the copy is
// the file's matrix bit for bit, in the same number of bytes. (The `exact` Q8_0 copy rounds every
// value a second time and takes 34/18 the bytes.) What makes it possible: the 32 neurons of a
// block share the scale of each output row, so a neuron-major row needs only codes.
// A Q4_K matrix becomes Q4_1_NM the same way: each sub-block of 32 neurons has, per output row,
// x = (d sc) q - (dmin m) with 6-bit sc and m, which is Q4_1's d' q + m' with d' = d sc and
// m' = -dmin m; the codes are kept and d', m' are rounded to fp16 (relative error at most 2^-11,
// against the code step's 1/15 of the range), in 5 bits per value against the file's 4.5 (Q8_0:
// 8.5).
//
// Layout of an n_ff x n_embd matrix (n_ff and n_embd multiples of 32):
//   rows:   neuron i at i * n_embd / 2, in chunks of 128 outputs (a row's last chunks, where
//           n_embd is not a multiple of 128, are 64 and / or 32 wide: nm4_chunk_at). A chunk of
//           width W takes W / 2 bytes in W / 32 lanes of 16 bytes; byte 16 L + 4 m + k (m, k < 4)
//           holds in its low nibble output m W / 8 + 4 L + k of the chunk, and in its high nibble
//           that output plus W / 2 (nm4_code_position). The order is chosen so that interleaving
//           the bytes of four rows lane by lane (vpunpck{l,h}bw, then vpunpck{l,h}wd) yields per
//           32-bit lane the four rows' codes of one output, with the outputs in order: what
//           vpdpbusd multiplies by four factors and sums. A 32-wide chunk is a Q4_0 block's order.
//   tables: after the rows, per neuron block b = i / 32: d[b][0 .. n_embd) as fp16, then for
//           Q4_1 m[b][0 .. n_embd). Value of neuron i at output j: d (q - 8) for Q4_0,
//           d q + m for Q4_1.
//   Q4_0_NM8 / Q4_1_NM8 (narrow tables): the same rows; per neuron block, each table (d, then
//           for Q4_1 m) as n_embd u8 codes, then each table's fp16 (scale, base) pairs, one per
//           32 outputs (kNm8Group): value = code x scale + base (nm4_narrow_table: base = the
//           group's least value, scale = its range / 255). 9 bytes per 8 entries where fp16 takes
//           16: a kept row with its share of the tables reads 9 % fewer bytes where half a
//           block's rows are kept, 15 % where a quarter are. Not the file's values: each moves
//           by at most half a step, 1/510 of its group's range (and the fp16 rounding of the
//           base), against the 4-bit code's step of 1/15 of its block's range (`--sparse-down
//           compact`; on SmolLM2's tables symmetric int8 codes, 127 steps of the largest
//           magnitude, added 8x the noise: docs/agreement.md).
// (A chunk-major layout, each chunk's rows in one region, read front to back, was measured and
// dropped: about 1.05x faster with every row kept, about 2x slower with half of them kept at random, on
// Zen 4, bench_sparse's SparseAxpy.)
//
// The axpy out[j] += sum_i h_i w_ij runs over segments: consecutive list entries with a nonzero
// h, of one neuron block, at most kNm4Segment long (a new segment starts when the block changes).
// A segment's factors are rounded to int8 with one scale, hq = round(h / e), e = max |h| / 127
// (nm4_quantize_factors: as the dense kernels round activations to Q8_0 blocks of 32, but over
// at most 16 values, so no coarser). Per segment and output j:
//   acc = sum over the entries of hq * q'        (exact, in integers; q' = q - 8, or q for Q4_1)
//   Q4_1 first: out = fma(m, s, out), s = the entries' h (unrounded) summed in order from 0
//   out = fma(d * e, float(acc), out)
// With narrow tables (d = dc ds + db, m = mc ms + mb: codes and their group's scale and base)
// the group's scale and base are taken into the segment's factors first, once per group of 32
// outputs (the scalar kernel: per output):
//   Q4_1 first: out = out + fma(float(mc), ms * s, mb * s)
//   out = fma(fma(float(dc), ds * e, db * e), float(acc), out)
// The SIMD kernels take a segment's rows four at a time (the last four padded with a factor of
// 0) and sum each output's four products into 32 bits with vpdpbusd (AVX2 without VNNI: two at a
// time, vpmaddubsw's sums added in 16 bits over the segment and widened once: the same integers).
// The scalar, AVX2, AVX-VNNI and AVX-512 kernels all compute exactly this, so they agree bit for bit, and a
// column slice (starting at a chunk) gives the same bits as the whole row. One multiply by the
// scale per segment instead of one per neuron.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/thread_pool.hpp"
#include "ops/cpu/kernel_table.hpp"
#include "tensor/tensor_view.hpp"

namespace ember::cpu {

constexpr int64_t kNm4Block = 32;  // neurons sharing a scale table
// Listed neurons of one block whose factors share an int8 scale (a segment). 32, a whole block,
// measured 1.5x the copies' own KL divergence on SmolLM2 (docs/agreement.md).
constexpr int kNm4Segment = 16;
constexpr int64_t kNm4Chunk = 128;  // column slices of the axpy start at multiples of this

// The chunk holding output j of an n_embd-wide matrix: its first output and width.
struct Nm4Chunk {
  int64_t start, width;
};
Nm4Chunk nm4_chunk_at(int64_t n_embd, int64_t j);
// Where the code of output j lies in a row's bytes of its chunk: byte and nibble shift (0, 4).
struct Nm4Position {
  int64_t byte;
  int shift;
};
Nm4Position nm4_code_position(int64_t n_embd, int64_t j);

constexpr int64_t kNm8Group = 32;  // outputs sharing one fp16 scale and base of a narrow table

inline bool is_nm4(DType t) {
  return t == DType::Q4_0_NM || t == DType::Q4_1_NM || t == DType::Q4_0_NM8 || t == DType::Q4_1_NM8;
}
inline bool nm4_has_min(DType t) { return t == DType::Q4_1_NM || t == DType::Q4_1_NM8; }
inline bool nm4_narrow(DType t) { return t == DType::Q4_0_NM8 || t == DType::Q4_1_NM8; }
// The neuron-major type of a Q4_0 / Q4_1 / Q4_K down matrix, with fp16 or (narrow) 8-bit tables.
DType nm4_type_of(DType down_type, bool narrow = false);

// Tables of n_embd values per block of 32 neurons: d, and for Q4_1 m.
inline int nm4_tables_per_block(DType t) { return nm4_has_min(t) ? 2 : 1; }
// Bytes of one neuron block's tables, of all of them, and of the whole matrix (rows and tables).
size_t nm4_block_table_bytes(DType t, int64_t n_embd);
size_t nm4_table_bytes(DType t, int64_t n_ff, int64_t n_embd);
size_t nm4_bytes(DType t, int64_t n_ff, int64_t n_embd);
// Row i's codes, and the tables of neuron block b.
inline const uint8_t* nm4_row(const TensorView& D, int64_t i) {
  return D.data + static_cast<size_t>(i) * static_cast<size_t>(D.cols() / 2);
}
inline const uint8_t* nm4_block_tables(const TensorView& D, int64_t block) {
  return nm4_row(D, D.rows()) + static_cast<size_t>(block) * nm4_block_table_bytes(D.type, D.cols());
}
// fp16 tables (Q4_0_NM / Q4_1_NM): d[0 .. n_embd), for Q4_1 then m[0 .. n_embd).
inline const uint16_t* nm4_scales(const TensorView& D, int64_t block) {
  return reinterpret_cast<const uint16_t*>(nm4_block_tables(D, block));
}
// Narrow tables: the codes (d's, then m's), and the groups' fp16 (scale, base) pairs (d's, then
// m's: the pair of table k's group g at 2 (k n_embd / kNm8Group + g)).
inline const uint8_t* nm4_codes8(const TensorView& D, int64_t block) { return nm4_block_tables(D, block); }
inline const uint16_t* nm4_group_scales(const TensorView& D, int64_t block) {
  return reinterpret_cast<const uint16_t*>(nm4_block_tables(D, block) + nm4_tables_per_block(D.type) * D.cols());
}
// A narrow table of n values (n a multiple of kNm8Group): per group, base = fp16(least value),
// scale = fp16((greatest - base) / 255), code = round((v - base) / scale) in [0, 255] (0 where the
// scale is 0).
void nm4_narrow_table(const float* v, int64_t n, uint8_t* codes, uint16_t* scale_base);

// The scale d (min m for `min`) of neuron i at output j, as a float.
float nm4_table_value(const TensorView& D, int64_t i, int64_t j, bool min);

// Writes the neuron-major copy of type t (nm4_type_of(down.type), narrow or not) of `down` (Q4_0,
// Q4_1 or Q4_K, ne[0] = n_ff, ne[1] = n_embd) into dst (nm4_bytes of it). Threaded over neuron
// blocks.
void nm4_from_down(ThreadPool& pool, const TensorView& down, DType t, uint8_t* dst);

// Row i of D as floats (n_embd values).
void nm4_dequantize_neuron(const TensorView& D, int64_t i, float* dst);

// out[0 .. len) += the segments' sums for outputs [col0, col0 + len) (col0 a multiple of
// kNm4Chunk; col0 + len one too, or the row's end), one token: h[k] is the factor of neuron
// rows[k]. Dispatches to the best kernel for the SIMD level.
void nm4_axpy(const TensorView& D, const int32_t* rows, const float* h, int64_t n, int64_t col0, int64_t len,
              float* out);

namespace detail {

// Calls f(ids, hs, count, block, next) for every segment in list order; `next` is the list
// position after the segment.
template <class F>
inline void nm4_segments(const int32_t* rows, const float* h, int64_t n, F&& f) {
  int32_t ids[kNm4Segment];
  float hs[kNm4Segment];
  int c = 0;
  int64_t block = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (h[i] == 0.0f) continue;
    const int64_t b = rows[i] / kNm4Block;
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

// A segment's factors rounded to int8 (see the top of the file), the sum of the rounded ones
// (Q4_0's offset of 8 is taken off as 8 x that sum) and of the unrounded ones, in order from 0
// (Q4_1's min term). q[c] .. q[kNm4Segment) are 0.
struct Nm4Factors {
  int8_t q[kNm4Segment];
  float scale;
  int32_t q_sum;
  float sum;
};
inline Nm4Factors nm4_quantize_factors(const float* hs, int c) {
  Nm4Factors f{};
  float amax = 0.0f;
  for (int r = 0; r < c; ++r) amax = std::max(amax, std::fabs(hs[r]));
  f.scale = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int r = 0; r < c; ++r) {
    const int v = static_cast<int>(std::nearbyint(hs[r] * inv));
    f.q[r] = static_cast<int8_t>(std::clamp(v, -127, 127));
    f.q_sum += f.q[r];
    f.sum += hs[r];
  }
  return f;
}

// A segment as every kernel takes it, prepared once per call (the same for every chunk): its
// neurons in fours (the last four padded with the last neuron and factors of 0), each four's
// factors as a 32-bit lane (the first's in the low byte), and the per-output constants.
struct Nm4Seg {
  int32_t ids[kNm4Segment];
  int32_t quad_f[kNm4Segment / 4];
  int32_t quads;
  int32_t offset;  // Q4_0: 8 x the rounded factors' sum
  float scale;     // the factors' scale e
  float sum;       // Q4_1: the unrounded factors' sum
  int64_t block;
  int8_t q[kNm4Segment];  // the rounded factors (the scalar kernel's)
  int32_t count;
};
void nm4_prepare_segments(const int32_t* rows, const float* h, int64_t n, std::vector<Nm4Seg>& segs);

// One neuron block's tables as every kernel reads them (the layout above): fp16 d (and m) per
// output, or narrow, u8 codes per output and an fp16 (scale, base) pair per kNm8Group outputs. Indexed by
// output.
struct Nm4Tables {
  const uint16_t* d = nullptr;
  const uint16_t* m = nullptr;
  const uint8_t* dc = nullptr;
  const uint8_t* mc = nullptr;
  const uint16_t* dsb = nullptr;
  const uint16_t* msb = nullptr;
};
inline Nm4Tables nm4_tables(const TensorView& D, int64_t block) {
  Nm4Tables t;
  const int64_t n = D.cols();
  const bool min = nm4_has_min(D.type);  // else no m table: nullptr
  if (nm4_narrow(D.type)) {
    t.dc = nm4_codes8(D, block);
    t.dsb = nm4_group_scales(D, block);
    if (min) t.mc = t.dc + n, t.msb = t.dsb + 2 * (n / kNm8Group);
  } else {
    t.d = nm4_scales(D, block);
    if (min) t.m = t.d + n;
  }
  return t;
}

using Nm4AxpyFn = void (*)(const TensorView& D, const Nm4Seg* segs, int64_t n_segs, int64_t col0, int64_t len,
                           float* out);
void nm4_axpy_scalar(const TensorView& D, const Nm4Seg* segs, int64_t n_segs, int64_t col0, int64_t len, float* out);
// The kernels by type and ISA (kernel_table.hpp): scalar for every shared-scale type, filled in
// by nm4/nm4.cpp, nm4/nm4_avx2.cpp, nm4/nm4_avxvnni.cpp and nm4/nm4_avx512.cpp; nm4_axpy asks the table.
// The four copy types' kernels of one level: Q4_0_NM, Q4_1_NM, Q4_0_NM8, Q4_1_NM8 in that order.
void add_nm4_axpys(KernelTable<Nm4AxpyFn>& t, SimdLevel level, const std::array<Nm4AxpyFn, 4>& fns);
void add_nm4_axpy_avx2(KernelTable<Nm4AxpyFn>& t);
void add_nm4_axpy_avx_vnni(KernelTable<Nm4AxpyFn>& t);
void add_nm4_axpy_avx512(KernelTable<Nm4AxpyFn>& t);
const KernelTable<Nm4AxpyFn>& nm4_axpy_table();  // filled once (nm4/nm4.cpp)

}  // namespace detail
}  // namespace ember::cpu
