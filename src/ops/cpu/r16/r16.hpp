// Matrices repacked 16 rows at a time (DType::Q4_0_R16, Q4_1_R16, Q5_0_R16, Q8_0_R16, Q4_K_R16,
// Q5_K_R16, Q6_K_R16), for dense products.
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
// Q4_1_R16 is the same with the 16 rows' mins m[16] (fp16) after d: 320 bytes per block.
// Q5_0_R16 is Q4_0_R16 with the fifth bits after d, 352 bytes per block: qh[16][4], byte i of row
// r holds the fifth bits of elements 4c + i (bit 2c) and 16 + 4c + i (bit 2c + 1) for c = 0..3,
// the bits of chunk c's nibbles at byte i (r16_qh_bit in r16_kernels.hpp).
// Q8_0_R16, 544 bytes per block: d[16] (fp16), then qs[8][64]: chunk c, bytes 4r .. 4r + 3 =
// elements 4c .. 4c + 3 of row r, stored as unsigned w + 128 (the offset taken off in integers,
// as for Q4_0), so a 64-byte load is one vpdpbusd operand as it stands.
// A group is 16 rows' worth of Q4_0 (Q4_1) bytes, so the matrix keeps its size and row stride, and the
// rows of a group start where row 16g started: row views at multiples of 16 stay valid.
//
// Q6_K_R16 does the same for Q6_K (weights q + 32 in 0..63, 16 sub-blocks of 16 per 256-element
// super-block, an int8 scale per sub-block, an fp16 d per super-block). For each super-block of
// a group, 3360 bytes (16 x 210):
//   d[16]          fp16  the 16 rows' super-block scales
//   sc[16][16]     int8  sc[j][r] = scale of sub-block j of row r
//   per sub-block j, 192 bytes: A[64], B[64], H[64]; in lane r (bytes 4r .. 4r + 3), byte i
//   packs the weights w_c = q[16j + 4c + i] (c = 0..3) of row r:
//     A = (w0 & 15) | (w1 & 15) << 4,  B = (w2 & 15) | (w3 & 15) << 4,
//     H = w0 >> 4 | (w1 >> 4) << 2 | (w2 >> 4) << 4 | (w3 >> 4) << 6
//   so four unpacked registers hold elements 4c .. 4c + 3 of sub-block j of all 16 rows, in the
//   order of the Q8_K activations.
//
// Q4_K_R16 does it for Q4_K (weights q in 0..15, 8 sub-blocks of 32 per super-block, each with
// a 6-bit scale and a 6-bit min, an fp16 d and dmin per super-block; value d sc q - dmin m). For
// each super-block of a group, 2304 bytes (16 x 144):
//   d[16], dmin[16]  fp16  the 16 rows' super-block scales
//   lo[8][16]        lo[j][r] = (sc & 15) | (m & 15) << 4 of sub-block j of row r
//   hi[4][16]        hi[i][r]: the top two bits of sc and m of sub-blocks 2i (low nibble:
//                    sc >> 4 | (m >> 4) << 2) and 2i + 1 (high nibble, the same)
//   per sub-block j, 256 bytes: chunk c (64 bytes), lane r: byte i = q[32j + 4c + i] |
//   q[32j + 16 + 4c + i] << 4 of row r, so a chunk's low nibbles are elements 4c .. 4c + 3 and
//   its high nibbles 16 + 4c .. 16 + 4c + 3 of sub-block j of all 16 rows.
// Q5_K_R16 is Q4_K_R16 with each sub-block's fifth bits in front of its nibbles, 2816 bytes
// (16 x 176): per sub-block j, 320 bytes: qh[16][4] (row r's four bytes laid out as Q5_0_R16's,
// byte i: the fifth bits of chunk c's low nibble i in bit 2c, of its high nibble i in bit
// 2c + 1), then the 256 bytes of chunks. One sub-block is one contiguous read.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.hpp"

namespace ember::cpu {

constexpr int64_t kR16Rows = 16;

// Whether repacking file type t pays at the current SIMD level: its repacked type has a SIMD
// kernel at that level or one it falls back to (AVX-512 VNNI, AVX-VNNI and AVX2: every one;
// scalar: none). Where it has none, the product would run the scalar reference: repacking would
// only cost time.
bool r16_pays(DType t);
// Whether some type's repacking pays at the current level.
bool r16_fast();
// The repacked type of a file type (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K -> *_R16); the type
// itself if none.
DType r16_type(DType t);
// The file type a repacked type came from (the type itself for any other): both take the same
// quantized activations.
DType r16_base(DType t);
// rows x k of a type r16_type() repacks (rows a multiple of 16, k of its block size) from `src`
// into `dst`: same size, no overlap.
void repack_r16(DType t, const void* src, int64_t rows, int64_t k, void* dst);

// The inverse for Q4_0, Q4_1, Q5_0 and Q8_0 (t: the plain type): back to plain rows.
void unpack_r16(DType t, const void* src, int64_t rows, int64_t k, void* dst);
// Whether unpack_r16 takes t (a plain type), so single rows of its repacked matrices can be read.
bool r16_unpackable(DType t);

namespace detail {

// The activations the Q4_0_R16 / Q4_1_R16 kernels read, one 32-element block at a time: the
// block's scale as float; for Q4_0 (Q5_0, Q8_0), c = -8 (-16, -128) * (sum of its 32 values) (the
// offset, taken off in integers), for Q4_1 the Q8_1 block's s = d * sum (the fp16 value ggml stores); and its
// values. Built from the Q8_0 / Q8_1 rows quantize_activations() gives, so results match the
// file layout's.
struct R16Act {
  float d;
  union {
    int32_t c;
    float s;
  };
  int8_t qs[32];
};
static_assert(sizeof(R16Act) == 40);
inline size_t r16_act_row_bytes(int64_t k) { return static_cast<size_t>(k / 32) * sizeof(R16Act); }
void prepare_r16(DType weight_type, const void* q8_row, void* out, int64_t k);

}  // namespace detail
}  // namespace ember::cpu
