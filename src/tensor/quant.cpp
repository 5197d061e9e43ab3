#include "tensor/quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.hpp"
#include "tensor/fp16.hpp"

namespace ember {
namespace {

inline int round_int(float x) { return static_cast<int>(std::lrintf(x)); }  // nearest, ties even

void check_multiple(DType type, int64_t n) {
  int64_t bs = info(type).block_size;
  EMBER_CHECK(n % bs == 0, "row of {} elements is not a multiple of the {} block size {}", n, dtype_name(type), bs);
}

// ---- dequantize -------------------------------------------------------------------------

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>((b[i].qs[j] & 0x0F) - 8);
      y[j + kQK / 2] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(b[i].qs[j] & 0x0F) + m;
      y[j + kQK / 2] = d * static_cast<float>(b[i].qs[j] >> 4) + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(b[i].qs[j]);
  }
}

void dequant_q8_1(const BlockQ8_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(b[i].qs[j]);
  }
}

void dequant_q8_k(const BlockQ8_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K)
    for (int j = 0; j < kQK_K; ++j) y[j] = b[i].d * static_cast<float>(b[i].qs[j]);
}

// Q6_K: each half of 128 elements takes 64 bytes of ql and 32 of qh. Element l (< 32) of the four
// quarters comes from: low nibble of ql[l], low nibble of ql[l+32], high nibble of ql[l], high
// nibble of ql[l+32]; its 2 high bits from qh[l] bits 0-1, 2-3, 4-5, 6-7. Element i of the
// super-block uses scale scales[i / 16].
void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int q0 = ((ql[l] & 0x0F) | ((qh[l] >> 0) & 3) << 4) - 32;
        const int q1 = ((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) - 32;
        const int q2 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
        const int q3 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
        const int s = l / 16;
        y[l] = d * static_cast<float>(sc[s]) * static_cast<float>(q0);
        y[l + 32] = d * static_cast<float>(sc[s + 2]) * static_cast<float>(q1);
        y[l + 64] = d * static_cast<float>(sc[s + 4]) * static_cast<float>(q2);
        y[l + 96] = d * static_cast<float>(sc[s + 6]) * static_cast<float>(q3);
      }
    }
  }
}

// Q2_K / Q3_K: the 2-bit field of element 32j + l of a 128-element half whose qs start at q.
inline int q2_bits(const uint8_t* q, int j, int l) { return (q[l] >> (2 * j)) & 3; }

// In ggml's order of operations: (d * sc) * q - dmin * m.
void dequant_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int n = 0; n < 2; ++n)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) {
          const uint8_t sc = b[i].scales[8 * n + 2 * j + l / 16];
          *y++ = d * static_cast<float>(sc & 0xF) * static_cast<float>(q2_bits(b[i].qs + 32 * n, j, l)) -
                 dmin * static_cast<float>(sc >> 4);
        }
  }
}

void dequant_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int n = 0; n < 2; ++n)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) {
          const int q = q2_bits(b[i].qs + 32 * n, j, l) - ((b[i].hmask[l] >> (4 * n + j)) & 1 ? 0 : 4);
          *y++ = d * static_cast<float>(q3_k_scale(b[i].scales, 8 * n + 2 * j + l / 16)) * static_cast<float>(q);
        }
  }
}

uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
      y[j] = d * static_cast<float>(((b[i].qs[j] & 0x0F) | h0) - 16);
      y[j + kQK / 2] = d * static_cast<float>(((b[i].qs[j] >> 4) | h1) - 16);
    }
  }
}

void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
      y[j] = d * static_cast<float>((b[i].qs[j] & 0x0F) | h0) + m;
      y[j + kQK / 2] = d * static_cast<float>((b[i].qs[j] >> 4) | h1) + m;
    }
  }
}

// Q4_K / Q5_K (qh == nullptr for Q4_K), in ggml's order of operations: d1 * q - m1.
void dequant_k45(uint16_t dh, uint16_t dminh, const uint8_t* scales, const uint8_t* qs, const uint8_t* qh, float* y) {
  const float d = fp16_to_fp32(dh), dmin = fp16_to_fp32(dminh);
  for (int c = 0; c < 4; ++c, qs += 32) {
    uint8_t sc, m;
    kquant_scale_min(scales, 2 * c, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    kquant_scale_min(scales, 2 * c + 1, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) {
      const int h = qh ? ((qh[l] >> (2 * c)) & 1) << 4 : 0;
      *y++ = d1 * static_cast<float>((qs[l] & 0x0F) | h) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int h = qh ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
      *y++ = d2 * static_cast<float>((qs[l] >> 4) | h) - m2;
    }
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) dequant_k45(b[i].d, b[i].dmin, b[i].scales, b[i].qs, nullptr, y);
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) dequant_k45(b[i].d, b[i].dmin, b[i].scales, b[i].qs, b[i].qh, y);
}

// ---- quantize ---------------------------------------------------------------------------



// Symmetric 8-bit block: d = amax / 127, q = round(x / d). Returns d; writes qs.
float quant_sym8(const float* x, int8_t* qs, int n) {
  float amax = 0.f, probe = 0.f;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j])), probe += x[j] - x[j];
  // A NaN or infinity in the block (from a corrupt weight upstream): a NaN scale and zero
  // levels, so that the products it enters are NaN and the run reports it (check_logits)
  // instead of reading the value as some finite level.
  if (probe != 0.f) {
    std::fill(qs, qs + n, int8_t{0});
    return std::numeric_limits<float>::quiet_NaN();
  }
  // id = 127 / amax (not 1 / d) as ggml's activation quantizers compute it, so that Ember's
  // activations round exactly as llama.cpp's do.
  const float d = amax / 127.f;
  const float id = amax != 0.f ? 127.f / amax : 0.f;
  for (int j = 0; j < n; ++j) qs[j] = static_cast<int8_t>(std::clamp(round_int(x[j] * id), -127, 127));
  return d;
}

// The 32-weight blocks: each weight's level q in [0, 2 half - 1] (Q4_0, Q5_0: half 8 or 16,
// x = d (q - half), d from the value of largest magnitude, which keeps its sign and maps to
// q = 0) or in [0, nmax] (Q4_1, Q5_1: x = d q + lo over the block's range [lo, hi]).
float symmetric_levels(const float* x, int half, int* q) {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < kQK; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
  const float d = max / static_cast<float>(-half);
  const float id = d != 0.f ? 1.f / d : 0.f;
  const float offset = static_cast<float>(half) + 0.5f;
  for (int j = 0; j < kQK; ++j) q[j] = std::min(2 * half - 1, static_cast<int>(x[j] * id + offset));
  return d;
}

void affine_levels(const float* x, int nmax, int* q, float& d, float& lo) {
  lo = x[0];
  float hi = x[0];
  for (int j = 1; j < kQK; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
  d = (hi - lo) / static_cast<float>(nmax);
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int j = 0; j < kQK; ++j) q[j] = std::clamp(static_cast<int>((x[j] - lo) * id + 0.5f), 0, nmax);
}

// Low nibbles: weight j and j + 16 share byte j. Fifth bits (Q5_*): bit j of qh is weight j's.
void pack_nibbles(const int* q, uint8_t* qs) {
  for (int j = 0; j < kQK / 2; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | (q[j + kQK / 2] & 0x0F) << 4);
}

void pack_fifth_bits(const int* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < kQK; ++j) bits |= static_cast<uint32_t>(q[j] >> 4) << j;
  std::memcpy(qh, &bits, 4);
}

// Q4_0 (half 8) and Q5_0 (half 16); the fifth bits where the block has them.
template <int half, class Block>
void quant_symmetric(const float* x, Block* b, int64_t nb) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    b[i].d = fp32_to_fp16(symmetric_levels(x, half, q));
    pack_nibbles(q, b[i].qs);
    if constexpr (half == 16) pack_fifth_bits(q, b[i].qh);
  }
}

// Q4_1 (nmax 15) and Q5_1 (nmax 31).
template <int nmax, class Block>
void quant_affine(const float* x, Block* b, int64_t nb) {
  int q[kQK];
  float d, lo;
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    affine_levels(x, nmax, q, d, lo);
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(lo);
    pack_nibbles(q, b[i].qs);
    if constexpr (nmax == 31) pack_fifth_bits(q, b[i].qh);
  }
}

void quant_q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) b[i].d = fp32_to_fp16(quant_sym8(x, b[i].qs, kQK));
}

void quant_q8_1(const float* x, BlockQ8_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = quant_sym8(x, b[i].qs, kQK);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) sum += b[i].qs[j];
    b[i].d = fp32_to_fp16(d);
    // s from the unrounded d, as ggml computes it (llama.cpp agreement); it differs from the
    // sum of the dequantized values by at most half an fp16 ulp of d per block.
    b[i].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

void quant_q8_k(const float* x, BlockQ8_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    b[i].d = quant_sym8(x, b[i].qs, kQK_K);
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += b[i].qs[g * 16 + j];
      b[i].bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

// Best scale for 16 values quantized to [-32, 31]: tries a few divisors of the signed max and
// keeps the one with the least squared error (a light version of ggml's make_qx_quants).
float q6_sub_scale(const float* x) {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < 16; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
  if (amax == 0.f) return 0.f;
  float best_scale = max / -32.f, best_err = INFINITY;
  for (int step = -6; step <= 6; ++step) {
    const float scale = max / (-32.f + 0.25f * static_cast<float>(step));
    const float inv = 1.f / scale;
    float err = 0.f;
    for (int j = 0; j < 16; ++j) {
      const int q = std::clamp(round_int(x[j] * inv), -32, 31);
      const float e = x[j] - scale * static_cast<float>(q);
      err += e * e;
    }
    if (err < best_err) best_err = err, best_scale = scale;
  }
  return best_scale;
}

void quant_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float sub[kQK_K / 16];
    float max_scale = 0.f, amax_scale = 0.f;
    for (int g = 0; g < kQK_K / 16; ++g) {
      sub[g] = q6_sub_scale(x + 16 * g);
      if (std::fabs(sub[g]) > amax_scale) amax_scale = std::fabs(sub[g]), max_scale = sub[g];
    }
    BlockQ6_K& blk = b[i];
    std::memset(&blk, 0, sizeof(blk));
    uint8_t q[kQK_K];
    if (amax_scale == 0.f) {
      std::fill(q, q + kQK_K, 32);
    } else {
      // Sub-block scales as int8 relative to the super-block scale d: the largest maps to -128.
      const float iscale = -128.f / max_scale;
      const float d = 1.f / iscale;
      blk.d = fp32_to_fp16(d);
      const float dq = fp16_to_fp32(blk.d);
      for (int g = 0; g < kQK_K / 16; ++g) {
        blk.scales[g] = static_cast<int8_t>(std::min(127, round_int(iscale * sub[g])));
        const float s = dq * static_cast<float>(blk.scales[g]);
        const float inv = s != 0.f ? 1.f / s : 0.f;
        for (int j = 0; j < 16; ++j)
          q[16 * g + j] = static_cast<uint8_t>(std::clamp(round_int(x[16 * g + j] * inv), -32, 31) + 32);
      }
    }
    // Pack: the inverse of dequant_q6_k's layout.
    for (int half = 0; half < 2; ++half) {
      uint8_t* ql = blk.ql + 64 * half;
      uint8_t* qh = blk.qh + 32 * half;
      const uint8_t* qq = q + 128 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((qq[l] & 0x0F) | (qq[l + 64] & 0x0F) << 4);
        ql[l + 32] = static_cast<uint8_t>((qq[l + 32] & 0x0F) | (qq[l + 96] & 0x0F) << 4);
        qh[l] = static_cast<uint8_t>((qq[l] >> 4) | (qq[l + 32] >> 4) << 2 | (qq[l + 64] >> 4) << 4 |
                                     (qq[l + 96] >> 4) << 6);
      }
    }
  }
}



// Q4_K / Q5_K (nmax 15 or 31): per sub-block an affine map of [min(x, 0), max(x)] onto [0, nmax];
// the sub-block scales and mins are then quantized to 6 bits against the super-block d, dmin.
void quant_k45(const float* x, int nmax, uint16_t& dh, uint16_t& dminh, uint8_t* scales, uint8_t* q) {
  float sub_scale[8], sub_min[8], max_scale = 0.f, max_min = 0.f;
  for (int j = 0; j < 8; ++j) {
    float lo = 0.f, hi = x[32 * j];
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * j + l]), hi = std::max(hi, x[32 * j + l]);
    sub_scale[j] = (hi - lo) / static_cast<float>(nmax);
    sub_min[j] = -lo;
    max_scale = std::max(max_scale, sub_scale[j]);
    max_min = std::max(max_min, sub_min[j]);
  }
  dh = fp32_to_fp16(max_scale / 63.f);
  dminh = fp32_to_fp16(max_min / 63.f);
  const float d = fp16_to_fp32(dh), dmin = fp16_to_fp32(dminh);
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    // Scales round up so that the range is covered: no top values clamped off.
    ls[j] = static_cast<uint8_t>(d > 0.f ? std::clamp(static_cast<int>(std::ceil(sub_scale[j] / d)), 0, 63) : 0);
    lm[j] = static_cast<uint8_t>(dmin > 0.f ? std::clamp(round_int(sub_min[j] / dmin), 0, 63) : 0);
  }
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(ls[j] | (ls[j + 4] >> 4) << 6);
    scales[j + 4] = static_cast<uint8_t>(lm[j] | (lm[j + 4] >> 4) << 6);
    scales[j + 8] = static_cast<uint8_t>((ls[j + 4] & 0xF) | (lm[j + 4] & 0xF) << 4);
  }
  for (int j = 0; j < 8; ++j) {
    const float s = d * ls[j], m = dmin * lm[j];
    for (int l = 0; l < 32; ++l)
      q[32 * j + l] = static_cast<uint8_t>(s > 0.f ? std::clamp(round_int((x[32 * j + l] + m) / s), 0, nmax) : 0);
  }
}

// Stores 2-bit values q[e] (e < 256) into qs in the Q2_K / Q3_K order.
void pack_q2(const uint8_t* q, uint8_t* qs) {
  std::memset(qs, 0, kQK_K / 4);
  for (int e = 0; e < kQK_K; ++e) {
    const int n = e / 128, j = (e % 128) / 32, l = e % 32;
    qs[32 * n + l] = static_cast<uint8_t>(qs[32 * n + l] | (q[e] & 3) << (2 * j));
  }
}

// Q2_K: per sub-block of 16 an affine map of [min(x, 0), max(x)] onto [0, 3]; scales and mins
// to 4 bits against d, dmin; then the values against the quantized scales and mins.
void quant_q2_k(const float* x, BlockQ2_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float sub_scale[16], sub_min[16], max_scale = 0.f, max_min = 0.f;
    for (int g = 0; g < 16; ++g) {
      float lo = 0.f, hi = x[16 * g];
      for (int l = 0; l < 16; ++l) lo = std::min(lo, x[16 * g + l]), hi = std::max(hi, x[16 * g + l]);
      sub_scale[g] = (hi - lo) / 3.f;
      sub_min[g] = -lo;
      max_scale = std::max(max_scale, sub_scale[g]);
      max_min = std::max(max_min, sub_min[g]);
    }
    b[i].d = fp32_to_fp16(max_scale / 15.f);
    b[i].dmin = fp32_to_fp16(max_min / 15.f);
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    uint8_t q[kQK_K];
    for (int g = 0; g < 16; ++g) {
      const int ls = d > 0.f ? std::clamp(static_cast<int>(std::ceil(sub_scale[g] / d)), 0, 15) : 0;
      const int lm = dmin > 0.f ? std::clamp(round_int(sub_min[g] / dmin), 0, 15) : 0;
      b[i].scales[g] = static_cast<uint8_t>(ls | lm << 4);
      const float s = d * static_cast<float>(ls), m = dmin * static_cast<float>(lm);
      for (int l = 0; l < 16; ++l)
        q[16 * g + l] = static_cast<uint8_t>(s > 0.f ? std::clamp(round_int((x[16 * g + l] + m) / s), 0, 3) : 0);
    }
    pack_q2(q, b[i].qs);
  }
}

// Q3_K: per sub-block of 16 a signed scale that maps the value of largest magnitude to -4 (so
// that the range [-4, 3] is used in full), the scales to 6 bits against d.
void quant_q3_k(const float* x, BlockQ3_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float sub[16], amax_scale = 0.f, max_scale = 0.f;
    for (int g = 0; g < 16; ++g) {
      float amax = 0.f, max = 0.f;
      for (int l = 0; l < 16; ++l)
        if (std::fabs(x[16 * g + l]) > amax) amax = std::fabs(x[16 * g + l]), max = x[16 * g + l];
      sub[g] = max / -4.f;
      if (std::fabs(sub[g]) > amax_scale) amax_scale = std::fabs(sub[g]), max_scale = sub[g];
    }
    // The largest scale maps to -32 (the range of the 6-bit scales is [-32, 31]).
    b[i].d = fp32_to_fp16(max_scale / -32.f);
    const float d = fp16_to_fp32(b[i].d);
    int ls[16];
    uint8_t q[kQK_K];
    for (int g = 0; g < 16; ++g) {
      ls[g] = d != 0.f ? std::clamp(round_int(sub[g] / d), -32, 31) : 0;
      const float s = d * static_cast<float>(ls[g]);
      for (int l = 0; l < 16; ++l)
        q[16 * g + l] = static_cast<uint8_t>((s != 0.f ? std::clamp(round_int(x[16 * g + l] / s), -4, 3) : 0) + 4);
    }
    std::memset(b[i].scales, 0, sizeof(b[i].scales));
    for (int g = 0; g < 16; ++g) {
      const int u = ls[g] + 32;
      b[i].scales[g % 8] = static_cast<uint8_t>(b[i].scales[g % 8] | (u & 0xF) << (g < 8 ? 0 : 4));
      b[i].scales[8 + g % 4] = static_cast<uint8_t>(b[i].scales[8 + g % 4] | (u >> 4) << (2 * (g / 4)));
    }
    std::memset(b[i].hmask, 0, sizeof(b[i].hmask));
    for (int e = 0; e < kQK_K; ++e) {
      const int n = e / 128, j = (e % 128) / 32, l = e % 32;
      b[i].hmask[l] = static_cast<uint8_t>(b[i].hmask[l] | (q[e] >> 2) << (4 * n + j));
    }
    pack_q2(q, b[i].qs);
  }
}

void quant_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    uint8_t q[kQK_K];
    quant_k45(x, 15, b[i].d, b[i].dmin, b[i].scales, q);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) b[i].qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | q[64 * c + 32 + l] << 4);
  }
}

void quant_q5_k(const float* x, BlockQ5_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    uint8_t q[kQK_K];
    quant_k45(x, 31, b[i].d, b[i].dmin, b[i].scales, q);
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const uint8_t a = q[64 * c + l], h = q[64 * c + 32 + l];
        b[i].qs[32 * c + l] = static_cast<uint8_t>((a & 0xF) | (h & 0xF) << 4);
        b[i].qh[l] |= static_cast<uint8_t>((a >> 4) << (2 * c) | (h >> 4) << (2 * c + 1));
      }
  }
}

}  // namespace

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  check_multiple(type, n);
  const DTypeInfo& t = info(type);
  EMBER_CHECK(t.to_float != nullptr, "dequantize: type {} is not supported", t.name);
  t.to_float(src, dst, n / t.block_size);
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  check_multiple(type, n);
  const DTypeInfo& t = info(type);
  EMBER_CHECK(t.from_float != nullptr, "quantize: type {} is not supported", t.name);
  t.from_float(src, dst, n / t.block_size);
}

namespace blocks {

void f32(const void* src, float* dst, int64_t nb) { std::memcpy(dst, src, static_cast<size_t>(nb) * sizeof(float)); }
void f32(const float* src, void* dst, int64_t nb) { std::memcpy(dst, src, static_cast<size_t>(nb) * sizeof(float)); }
void f16(const void* src, float* dst, int64_t nb) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < nb; ++i) dst[i] = fp16_to_fp32(h[i]);
}
void f16(const float* src, void* dst, int64_t nb) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < nb; ++i) h[i] = fp32_to_fp16(src[i]);
}
void bf16(const void* src, float* dst, int64_t nb) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < nb; ++i) dst[i] = bf16_to_fp32(h[i]);
}
void bf16(const float* src, void* dst, int64_t nb) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < nb; ++i) h[i] = fp32_to_bf16(src[i]);
}
void q4_0(const void* src, float* dst, int64_t nb) { dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb); }
void q4_0(const float* src, void* dst, int64_t nb) { quant_symmetric<8>(src, static_cast<BlockQ4_0*>(dst), nb); }
void q4_1(const void* src, float* dst, int64_t nb) { dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb); }
void q4_1(const float* src, void* dst, int64_t nb) { quant_affine<15>(src, static_cast<BlockQ4_1*>(dst), nb); }
void q5_0(const void* src, float* dst, int64_t nb) { dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb); }
void q5_0(const float* src, void* dst, int64_t nb) { quant_symmetric<16>(src, static_cast<BlockQ5_0*>(dst), nb); }
void q5_1(const void* src, float* dst, int64_t nb) { dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb); }
void q5_1(const float* src, void* dst, int64_t nb) { quant_affine<31>(src, static_cast<BlockQ5_1*>(dst), nb); }
void q8_0(const void* src, float* dst, int64_t nb) { dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb); }
void q8_0(const float* src, void* dst, int64_t nb) { quant_q8_0(src, static_cast<BlockQ8_0*>(dst), nb); }
void q8_1(const void* src, float* dst, int64_t nb) { dequant_q8_1(static_cast<const BlockQ8_1*>(src), dst, nb); }
void q8_1(const float* src, void* dst, int64_t nb) { quant_q8_1(src, static_cast<BlockQ8_1*>(dst), nb); }
void q2_k(const void* src, float* dst, int64_t nb) { dequant_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb); }
void q2_k(const float* src, void* dst, int64_t nb) { quant_q2_k(src, static_cast<BlockQ2_K*>(dst), nb); }
void q3_k(const void* src, float* dst, int64_t nb) { dequant_q3_k(static_cast<const BlockQ3_K*>(src), dst, nb); }
void q3_k(const float* src, void* dst, int64_t nb) { quant_q3_k(src, static_cast<BlockQ3_K*>(dst), nb); }
void q4_k(const void* src, float* dst, int64_t nb) { dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb); }
void q4_k(const float* src, void* dst, int64_t nb) { quant_q4_k(src, static_cast<BlockQ4_K*>(dst), nb); }
void q5_k(const void* src, float* dst, int64_t nb) { dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb); }
void q5_k(const float* src, void* dst, int64_t nb) { quant_q5_k(src, static_cast<BlockQ5_K*>(dst), nb); }
void q6_k(const void* src, float* dst, int64_t nb) { dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb); }
void q6_k(const float* src, void* dst, int64_t nb) { quant_q6_k(src, static_cast<BlockQ6_K*>(dst), nb); }
void q8_k(const void* src, float* dst, int64_t nb) { dequant_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb); }
void q8_k(const float* src, void* dst, int64_t nb) { quant_q8_k(src, static_cast<BlockQ8_K*>(dst), nb); }

}  // namespace blocks

bool row_finite(DType type, const void* src, int64_t n, std::vector<float>& scratch) {
  scratch.resize(static_cast<size_t>(n));
  dequantize_row(type, src, scratch.data(), n);
  for (float v : scratch)
    if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace ember
