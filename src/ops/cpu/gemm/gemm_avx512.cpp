// AVX-512 (F, BW, VL, DQ, VNNI) kernels. Integer dots use vpdpbusd (u8 x s8): 4-bit weights
// enter as unsigned 0..15 and 8-bit weights as w + 128, and the offset times the activation sum
// (itself one vpdpbusd per token, shared by all rows of a tile) is subtracted. Each 512-bit step
// covers two 32-element blocks; block scales go to the two 256-bit halves.
// GCC 12 flags the self-initialized "undefined" vectors inside its own AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <array>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/cpu/gemm/gemm_table.hpp"
#include "ops/cpu/gemm/quad_avx512.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/gemm/tile_driver.hpp"

// Two fp16 values to floats [a, b, 0, 0].
inline __m128 half2(uint16_t a, uint16_t b) {
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(a | static_cast<uint32_t>(b) << 16)));
}

// Lanes 0..7 <- element 0, lanes 8..15 <- element 1.
inline __m512 spread2(__m128 v) {
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_zextps128_ps512(v));
}

// ---- float weights ----------------------------------------------------------------------

template <DType WT>
struct FloatKernel {
  static constexpr int kRows = 4, kTokens = 4;

  static __m512 load_w(const uint8_t* p, int64_t i) {
    if constexpr (WT == DType::F32) {
      return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + i);
    } else if constexpr (WT == DType::F16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(p) + i)));
    } else {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(p) + i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
  static __m512 load_w_masked(const uint8_t* p, int64_t i, __mmask16 m) {
    if constexpr (WT == DType::F32) {
      return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(p) + i);
    } else if constexpr (WT == DType::F16) {
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(p) + i));
    } else {
      const __m256i h = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(p) + i);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    TileOperands<uint8_t, float, 16, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    int64_t i = 0;
    for (; i + 16 <= a.k; i += 16) {
      __m512 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = load_w(w[r], i);
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_loadu_ps(x[t] + i);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    if (i < a.k) {
      const __mmask16 m = static_cast<__mmask16>((1u << (a.k - i)) - 1);
      __m512 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = load_w_masked(w[r], i, m);
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, x[t] + i);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    tl.store(a, r0, t0);
  }
};

// ---- 32-element block types: Q4_0 x Q8_0, Q8_0 x Q8_0, Q4_1 x Q8_1 ----------------------

template <DType WT>
struct Block32Kernel {
  static constexpr int kRows = 4, kTokens = 4;
  // Decode reads one row at a time: one sequential weight stream per thread (see Q4QuadKernel).
  static constexpr int kDecodeRows = 1;
  using WB = std::conditional_t<WT == DType::Q4_0, BlockQ4_0, std::conditional_t<WT == DType::Q4_1, BlockQ4_1, BlockQ8_0>>;
  using XB = std::conditional_t<WT == DType::Q4_1, BlockQ8_1, BlockQ8_0>;
  static constexpr bool kHasMin = WT == DType::Q4_1;
  static constexpr int kPrefetchBytes = 4096;

  // Weights of blocks b0, b1 as unsigned bytes (q for 4-bit, w + 128 for 8-bit).
  static __m512i decode(const WB* b0, const WB* b1) {
    if constexpr (WT == DType::Q8_0) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0->qs));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1->qs));
      return _mm512_xor_si512(_mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1), _mm512_set1_epi8(static_cast<char>(0x80)));
    } else {
      const __m256i v = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0->qs))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1->qs)), 1);
      __m512i z = _mm512_zextsi256_si512(v);
      z = _mm512_shuffle_i64x2(z, z, 0x50);  // 128-bit lanes [b0, b0, b1, b1]
      z = _mm512_mask_blend_epi64(0xCC, z, _mm512_srli_epi16(z, 4));  // high nibbles in lanes 1, 3
      return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
    }
  }

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    const int64_t nb = a.k / kQK;
    TileOperands<WB, XB, 16, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    const __m512i offset = _mm512_set1_epi8(static_cast<char>(WT == DType::Q8_0 ? 0x80 : 8));
    for (int64_t b = 0; b < nb; b += 2) {
      // An odd last block is paired with itself, its second copy weighted by 0.
      const bool pair = b + 1 < nb;
      const int64_t b1 = pair ? b + 1 : b;
      __m512i q[R];
      __m128 dw[R];
      [[maybe_unused]] __m512 mw[R];
      for (int r = 0; r < R; ++r) {
        // Several rows are read in step; help the hardware prefetcher keep all streams ahead.
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + b) + kPrefetchBytes, _MM_HINT_T0);
        q[r] = decode(w[r] + b, w[r] + b1);
        dw[r] = half2(w[r][b].d, pair ? w[r][b1].d : 0);
        if constexpr (kHasMin)
          mw[r] = _mm512_maskz_permutexvar_ps(0x0101, _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                              _mm512_zextps128_ps512(half2(w[r][b].m, pair ? w[r][b1].m : 0)));
      }
      for (int t = 0; t < T; ++t) {
        const __m512i xa = _mm512_inserti64x4(
            _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].qs))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b1].qs)), 1);
        const __m128 da = half2(x[t][b].d, x[t][b1].d);
        [[maybe_unused]] __m512i off;
        [[maybe_unused]] __m512 sx;
        if constexpr (kHasMin) {
          sx = spread2(half2(x[t][b].s, x[t][b1].s));
        } else {
          off = _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, xa);
        }
        for (int r = 0; r < R; ++r) {
          __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r], xa);
          if constexpr (!kHasMin) p = _mm512_sub_epi32(p, off);
          const __m512 scale = spread2(_mm_mul_ps(dw[r], da));
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[r][t]);
          if constexpr (kHasMin) acc[r][t] = _mm512_fmadd_ps(mw[r], sx, acc[r][t]);
        }
      }
    }
    tl.store(a, r0, t0);
  }
};

// ---- 4-bit weights in steps of four blocks: Q4_0 x Q8_0, Q4_1 x Q8_1 ----------------------
// The activations come in the quad layout (gemm/gemm_kernels.hpp). Four consecutive weight blocks (72 or 80
// bytes) are two overlapping loads; one vpermt2w gathers their 64 quant bytes (every block's qs
// starts at an even offset) so that 128-bit lane i holds block i, and/shift split the nibbles
// into elements 0..15 (lo) and 16..31 (hi) of each block, the order of the activation quad. One
// vpermw spreads the four fp16 scales (and Q4_1 mins) to their four 32-bit lanes each, one
// vcvtph2ps converts them. Accumulators stay lane-wise and are reduced once per row.

template <DType WT>
struct Q4QuadKernel {
  static constexpr bool kHasMin = WT == DType::Q4_1;
  static constexpr int kRows = 4, kTokens = kHasMin ? 3 : 4;
  // Decode (one token) goes one row at a time: each thread then reads one sequential stream,
  // which the hardware prefetcher follows at full bandwidth (several interleaved row streams
  // per thread measured 30-40% slower on Zen 4).
  static constexpr int kDecodeRows = 1;
  static constexpr int kBlockBytes = kHasMin ? 20 : 18;
  static constexpr int kQsOffset = kHasMin ? 4 : 2;
  static constexpr int kQuadWBytes = 4 * kBlockBytes;
  static constexpr int kSecond = kQuadWBytes - 64;  // offset of the second load
  static constexpr int kPrefetchBytes = 1024;

  // vpermt2w indices: word 8i + w <- word w of block i's qs, from the first load (index < 32)
  // or the second one (32 + its word index there).
  static __m512i qs_index() {
    alignas(64) int16_t idx[32];
    for (int j = 0; j < 32; ++j) {
      const int byte = kBlockBytes * (j / 8) + kQsOffset + 2 * (j % 8);
      idx[j] = static_cast<int16_t>(byte < 64 ? byte / 2 : 32 + (byte - kSecond) / 2);
    }
    return _mm512_load_si512(idx);
  }
  // vpermw indices: words 0..15 <- d of block j / 4; words 16..31 <- m of block (j - 16) / 4.
  static __m512i scale_index() {
    alignas(64) int16_t idx[32];
    for (int j = 0; j < 32; ++j) idx[j] = static_cast<int16_t>(kBlockBytes * ((j % 16) / 4) / 2 + (j >= 16 ? 1 : 0));
    return _mm512_load_si512(idx);
  }

  template <int R, int T, bool kTail>
  static inline void step(const uint8_t* const* w, const uint8_t* const* x, int64_t q, int nvalid, __m512 (&acc)[R][T],
                          __m512i qidx, __m512i sidx) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i lo[R], hi[R];
    __m512 dw[R];
    [[maybe_unused]] __m512 mw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w[r] + q * kQuadWBytes;
      __m512i a, b;
      if constexpr (kTail) {
        // Bytes of blocks past the row end read as zero (and their activations are zero).
        const int n = nvalid * kBlockBytes;
        a = _mm512_maskz_loadu_epi8(n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1, p);
        b = _mm512_maskz_loadu_epi8(n > kSecond ? (__mmask64{1} << (n - kSecond)) - 1 : 0, p + kSecond);
      } else {
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
        a = _mm512_loadu_si512(p);
        b = _mm512_loadu_si512(p + kSecond);
      }
      const __m512i qs = _mm512_permutex2var_epi16(a, qidx, b);
      lo[r] = _mm512_and_si512(qs, m4);
      hi[r] = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
      const __m512i sc = _mm512_permutexvar_epi16(sidx, a);
      dw[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
      if constexpr (kHasMin) mw[r] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc, 1));
    }
    quad_dot_tokens<R, T, kHasMin>(x, q, lo, hi, dw, mw, acc);
  }

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    const int64_t nb = a.k / kQK, nfull = nb / 4;
    TileOperands<uint8_t, uint8_t, 16, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    const __m512i qidx = qs_index(), sidx = scale_index();
    for (int64_t q = 0; q < nfull; ++q) step<R, T, false>(w, x, q, 4, acc, qidx, sidx);
    if (nb % 4) step<R, T, true>(w, x, nfull, static_cast<int>(nb % 4), acc, qidx, sidx);
    tl.store(a, r0, t0);
  }
};

// ---- activation quantizers (bit-identical to the scalar quantize_row) ---------------------

// Whether a sum of (v - v) terms shows a NaN or infinity among the v (quant_sym8's probe).
inline bool not_finite(__m512 probe) { return _mm512_cmp_ps_mask(probe, probe, _CMP_UNORD_Q) != 0; }

// One 32-element block: q0, q1 (elements 0..15, 16..31 as int32) and the scale d (NaN, with zero
// levels, for a block holding a NaN or infinity, as quant_sym8).
inline void quantize_block(const float* x, __m512i& q0, __m512i& q1, float& d) {
  const __m512 sign = _mm512_set1_ps(-0.f);
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  if (not_finite(_mm512_add_ps(_mm512_sub_ps(v0, v0), _mm512_sub_ps(v1, v1)))) {
    q0 = q1 = _mm512_setzero_si512();
    d = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
  d = amax / 127.f;
  const float id = amax != 0.f ? 127.f / amax : 0.f;
  q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));  // nearest-even
  q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
}

// A float through fp16 and back (the value the quantized block stores).
inline float fp16_round(float v) { return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT)); }

template <bool kWithSum>
void quantize_q8(const float* x, void* out, int64_t k) {
  using XB = std::conditional_t<kWithSum, BlockQ8_1, BlockQ8_0>;
  auto* b = static_cast<XB*>(out);
  for (int64_t i = 0; i < k / kQK; ++i, x += kQK) {
    __m512i q0, q1;
    float d;
    quantize_block(x, q0, q1, d);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16), _mm512_cvtsepi32_epi8(q1));
    b[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    if constexpr (kWithSum) {
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      b[i].s = _cvtss_sh(d * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT);
    }
  }
}

// Q8_K: one scale per 256 elements, and the sums of each 16 quantized values (one register).
void quantize_q8_k(const float* x, void* out, int64_t k) {
  auto* b = static_cast<BlockQ8_K*>(out);
  const __m512 sign = _mm512_set1_ps(-0.f);
  for (int64_t i = 0; i < k / kQK_K; ++i, x += kQK_K) {
    __m512 m = _mm512_setzero_ps(), probe = _mm512_setzero_ps();
    for (int j = 0; j < 16; ++j) {
      const __m512 v = _mm512_loadu_ps(x + 16 * j);
      m = _mm512_max_ps(m, _mm512_andnot_ps(sign, v));
      probe = _mm512_add_ps(probe, _mm512_sub_ps(v, v));
    }
    if (not_finite(probe)) {  // as quant_sym8: a NaN scale, zero levels and sums
      b[i].d = std::numeric_limits<float>::quiet_NaN();
      std::memset(b[i].qs, 0, sizeof b[i].qs);
      std::memset(b[i].bsums, 0, sizeof b[i].bsums);
      continue;
    }
    const float amax = _mm512_reduce_max_ps(m);
    b[i].d = amax / 127.f;
    const __m512 id = _mm512_set1_ps(amax != 0.f ? 127.f / amax : 0.f);
    for (int j = 0; j < 16; ++j) {
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * j), id));  // nearest-even
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16 * j), _mm512_cvtsepi32_epi8(q));
      b[i].bsums[j] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
  }
}

// The same quantization written in the quad layout (gemm/gemm_kernels.hpp) directly, without the
// intermediate rows: per block 16 bytes of lo, 16 of hi, four copies of d, and the four lane
// sums times -8 (Q8_0) or s in the first lane (Q8_1).
template <bool kWithSum>
void quantize_quads(const float* x, void* out, int64_t k) {
  const int64_t nb = k / kQK;
  auto* o = static_cast<uint8_t*>(out);
  if (nb % 4) std::memset(o + (nb / 4) * kQuadBytes, 0, kQuadBytes);  // padding blocks of the last quad
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    uint8_t* quad = o + (b / 4) * kQuadBytes;
    const int i = static_cast<int>(b % 4);
    __m512i q0, q1;
    float d;
    quantize_block(x, q0, q1, d);
    _mm_store_si128(reinterpret_cast<__m128i*>(quad + 16 * i), _mm512_cvtsepi32_epi8(q0));
    _mm_store_si128(reinterpret_cast<__m128i*>(quad + 64 + 16 * i), _mm512_cvtsepi32_epi8(q1));
    _mm_store_ps(reinterpret_cast<float*>(quad + 128) + 4 * i, _mm_set1_ps(fp16_round(d)));
    const __m512i s = _mm512_add_epi32(q0, q1);
    if constexpr (kWithSum) {
      const float sf = fp16_round(d * static_cast<float>(_mm512_reduce_add_epi32(s)));
      _mm_store_ps(reinterpret_cast<float*>(quad + 192) + 4 * i, _mm_set_ss(sf));
    } else {
      // Lane j of the block: elements 4j..4j+3 of lo and of hi, i.e. of q0 + q1.
      __m512i h = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_CDAB));
      h = _mm512_add_epi32(h, _mm512_shuffle_epi32(h, _MM_PERM_BADC));
      const __m128i sums = _mm512_castsi512_si128(_mm512_maskz_compress_epi32(0x1111, h));
      _mm_store_si128(reinterpret_cast<__m128i*>(quad + 192) + i, _mm_mullo_epi32(sums, _mm_set1_epi32(-8)));
    }
  }
}

}  // namespace

void add_gemm_avx512(GemmTable& t) {
  t.add(SimdLevel::avx512, DType::F32, {&gemm<FloatKernel<DType::F32>>});
  t.add(SimdLevel::avx512, DType::F16, {&gemm<FloatKernel<DType::F16>>});
  t.add(SimdLevel::avx512, DType::BF16, {&gemm<FloatKernel<DType::BF16>>});
  t.add(SimdLevel::avx512, DType::Q8_0, {&gemm<Block32Kernel<DType::Q8_0>>});
  t.add(SimdLevel::avx512, DType::Q4_0, {&gemm<Q4QuadKernel<DType::Q4_0>>, true});
  t.add(SimdLevel::avx512, DType::Q4_1, {&gemm<Q4QuadKernel<DType::Q4_1>>, true});
}

const ActQuantizers& act_quantizers_avx512() {
  static const ActQuantizers q{.q8_0 = &quantize_q8<false>,
                               .q8_1 = &quantize_q8<true>,
                               .q8_k = &quantize_q8_k,
                               .quads_q8_0 = &quantize_quads<false>,
                               .quads_q8_1 = &quantize_quads<true>};
  return q;
}

}  // namespace ember::cpu::detail
