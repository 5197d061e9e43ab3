// Q4_K_R16 and Q5_K_R16 (layout in r16/r16.hpp): repacking and the scalar reference kernels.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"
#include "ops/cpu/r16/words_sse2.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {
namespace {

// Where the parts of a group's super-block start: sub-block j's fifth bits (Q5_K) at
// kQhAt + j kSubBlockBytes, its nibbles at kSubBlocksAt + j kSubBlockBytes (one stream).
template <class B>
struct Places {
  static constexpr bool kQh = std::is_same_v<B, BlockQ5_K>;
  static constexpr size_t kGroupBlockBytes = kR16Rows * sizeof(B);  // 2304 (Q4_K), 2816 (Q5_K)
  static constexpr size_t kLoAt = 64, kHiAt = 64 + 128, kQhAt = 256;
  static constexpr size_t kSubBlocksAt = kQh ? 256 + 64 : 256, kSubBlockBytes = kQh ? 320 : 256;
};

// The 256 elements' codes of a Q4_K / Q5_K super-block (5 bits for Q5_K: tensor/quant.hpp's rules).
template <class B>
void k_values(const B& b, uint8_t w[kQK_K]) {
  for (int e = 0; e < kQK_K; ++e)
    w[e] = static_cast<uint8_t>(Places<B>::kQh ? q5_k_code(reinterpret_cast<const BlockQ5_K&>(b), e)
                                               : q4_k_code(reinterpret_cast<const BlockQ4_K&>(b), e));
}

// Q5_K's fifth bits of one row into the words of its sub-blocks (at o + j kSubBlockBytes, j = 0..7):
// byte i of sub-block j's word has at bit r16_qh_bit(c, s) = 2c + s the fifth bit of element
// 32j + 16s + 4c + i, which is bit j of qh[16s + 4c + i]. So with a (s = 0) and b (s = 1) the
// two halves of qh and every byte's bit j at bit 0, a | b << 1 holds each (c, i)'s two bits in byte
// 4c + i, and the four 32-bit words c shifted by 2c and or-ed are the word.
void fifth_bits(const uint8_t qh[32], uint8_t* o) {
  using P = Places<BlockQ5_K>;
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16));
  const __m128i one = _mm_set1_epi8(1);
  for (int j = 0; j < 8; ++j) {
    const __m128i sa = _mm_and_si128(_mm_srl_epi16(a, _mm_cvtsi32_si128(j)), one);
    const __m128i sb = _mm_and_si128(_mm_srl_epi16(b, _mm_cvtsi32_si128(j)), one);
    __m128i v = _mm_or_si128(sa, _mm_slli_epi16(sb, 1));                    // 2 bits a byte
    v = _mm_or_si128(v, _mm_slli_epi32(_mm_srli_si128(v, 4), 2));        // words 0, 2: c and c + 1
    v = _mm_or_si128(v, _mm_slli_epi32(_mm_srli_si128(v, 8), 4));        // word 0: all four
    const int32_t w = _mm_cvtsi128_si32(v);
    std::memcpy(o + P::kSubBlockBytes * j, &w, 4);
  }
}

// A Q4_K / Q5_K group's super-block, 16 rows at once on 128-bit vectors (SSE2, every x86-64): the
// same bytes as the row-by-row code below (tests/test_r16.cpp compares the two), Q4_K in about a
// sixth of the time; it is what the memory tier pays for each expert it reads.
// Scales: the 16 rows' 12 bytes as planes (s[p]: byte p of each row), then per sub-block j the low
// byte (sc & 15) | (m & 15) << 4 and the 4 high bits (sc >> 4) | (m >> 4) << 2 from kquant_scale_min's
// rule: j < 4: sc, m the low 6 bits of s[j], s[j + 4]; j >= 4: the nibbles of s[j + 4] and the top 2
// bits of s[j - 4], s[j].
// Nibbles: per row and 32-byte run n of qs (lo: bytes 0-15, hi: 16-31), sub-block 2n's 16 bytes
// (lo & 15) | (hi & 15) << 4 and 2n + 1's (lo >> 4) | (hi & 0xf0); 4-byte word c of a row goes to
// chunk c of its sub-block, so four rows' words are transposed 4 x 4 and stored 16 bytes at a time.
// Q5_K's fifth bits (fifth_bits below) per row.
template <class B>
void repack_k_block(const B* first, int64_t row_stride, uint8_t* o) {
  using P = Places<B>;
  alignas(16) uint8_t planes[12][16];
  for (int r = 0; r < kR16Rows; ++r) {
    const B& blk = first[r * row_stride];
    if constexpr (P::kQh) fifth_bits(blk.qh, o + P::kQhAt + 4 * r);
    std::memcpy(o + 2 * r, &blk.d, 2);
    std::memcpy(o + 32 + 2 * r, &blk.dmin, 2);
    for (int p = 0; p < 12; ++p) planes[p][r] = blk.scales[p];
  }
  const auto plane = [&](int p) { return _mm_load_si128(reinterpret_cast<const __m128i*>(planes[p])); };
  const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(0x03), f0 = _mm_set1_epi8(static_cast<char>(0xF0));
  const auto low_shl = [&](__m128i v, int n) { return _mm_slli_epi16(v, n); };  // v's bits stay in their bytes
  __m128i hbits[8];
  for (int j = 0; j < 8; ++j) {
    __m128i lo;
    if (j < 4) {
      const __m128i a = plane(j), b = plane(j + 4);
      lo = _mm_or_si128(_mm_and_si128(a, m4), low_shl(_mm_and_si128(b, m4), 4));
      hbits[j] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), m2), low_shl(_mm_and_si128(_mm_srli_epi16(b, 4), m2), 2));
    } else {
      lo = plane(j + 4);  // (sc & 15) | (m & 15) << 4 is byte j + 4 itself
      hbits[j] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(plane(j - 4), 6), m2),
                              low_shl(_mm_and_si128(_mm_srli_epi16(plane(j), 6), m2), 2));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + P::kLoAt + 16 * j), lo);
  }
  for (int n = 0; n < 4; ++n)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + P::kHiAt + 16 * n),
                     _mm_or_si128(hbits[2 * n], low_shl(hbits[2 * n + 1], 4)));
  for (int q = 0; q < kR16Rows / 4; ++q)
    for (int n = 0; n < 4; ++n) {
      __m128i e[4], d[4];
      for (int i = 0; i < 4; ++i) {
        const uint8_t* qs = first[(4 * q + i) * row_stride].qs + 32 * n;
        const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
        const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16));
        e[i] = _mm_or_si128(_mm_and_si128(lo, m4), low_shl(_mm_and_si128(hi, m4), 4));
        d[i] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(lo, 4), m4), _mm_and_si128(hi, f0));
      }
      for (int odd = 0; odd < 2; ++odd) {
        __m128i w[4];  // w[c]: word c of the four rows
        detail::transpose_words4(odd ? d : e, w);
        uint8_t* sb = o + P::kSubBlocksAt + P::kSubBlockBytes * (2 * n + odd) + 16 * q;
        for (int c = 0; c < 4; ++c) _mm_storeu_si128(reinterpret_cast<__m128i*>(sb + 64 * c), w[c]);
      }
    }
}

template <class B>
void repack(const char* name, const void* src, int64_t rows, int64_t k, void* dst, bool rows_one_by_one = false) {
  using P = Places<B>;
  const auto* in = static_cast<const B*>(src);
  detail::for_each_k_group_block(name, rows, k, [&](int64_t g, int64_t b, int64_t nb) {
    uint8_t* o = static_cast<uint8_t*>(dst) + (g * nb + b) * P::kGroupBlockBytes;
    if (!rows_one_by_one) return repack_k_block(in + g * kR16Rows * nb + b, nb, o);
    std::memset(o + P::kHiAt, 0, 64);
    if constexpr (P::kQh)
      for (int j = 0; j < 8; ++j) std::memset(o + P::kQhAt + P::kSubBlockBytes * j, 0, 64);
    for (int r = 0; r < kR16Rows; ++r) {
      const B& blk = in[(g * kR16Rows + r) * nb + b];
      std::memcpy(o + 2 * r, &blk.d, 2);
      std::memcpy(o + 32 + 2 * r, &blk.dmin, 2);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        kquant_scale_min(blk.scales, j, sc, m);
        o[P::kLoAt + 16 * j + r] = static_cast<uint8_t>((sc & 15) | (m & 15) << 4);
        o[P::kHiAt + 16 * (j / 2) + r] |= static_cast<uint8_t>(((sc >> 4) | (m >> 4) << 2) << (4 * (j % 2)));
      }
      if constexpr (!P::kQh) {
        // Q4_K: sub-block j's elements t and 16 + t are the nibbles (low for even j, high for odd)
        // of bytes t and 16 + t of qs' 32-byte run j / 2; the byte 4c + i of its row here is the
        // pair for t = 4c + i: 16 bytes from two 8-byte words each, 4 at a time to their places.
        for (int j = 0; j < 8; ++j) {
          const uint8_t* q = blk.qs + 32 * (j / 2);
          uint8_t* sb = o + P::kSubBlocksAt + P::kSubBlockBytes * j + 4 * r;
          for (int half = 0; half < 2; ++half) {
            uint64_t lo, hi;
            std::memcpy(&lo, q + 8 * half, 8);
            std::memcpy(&hi, q + 16 + 8 * half, 8);
            constexpr uint64_t kLow = 0x0f0f0f0f0f0f0f0full;
            const uint64_t w = j % 2 == 0 ? (lo & kLow) | (hi & kLow) << 4 : (lo >> 4 & kLow) | (hi & ~kLow);
            std::memcpy(sb + 64 * (2 * half), &w, 4);
            std::memcpy(sb + 64 * (2 * half + 1), reinterpret_cast<const uint8_t*>(&w) + 4, 4);
          }
        }
        continue;
      }
      uint8_t v[kQK_K];
      k_values(blk, v);
      for (int j = 0; j < 8; ++j) {
        uint8_t* sb = o + P::kSubBlocksAt + P::kSubBlockBytes * j + 4 * r;
        for (int c = 0; c < 4; ++c)
          for (int i = 0; i < 4; ++i) {
            const int lo = v[32 * j + 4 * c + i], hi = v[32 * j + 16 + 4 * c + i];
            sb[64 * c + i] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
            if constexpr (P::kQh)  // byte i of the row's word: the fifth bits of chunk c's nibbles i (r16_qh_bit)
              o[P::kQhAt + P::kSubBlockBytes * j + 4 * r + i] |=
                  static_cast<uint8_t>((lo >> 4) << detail::r16_qh_bit(c, 0) | (hi >> 4) << detail::r16_qh_bit(c, 1));
          }
      }
    }
  });
}

// The reference: the AVX-512 kernel does the same integer work and the same float operations
// in the same order, so the two agree bit for bit.
template <class B>
void gemm_scalar(const detail::GemmArgs& a) {
  using P = Places<B>;
  detail::r16_scalar<BlockQ8_K, kQK_K, P::kGroupBlockBytes>(a, [](const uint8_t* p, const BlockQ8_K& x, int r, float acc) {
    int32_t total = 0, mins = 0;
    for (int j = 0; j < 8; ++j) {
      const int lo = p[P::kLoAt + 16 * j + r], hi = p[P::kHiAt + 16 * (j / 2) + r] >> (4 * (j % 2));
      const int sc = (lo & 15) | (hi & 3) << 4, m = (lo >> 4) | ((hi >> 2) & 3) << 4;
      const uint8_t* sb = p + P::kSubBlocksAt + P::kSubBlockBytes * j + 4 * r;
      int32_t s = 0;
      for (int c = 0; c < 4; ++c) {
        for (int i = 0; i < 4; ++i) {
          const int h = P::kQh ? p[P::kQhAt + P::kSubBlockBytes * j + 4 * r + i] : 0;
          const int wl = (sb[64 * c + i] & 15) | ((h >> detail::r16_qh_bit(c, 0)) & 1) << 4;
          const int wh = (sb[64 * c + i] >> 4) | ((h >> detail::r16_qh_bit(c, 1)) & 1) << 4;
          s += wl * x.qs[32 * j + 4 * c + i] + wh * x.qs[32 * j + 16 + 4 * c + i];
        }
      }
      total += s * sc;
      mins += m * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
    }
    uint16_t h, hm;
    std::memcpy(&h, p + 2 * r, 2);
    std::memcpy(&hm, p + 32 + 2 * r, 2);
    acc = std::fma(static_cast<float>(total), fp16_to_fp32(h) * x.d, acc);
    return std::fma(-static_cast<float>(mins), fp16_to_fp32(hm) * x.d, acc);
  });
}

}  // namespace

namespace detail {

void repack_q4_k_r16(const void* src, int64_t rows, int64_t k, void* dst) {
  repack<BlockQ4_K>("Q4_K_R16", src, rows, k, dst);
}
void repack_q4_k_r16_rows(const void* src, int64_t rows, int64_t k, void* dst) {
  repack<BlockQ4_K>("Q4_K_R16", src, rows, k, dst, true);
}
void repack_q5_k_r16(const void* src, int64_t rows, int64_t k, void* dst) {
  repack<BlockQ5_K>("Q5_K_R16", src, rows, k, dst);
}
void repack_q5_k_r16_rows(const void* src, int64_t rows, int64_t k, void* dst) {
  repack<BlockQ5_K>("Q5_K_R16", src, rows, k, dst, true);
}
void gemm_q4_k_r16_scalar(const GemmArgs& a) { gemm_scalar<BlockQ4_K>(a); }
void gemm_q5_k_r16_scalar(const GemmArgs& a) { gemm_scalar<BlockQ5_K>(a); }

}  // namespace detail
}  // namespace ember::cpu
