// AVX2 + FMA + F16C kernels. One 32-element block per 256-bit step. 4-bit weights enter
// vpmaddubsw as unsigned 0..15 with 8 * (activation pair sums) subtracted; 8-bit weights use the
// sign trick (|w| times sign-adjusted activations) since w + 128 would saturate the 16-bit sums.
#include <immintrin.h>

#include <array>
#include <type_traits>

#include "ops/cpu/gemm/gemm_table.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/gemm/tile_driver.hpp"

// ---- float weights ----------------------------------------------------------------------

template <DType WT>
struct FloatKernel {
  static constexpr int kRows = 3, kTokens = 4;

  static __m256 load_w(const uint8_t* p, int64_t i) {
    if constexpr (WT == DType::F32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + i);
    } else {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(p) + i));
      if constexpr (WT == DType::F16) return _mm256_cvtph_ps(h);
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
  static float load_w1(const uint8_t* p, int64_t i) {
    if constexpr (WT == DType::F32) return reinterpret_cast<const float*>(p)[i];
    const uint16_t h = reinterpret_cast<const uint16_t*>(p)[i];
    if constexpr (WT == DType::F16) return _cvtsh_ss(h);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    TileOperands<uint8_t, float, 8, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    int64_t i = 0;
    for (; i + 8 <= a.k; i += 8) {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = load_w(w[r], i);
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_loadu_ps(x[t] + i);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    tl.store(a, r0, t0, [&](__m256 v, int r, int t) {  // the elements after the last 8
      float s = F32Lanes<8>::reduce_add(v);
      for (int64_t j = i; j < a.k; ++j) s += load_w1(w[r], j) * x[t][j];
      return s;
    });
  }
};

// ---- 32-element block types -------------------------------------------------------------

template <DType WT>
struct Block32Kernel {
  static constexpr int kRows = 2, kTokens = 4;
  // Decode reads one row at a time: one sequential weight stream per thread (see Q4QuadKernel).
  static constexpr int kDecodeRows = 1;
  using WB = std::conditional_t<WT == DType::Q4_0, BlockQ4_0, std::conditional_t<WT == DType::Q4_1, BlockQ4_1, BlockQ8_0>>;
  using XB = std::conditional_t<WT == DType::Q4_1, BlockQ8_1, BlockQ8_0>;

  static __m256i decode(const WB* b) {
    if constexpr (WT == DType::Q8_0) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
    } else {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs));
      return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
    }
  }

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    const int64_t nb = a.k / kQK;
    TileOperands<WB, XB, 8, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    [[maybe_unused]] float msum[R][T] = {};
    const __m256i ones = _mm256_set1_epi16(1), eights = _mm256_set1_epi8(8);
    for (int64_t b = 0; b < nb; ++b) {
      __m256i q[R];
      float dw[R];
      [[maybe_unused]] float mw[R];
      for (int r = 0; r < R; ++r) {
        q[r] = decode(w[r] + b);
        dw[r] = _cvtsh_ss(w[r][b].d);
        if constexpr (WT == DType::Q4_1) mw[r] = _cvtsh_ss(w[r][b].m);
      }
      [[maybe_unused]] __m256i qabs[R];
      if constexpr (WT == DType::Q8_0)
        for (int r = 0; r < R; ++r) qabs[r] = _mm256_sign_epi8(q[r], q[r]);
      for (int t = 0; t < T; ++t) {
        const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].qs));
        const float da = _cvtsh_ss(x[t][b].d);
        [[maybe_unused]] __m256i off;
        if constexpr (WT == DType::Q4_0) off = _mm256_maddubs_epi16(eights, xa);
        for (int r = 0; r < R; ++r) {
          __m256i p16;
          if constexpr (WT == DType::Q8_0) {
            p16 = _mm256_maddubs_epi16(qabs[r], _mm256_sign_epi8(xa, q[r]));
          } else {
            p16 = _mm256_maddubs_epi16(q[r], xa);
            if constexpr (WT == DType::Q4_0) p16 = _mm256_sub_epi16(p16, off);
          }
          const __m256i p = _mm256_madd_epi16(p16, ones);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw[r] * da), acc[r][t]);
          if constexpr (WT == DType::Q4_1) msum[r][t] += mw[r] * _cvtsh_ss(x[t][b].s);
        }
      }
    }
    tl.store(a, r0, t0, [&](__m256 v, int r, int t) {
      float s = F32Lanes<8>::reduce_add(v);
      if constexpr (WT == DType::Q4_1) s += msum[r][t];
      return s;
    });
  }
};

}  // namespace

void add_gemm_avx2(GemmTable& t) {
  t.add(SimdLevel::avx2, DType::F32, {&gemm<FloatKernel<DType::F32>>});
  t.add(SimdLevel::avx2, DType::F16, {&gemm<FloatKernel<DType::F16>>});
  t.add(SimdLevel::avx2, DType::BF16, {&gemm<FloatKernel<DType::BF16>>});
  t.add(SimdLevel::avx2, DType::Q8_0, {&gemm<Block32Kernel<DType::Q8_0>>});
  t.add(SimdLevel::avx2, DType::Q4_0, {&gemm<Block32Kernel<DType::Q4_0>>});
  t.add(SimdLevel::avx2, DType::Q4_1, {&gemm<Block32Kernel<DType::Q4_1>>});
}

}  // namespace ember::cpu::detail
