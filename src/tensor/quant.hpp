// Block layouts of the quantized types, bit-exact with GGUF, and the scalar reference
// conversions between them and float. All sizes n are multiples of the type's block size.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/dtype.hpp"
#include "tensor/kquant_scales.hpp"

namespace ember {

constexpr int kQK = 32;     // elements per block of Q4_0, Q4_1, Q8_0, Q8_1
constexpr int kQK_K = 256;  // elements per K-quant super-block

#pragma pack(push, 1)
struct BlockQ4_0 {   // x = d * (q - 8), q in [0, 15]; low nibbles hold elements 0..15
  uint16_t d;        // fp16 scale
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {   // x = d * q + m
  uint16_t d, m;     // fp16
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {   // x = d * q
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ8_1 {   // as Q8_0 plus s = d * sum(q), used against Q4_1
  uint16_t d, s;
  int8_t qs[kQK];
};
struct BlockQ5_0 {   // x = d * (q - 16), q in [0, 31]: low 4 bits as Q4_0, bit 4 of element j in qh bit j
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {   // x = d * q + m, q in [0, 31], bits as Q5_0
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// Q4_K / Q5_K: 8 sub-blocks of 32, x = d * sc[j] * q - dmin * m[j] with 6-bit sc, m packed in
// `scales` (see kquant_scale_min). Each 32 bytes of qs hold two sub-blocks: low nibbles sub-block
// 2i, high nibbles 2i+1. Q5_K: bit 4 of element 64i + l (l < 32) is bit 2i of qh[l], of element
// 64i + 32 + l bit 2i + 1.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
// Q2_K / Q3_K: 16 sub-blocks of 16. Element e = 128n + 32j + l (n < 2, j < 4, l < 32) takes the
// 2 bits (qs[32n + l] >> 2j) & 3 and the scale of sub-block e / 16.
struct BlockQ2_K {   // x = d * sc * q - dmin * m; scales[g]: sc in the low nibble, m in the high
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d, dmin;
};
struct BlockQ3_K {   // x = d * (s - 32) * (q - 4 * (1 - hbit)), hbit = bit 4n + j of hmask[l]
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];  // 16 6-bit scales (see q3_k_scale)
  uint16_t d;
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // 8-bit sub-block scales
  uint16_t d;                 // fp16 super-block scale
};
// Element e (< 256) of a Q4_K super-block as its 4-bit code: the nibble of qs' 32-byte run e / 64
// (low for the first 32 of the run, high for the next) at byte e % 32; of a Q5_K one as its 5-bit
// code (0..31): that nibble, and bit e / 32 of qh[e % 32] its fifth bit. Q6_K's as its signed code q - 32 (-32..31): dequant_q6_k's rule, with
// the scale scales[e / 16].
inline int q4_k_code(const BlockQ4_K& b, int e) { return (b.qs[32 * (e / 64) + e % 32] >> (4 * (e / 32 % 2))) & 15; }
inline int q5_k_code(const BlockQ5_K& b, int e) {
  const int l = e % 32, j = e / 32;
  return ((b.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15) | ((b.qh[l] >> j) & 1) << 4;
}
inline int q6_k_code(const BlockQ6_K& b, int e) {
  const int n = e / 128, quarter = e % 128 / 32, l = e % 32;
  const int lo = (b.ql[64 * n + l + 32 * (quarter % 2)] >> (4 * (quarter / 2))) & 15;
  return (lo | ((b.qh[32 * n + l] >> (2 * quarter)) & 3) << 4) - 32;
}
struct BlockQ8_K {   // activations against K-quants
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];  // sums of groups of 16 qs
};
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ8_1) == 36 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);


// Signed scale (-32..31) of sub-block j < 16 of a Q3_K super-block: its low 4 bits are the low
// (j < 8) or high (j >= 8) nibble of byte j % 8, its top 2 bits bits 2 * (j / 4) of byte 8 + j % 4.
inline int q3_k_scale(const uint8_t* q, int j) {
  const int lo = j < 8 ? q[j] & 0xF : q[j - 8] >> 4;
  const int hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | hi << 4) - 32;
}

// Scalar reference conversions of a row of n values, by the type's row (DTypeInfo::to_float,
// from_float): every type dtype_supported() takes, and the activation types Q8_1 and Q8_K. (The
// K-quant quantizers are simple min/max searches, not ggml's error-minimizing ones: Ember quantizes weights only for tests and synthetic models; dequantization is bit-exact.)
void dequantize_row(DType type, const void* src, float* dst, int64_t n);
void quantize_row(DType type, const float* src, void* dst, int64_t n);
// Each type's conversions as its row in the type table holds them (DTypeInfo::to_float and
// from_float, tensor/dtype.cpp): nb blocks to floats, and floats to nb blocks.
namespace blocks {
void f32(const void* src, float* dst, int64_t nb);
void f32(const float* src, void* dst, int64_t nb);
void f16(const void* src, float* dst, int64_t nb);
void f16(const float* src, void* dst, int64_t nb);
void bf16(const void* src, float* dst, int64_t nb);
void bf16(const float* src, void* dst, int64_t nb);
void q4_0(const void* src, float* dst, int64_t nb);
void q4_0(const float* src, void* dst, int64_t nb);
void q4_1(const void* src, float* dst, int64_t nb);
void q4_1(const float* src, void* dst, int64_t nb);
void q5_0(const void* src, float* dst, int64_t nb);
void q5_0(const float* src, void* dst, int64_t nb);
void q5_1(const void* src, float* dst, int64_t nb);
void q5_1(const float* src, void* dst, int64_t nb);
void q8_0(const void* src, float* dst, int64_t nb);
void q8_0(const float* src, void* dst, int64_t nb);
void q8_1(const void* src, float* dst, int64_t nb);
void q8_1(const float* src, void* dst, int64_t nb);
void q2_k(const void* src, float* dst, int64_t nb);
void q2_k(const float* src, void* dst, int64_t nb);
void q3_k(const void* src, float* dst, int64_t nb);
void q3_k(const float* src, void* dst, int64_t nb);
void q4_k(const void* src, float* dst, int64_t nb);
void q4_k(const float* src, void* dst, int64_t nb);
void q5_k(const void* src, float* dst, int64_t nb);
void q5_k(const float* src, void* dst, int64_t nb);
void q6_k(const void* src, float* dst, int64_t nb);
void q6_k(const float* src, void* dst, int64_t nb);
void q8_k(const void* src, float* dst, int64_t nb);
void q8_k(const float* src, void* dst, int64_t nb);
}  // namespace blocks

// Whether every value of a row of n values (any type dequantize_row reads) is finite; `scratch`
// holds its dequantized values.
bool row_finite(DType type, const void* src, int64_t n, std::vector<float>& scratch);

}  // namespace ember
