// Internal: the kernels of the 16-row repacked types (r16/r16.hpp), called by
// matmul.cpp. All take nrows a multiple of 16 (rows w_stride bytes apart, so group g starts at
// w + 16 g w_stride). Q4_0_R16, Q4_1_R16, Q5_0_R16 and Q8_0_R16 take R16Act activation rows, the
// K-quants plain Q8_K rows.
#pragma once
#include "core/error.hpp"
#include "ops/cpu/gemm/gemm_kernels.hpp"
#include "ops/cpu/r16/r16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {

// Where things are in a group's block of each 16-row layout (r16/r16.hpp), for every ISA's kernels.
// Q4_0_R16 / Q4_1_R16 / Q5_0_R16: d[16] (then m[16] or qh[16][4]), then qs[4][64].
// Q5_0_R16 / Q5_K_R16's fifth bits: a row's 4-byte word per block (Q5_0) or sub-block (Q5_K),
// the bit of the byte at position i of chunk c's 4 bytes (its low nibble: s = 0, element 4c + i;
// its high nibble: s = 1, element 16 + 4c + i) is bit r16_qh_bit(c, s) of byte i: a chunk's bits
// sit at one position in all four bytes, so one shift brings them under a nibble's bit 4.
constexpr int r16_qh_bit(int c, int s) { return 2 * c + s; }
constexpr size_t r16_q4_block_bytes(bool min, bool qh) { return min ? 320 : qh ? 352 : 288; }
// Q8_0_R16: d[16], then qs[8][64].
constexpr size_t kR16Q8BlockBytes = 544, kR16Q8QsAt = 32;
// Q6_K_R16: d[16], sc[16][16], then 16 sub-blocks of 192 bytes.
constexpr size_t kR16Q6KBlockBytes = 3360, kR16Q6KScalesAt = 32, kR16Q6KSubBlocksAt = 288, kR16Q6KSubBlockBytes = 192;
// Q4_K_R16 / Q5_K_R16: d[16], dmin[16], lo[8][16], hi[4][16], then 8 sub-blocks (Q5_K: each its qh
// in front of its nibbles).
constexpr size_t kR16Q4KLoAt = 64, kR16Q4KHiAt = 64 + 128, kR16Q4KQhAt = 256;
constexpr size_t r16_q4k_block_bytes(bool qh) { return qh ? 2816 : 2304; }
constexpr size_t r16_q4k_sub_blocks_at(bool qh) { return qh ? 256 + 64 : 256; }
constexpr size_t r16_q4k_sub_block_bytes(bool qh) { return qh ? 320 : 256; }

// rows x k Q6_K (rows a multiple of 16, k of 256) into Q6_K_R16 (repack_r16 dispatches here).
void repack_q6_k_r16(const void* src, int64_t rows, int64_t k, void* dst);
void repack_q6_k_r16_rows(const void* src, int64_t rows, int64_t k, void* dst);  // row by row: the reference
// The same for Q4_K into Q4_K_R16 and Q5_K into Q5_K_R16.
void repack_q4_k_r16(const void* src, int64_t rows, int64_t k, void* dst);
void repack_q5_k_r16(const void* src, int64_t rows, int64_t k, void* dst);
// The same bytes row by row (the references for the 16-row code).
void repack_q4_k_r16_rows(const void* src, int64_t rows, int64_t k, void* dst);
void repack_q5_k_r16_rows(const void* src, int64_t rows, int64_t k, void* dst);
// Q4_0, Q4_1 and Q5_0 into their 16-row types and back (q4_q5_r16.cpp).
void repack_q4_0_r16(const void* src, int64_t rows, int64_t k, void* dst);
void repack_q4_1_r16(const void* src, int64_t rows, int64_t k, void* dst);
void repack_q5_0_r16(const void* src, int64_t rows, int64_t k, void* dst);
void unpack_q4_0_r16(const void* src, int64_t rows, int64_t k, void* dst);
void unpack_q4_1_r16(const void* src, int64_t rows, int64_t k, void* dst);
void unpack_q5_0_r16(const void* src, int64_t rows, int64_t k, void* dst);
// Q8_0 into Q8_0_R16 and back.
void repack_q8_0_r16(const void* src, int64_t rows, int64_t k, void* dst);
void unpack_q8_0_r16(const void* src, int64_t rows, int64_t k, void* dst);

void gemm_q4_0_r16_scalar(const GemmArgs& a);
void gemm_q4_0_r16_avx2(const GemmArgs& a);
void gemm_q4_0_r16_avxvnni(const GemmArgs& a);
void gemm_q4_0_r16_avx512(const GemmArgs& a);
void gemm_q4_1_r16_scalar(const GemmArgs& a);
void gemm_q4_1_r16_avx2(const GemmArgs& a);
void gemm_q4_1_r16_avxvnni(const GemmArgs& a);
void gemm_q4_1_r16_avx512(const GemmArgs& a);
void gemm_q5_0_r16_scalar(const GemmArgs& a);
void gemm_q5_0_r16_avx2(const GemmArgs& a);
void gemm_q5_0_r16_avxvnni(const GemmArgs& a);
void gemm_q5_0_r16_avx512(const GemmArgs& a);
void gemm_q8_0_r16_scalar(const GemmArgs& a);
void gemm_q8_0_r16_avx2(const GemmArgs& a);
void gemm_q8_0_r16_avxvnni(const GemmArgs& a);
void gemm_q8_0_r16_avx512(const GemmArgs& a);
void gemm_q6_k_r16_scalar(const GemmArgs& a);
void gemm_q6_k_r16_avx2(const GemmArgs& a);
void gemm_q6_k_r16_avxvnni(const GemmArgs& a);
void gemm_q6_k_r16_avx512(const GemmArgs& a);
void gemm_q4_k_r16_scalar(const GemmArgs& a);
void gemm_q4_k_r16_avx2(const GemmArgs& a);
void gemm_q4_k_r16_avxvnni(const GemmArgs& a);
void gemm_q4_k_r16_avx512(const GemmArgs& a);
void gemm_q5_k_r16_scalar(const GemmArgs& a);
void gemm_q5_k_r16_avx2(const GemmArgs& a);
void gemm_q5_k_r16_avxvnni(const GemmArgs& a);
void gemm_q5_k_r16_avx512(const GemmArgs& a);

// Runs K::tile<T>(a, group, first token) over every 16-row group and the tokens in tiles of
// eight where the kernel says they pay (K::kTile8: the weights' unpacking shared by twice the
// tokens, against the sums' registers), then of four, then one tile of the 1..3 left; a kernel
// with K::prepare_group(a, group) has it called first for each group, on the same thread as the
// group's tiles (for what they all share). A token's sums do not depend on its tile.
template <class K>
void run_r16_tiles(const GemmArgs& a) {
  for (int64_t g = 0; g < a.nrows / kR16Rows; ++g) {
    if constexpr (requires { K::prepare_group(a, g); }) K::prepare_group(a, g);
    int64_t t = 0;
    if constexpr (requires { K::kTile8; })
      if constexpr (K::kTile8)
        for (; t + 8 <= a.ntok; t += 8) K::template tile<8>(a, g, t);
    for (; t + 4 <= a.ntok; t += 4) K::template tile<4>(a, g, t);
    switch (a.ntok - t) {
      case 3: K::template tile<3>(a, g, t); break;
      case 2: K::template tile<2>(a, g, t); break;
      case 1: K::template tile<1>(a, g, t); break;
      default: break;
    }
  }
}

// Repacking a K-quant (`name`: its repacked type): checks the shape, then f(g, b, nb) for every
// group g of 16 rows and super-block b of the nb per row.
template <class F>
void for_each_k_group_block(const char* name, int64_t rows, int64_t k, const F& f) {
  EMBER_CHECK(rows > 0 && rows % kR16Rows == 0 && k > 0 && k % kQK_K == 0,
              "{} repacking needs a multiple of 16 rows and of 256 columns, got {} x {}", name, rows, k);
  const int64_t nb = k / kQK_K;
  for (int64_t g = 0; g < rows / kR16Rows; ++g)
    for (int64_t b = 0; b < nb; ++b) f(g, b, nb);
}

// The frame of the scalar reference kernels: y[t][16 g + r] = acc after acc = block(p, x, r, acc)
// over the blocks of kBlock elements (p: the group's block, kGroupBytes bytes; x: the token's
// activation block of type Act), starting from 0.
template <class Act, int64_t kBlock, size_t kGroupBytes, class F>
void r16_scalar(const GemmArgs& a, const F& block) {
  const int64_t nb = a.k / kBlock;
  for (int64_t g = 0; g < a.nrows / kR16Rows; ++g) {
    const uint8_t* wg = a.w + g * kR16Rows * a.w_stride;
    for (int64_t t = 0; t < a.ntok; ++t) {
      const auto* x = reinterpret_cast<const Act*>(a.x + t * a.x_stride);
      for (int r = 0; r < kR16Rows; ++r) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) acc = block(wg + b * kGroupBytes, x[b], r, acc);
        a.y[t * a.y_stride + g * kR16Rows + r] = acc;
      }
    }
  }
}

}  // namespace ember::cpu::detail
