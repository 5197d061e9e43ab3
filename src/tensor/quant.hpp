// Block layouts of the quantized types, bit-exact with GGUF, and the scalar reference
// conversions between them and float. All sizes n are multiples of the type's block size.
#pragma once
#include <cstdint>

#include "tensor/dtype.hpp"

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
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // 8-bit sub-block scales
  uint16_t d;                 // fp16 super-block scale
};
struct BlockQ8_K {   // activations against K-quants
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];  // sums of groups of 16 qs
};
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

// Scalar reference conversions. dequantize_row supports every type in dtype_supported();
// quantize_row supports F32, F16, BF16, Q8_0, Q8_1, Q4_0, Q4_1, Q6_K and Q8_K.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);
void quantize_row(DType type, const float* src, void* dst, int64_t n);

}  // namespace ember
