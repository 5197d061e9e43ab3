// Q6_K_R16 (layout in r16/r16.hpp): repacking and the scalar reference kernel.
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"
#include "ops/cpu/r16/words_sse2.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {
namespace {

constexpr size_t kGroupBlockBytes = kR16Rows * sizeof(BlockQ6_K);  // 3360
constexpr size_t kScalesAt = 32, kSubBlocksAt = 32 + 256, kSubBlockBytes = 192;

// The 256 elements of a Q6_K super-block as stored, q + 32 in 0..63 (ggml's bit layout: per
// half of 128, ql holds the low nibbles of elements l and l + 64 (l < 64) in one byte, qh the
// high two bits of l, l + 32, l + 64, l + 96 (l < 32)).
void q6_values(const BlockQ6_K& b, uint8_t w[kQK_K]) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b.ql + 64 * half;
    const uint8_t* qh = b.qh + 32 * half;
    uint8_t* o = w + 128 * half;
    for (int l = 0; l < 32; ++l) {
      o[l] = static_cast<uint8_t>((ql[l] & 15) | (qh[l] & 3) << 4);
      o[l + 32] = static_cast<uint8_t>((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
      o[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
      o[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
    }
  }
}

// q6_values on 128-bit vectors (SSE2): 16 elements of each of the four quarters of a half at a time.
void q6_values_sse2(const BlockQ6_K& b, uint8_t w[kQK_K]) {
  const __m128i m4 = _mm_set1_epi8(0x0F), m3 = _mm_set1_epi8(0x03);
  for (int half = 0; half < 2; ++half)
    for (int l0 = 0; l0 < 32; l0 += 16) {
      const uint8_t* ql = b.ql + 64 * half + l0;
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ql));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 32));
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh + 32 * half + l0));
      // bits 2s, 2s + 1 of each qh byte, moved to bits 4, 5 (16-bit shifts; the masks keep each byte's own)
      const auto top = [&](int s) { return _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 2 * s), m3), 4); };
      uint8_t* o = w + 128 * half + l0;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm_or_si128(_mm_and_si128(a, m4), top(0)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32), _mm_or_si128(_mm_and_si128(c, m4), top(1)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 64), _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), m4), top(2)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 96), _mm_or_si128(_mm_and_si128(_mm_srli_epi16(c, 4), m4), top(3)));
    }
}

// A group's super-block, 16 rows at once on 128-bit vectors (SSE2), the same bytes as the row by
// row code (tests/test_r16.cpp compares the two): per four rows and sub-block j, the rows' 16
// values as four 4-byte words (c = 0..3: elements 4c + i) transposed so that vector c holds word c
// of the four rows, whose bytes then combine as the layout says (low nibbles of words 0 and 1, of
// words 2 and 3, and the four words' top 2 bits) into 16 contiguous bytes of each region.
void repack_q6_k_block(const BlockQ6_K* first, int64_t row_stride, uint8_t* o) {
  alignas(16) uint8_t v[kR16Rows][kQK_K];
  for (int r = 0; r < kR16Rows; ++r) {
    const BlockQ6_K& blk = first[r * row_stride];
    q6_values_sse2(blk, v[r]);
    std::memcpy(o + 2 * r, &blk.d, 2);
    for (int j = 0; j < 16; ++j) o[kScalesAt + 16 * j + r] = static_cast<uint8_t>(blk.scales[j]);
  }
  const __m128i m4 = _mm_set1_epi8(0x0F), m3 = _mm_set1_epi8(0x03);
  const auto shl = [](__m128i x, int n) { return _mm_slli_epi16(x, n); };  // bits stay in their bytes
  const auto hi2 = [&](__m128i x) { return _mm_and_si128(_mm_srli_epi16(x, 4), m3); };
  for (int q = 0; q < kR16Rows / 4; ++q)
    for (int j = 0; j < 16; ++j) {
      __m128i x[4];
      for (int i = 0; i < 4; ++i) x[i] = _mm_load_si128(reinterpret_cast<const __m128i*>(v[4 * q + i] + 16 * j));
      __m128i w[4];
      detail::transpose_words4(x, w);
      const __m128i w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
      uint8_t* sb = o + kSubBlocksAt + kSubBlockBytes * j + 16 * q;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(sb), _mm_or_si128(_mm_and_si128(w0, m4), shl(_mm_and_si128(w1, m4), 4)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(sb + 64),
                       _mm_or_si128(_mm_and_si128(w2, m4), shl(_mm_and_si128(w3, m4), 4)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(sb + 128),
                       _mm_or_si128(_mm_or_si128(hi2(w0), shl(hi2(w1), 2)), _mm_or_si128(shl(hi2(w2), 4), shl(hi2(w3), 6))));
    }
}

}  // namespace

namespace detail {

void repack_q6_k_r16(const void* src, int64_t rows, int64_t k, void* dst) {
  const auto* in = static_cast<const BlockQ6_K*>(src);
  for_each_k_group_block("Q6_K_R16", rows, k, [&](int64_t g, int64_t b, int64_t nb) {
    repack_q6_k_block(in + g * kR16Rows * nb + b, nb, static_cast<uint8_t*>(dst) + (g * nb + b) * kGroupBlockBytes);
  });
}

void repack_q6_k_r16_rows(const void* src, int64_t rows, int64_t k, void* dst) {
  const auto* in = static_cast<const BlockQ6_K*>(src);
  for_each_k_group_block("Q6_K_R16", rows, k, [&](int64_t g, int64_t b, int64_t nb) {
    uint8_t* o = static_cast<uint8_t*>(dst) + (g * nb + b) * kGroupBlockBytes;
    for (int r = 0; r < kR16Rows; ++r) {
      const BlockQ6_K& blk = in[(g * kR16Rows + r) * nb + b];
      uint8_t v[kQK_K];
      q6_values(blk, v);
      std::memcpy(o + 2 * r, &blk.d, 2);
      for (int j = 0; j < 16; ++j) {
        o[kScalesAt + 16 * j + r] = static_cast<uint8_t>(blk.scales[j]);
        uint8_t* sb = o + kSubBlocksAt + kSubBlockBytes * j + 4 * r;
        for (int i = 0; i < 4; ++i) {
          int w[4];
          for (int c = 0; c < 4; ++c) w[c] = v[16 * j + 4 * c + i];
          sb[i] = static_cast<uint8_t>((w[0] & 15) | (w[1] & 15) << 4);
          sb[64 + i] = static_cast<uint8_t>((w[2] & 15) | (w[3] & 15) << 4);
          sb[128 + i] = static_cast<uint8_t>(w[0] >> 4 | (w[1] >> 4) << 2 | (w[2] >> 4) << 4 | (w[3] >> 4) << 6);
        }
      }
    }
  });
}

// The reference: the AVX-512 kernel does the same integer work and the same float operations
// in the same order, so the two agree bit for bit.
void gemm_q6_k_r16_scalar(const GemmArgs& a) {
  r16_scalar<BlockQ8_K, kQK_K, kGroupBlockBytes>(a, [](const uint8_t* p, const BlockQ8_K& x, int r, float acc) {
    int32_t total = 0;
    for (int j = 0; j < 16; ++j) {
      const uint8_t* sb = p + kSubBlocksAt + kSubBlockBytes * j + 4 * r;
      int32_t s = -32 * x.bsums[j];
      for (int i = 0; i < 4; ++i) {
        const int w[4] = {(sb[i] & 15) | (sb[128 + i] & 3) << 4, (sb[i] >> 4) | ((sb[128 + i] >> 2) & 3) << 4,
                          (sb[64 + i] & 15) | ((sb[128 + i] >> 4) & 3) << 4,
                          (sb[64 + i] >> 4) | ((sb[128 + i] >> 6) & 3) << 4};
        for (int c = 0; c < 4; ++c) s += w[c] * x.qs[16 * j + 4 * c + i];
      }
      total += s * static_cast<int8_t>(p[kScalesAt + 16 * j + r]);
    }
    uint16_t h;
    std::memcpy(&h, p + 2 * r, 2);
    return std::fma(static_cast<float>(total), fp16_to_fp32(h) * x.d, acc);
  });
}

}  // namespace detail
}  // namespace ember::cpu
