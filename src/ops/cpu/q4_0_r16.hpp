// Q4_0 matrices repacked 16 rows at a time (DType::Q4_0_R16), for dense products.
//
// A row-by-row Q4_0 matrix makes a decode kernel load the same activation block once per row
// and keeps its per-block work high (nibble shuffles, a horizontal sum per row). Repacked, 16 rows
// are one contiguous stream and one AVX-512 register holds one 4-weight group of all 16 rows:
// vpdpbusd against the activation's matching 4 bytes broadcast to every lane gives the 16 rows'
// partial dots at once, with no shuffles and no horizontal sums (the lanes are the outputs).
//
// Layout of rows 16g .. 16g + 15 (a "group"), for each 32-element block b in turn, 288 bytes:
//   d[16]      fp16  the 16 rows' scales of block b
//   qs[4][64]  chunk c, bytes 4r .. 4r + 3 = bytes 4c .. 4c + 3 of row r's Q4_0 qs for block b,
//              i.e. elements 4c .. 4c + 3 (low nibbles) and 16 + 4c .. 16 + 4c + 3 (high nibbles)
// A group is 16 rows' worth of Q4_0 bytes, so the matrix keeps its size and row stride, and the
// rows of a group start where row 16g started: row views at multiples of 16 stay valid.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ember::cpu {

constexpr int64_t kR16Rows = 16;

// Whether the repacked layout has a fast kernel at the current SIMD level (AVX-512 VNNI); where it
// has none, repacking would only cost time.
bool q4_0_r16_fast();

// rows x k Q4_0 (rows a multiple of 16, k of 32) from `src` into `dst` (same size, no overlap).
void repack_q4_0_r16(const void* src, int64_t rows, int64_t k, void* dst);
// The inverse: back to plain Q4_0 rows.
void unpack_q4_0_r16(const void* src, int64_t rows, int64_t k, void* dst);

namespace detail {

// The activations the Q4_0_R16 kernels read, one 32-element block at a time: the Q8_0 block's
// scale as float, c = -8 * (sum of its 32 values) (the Q4_0 offset, taken off in integers), and
// its values. Built from the Q8_0 rows quantize_activations() gives, so results match Q4_0's.
struct R16Act {
  float d;
  int32_t c;
  int8_t qs[32];
};
static_assert(sizeof(R16Act) == 40);
inline size_t r16_act_row_bytes(int64_t k) { return static_cast<size_t>(k / 32) * sizeof(R16Act); }
void prepare_r16(const void* q8_0_row, void* out, int64_t k);

}  // namespace detail
}  // namespace ember::cpu
