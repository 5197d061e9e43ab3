// AVX2 + FMA + F16C kernels of the neuron-sparse FFN.
//   rows (down): one neuron-major row (or a slice of it) dequantized in registers and accumulated
//     into the output, out += h * w. For Q8_0 and Q4_0 the block scale goes into the factor,
//     out += (h * d) * q; the other types add h * w with w computed exactly as dequantize_row
//     computes it. The dequantize kernels give dequantize_row's bits.
//   gather (gate, up; Q4_0 / Q4_1 rows against one token's Q8_0 / Q8_1 blocks): groups of four
//     scattered rows in step (sparse/sparse_groups.hpp), each row's dot product the chain of the
//     dense row kernel (gemm/gemm_avx2.cpp's Block32Kernel): per block the integer sums
//     (vpmaddubsw, Q4_0's 8 x the activations' pair sums off, vpmaddwd) converted and added into
//     8 float lanes times d_w d_x, Q4_1's m_w s_x summed apart, then the lanes' sum; so the
//     results are bit-identical to matmul()'s rows at AVX2 and AVX-VNNI.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/cpu_features.hpp"
#include "ops/cpu/sparse/sparse_impl.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/simd_f32.hpp"
#include "ops/cpu/sparse/sparse_groups.hpp"

inline float half(uint16_t h) { return _cvtsh_ss(h); }

// kStore: dst = w (dequantize); otherwise dst += h * w.
template <bool kStore>
inline void put(float* dst, __m256 w, __m256 hv) {
  if constexpr (kStore) _mm256_storeu_ps(dst, w);
  else _mm256_storeu_ps(dst, _mm256_fmadd_ps(hv, w, _mm256_loadu_ps(dst)));
}
template <bool kStore>
inline void put1(float* dst, float w, float h) {
  if constexpr (kStore) *dst = w;
  else *dst = std::fma(h, w, *dst);
}

// 16 signed bytes -> two vectors of 8 floats.
inline void bytes_to_floats(__m128i q, __m256& a, __m256& b) {
  a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
}

// One block of 32 signed values q with scale d: dequantize (dst = d * q), or dst += (h * d) * q
// (the scale in the factor: one multiply per block instead of one per 8 values).
template <bool S>
inline void put_block(float* dst, __m128i q_lo16, __m128i q_hi16, float d, float h) {
  const __m256 f = _mm256_set1_ps(S ? d : h * d);
  __m256 a, c;
  bytes_to_floats(q_lo16, a, c);
  if constexpr (S) {
    _mm256_storeu_ps(dst, _mm256_mul_ps(f, a));
    _mm256_storeu_ps(dst + 8, _mm256_mul_ps(f, c));
  } else {
    _mm256_storeu_ps(dst, _mm256_fmadd_ps(f, a, _mm256_loadu_ps(dst)));
    _mm256_storeu_ps(dst + 8, _mm256_fmadd_ps(f, c, _mm256_loadu_ps(dst + 8)));
  }
  bytes_to_floats(q_hi16, a, c);
  if constexpr (S) {
    _mm256_storeu_ps(dst + 16, _mm256_mul_ps(f, a));
    _mm256_storeu_ps(dst + 24, _mm256_mul_ps(f, c));
  } else {
    _mm256_storeu_ps(dst + 16, _mm256_fmadd_ps(f, a, _mm256_loadu_ps(dst + 16)));
    _mm256_storeu_ps(dst + 24, _mm256_fmadd_ps(f, c, _mm256_loadu_ps(dst + 24)));
  }
}

template <bool S>
void q4_0(float h, const uint8_t* src, float* out, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ4_0*>(src);
  const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
  for (int64_t ib = 0; ib < n / kQK; ++ib, out += kQK) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), mask), eight);
    put_block<S>(out, lo, hi, half(b[ib].d), h);
  }
}

template <bool S>
void q4_1(float h, const uint8_t* src, float* out, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ4_1*>(src);
  const __m256 hv = _mm256_set1_ps(h);
  const __m128i mask = _mm_set1_epi8(0x0f);
  for (int64_t ib = 0; ib < n / kQK; ++ib, out += kQK) {
    const __m256 d = _mm256_set1_ps(half(b[ib].d)), m = _mm256_set1_ps(half(b[ib].m));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs));
    const __m128i lo = _mm_and_si128(q, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    __m256 a, c;
    // d * q is exact in float (11-bit times 4-bit), so a fused multiply-add rounds as the
    // reference's multiply-then-add does.
    bytes_to_floats(lo, a, c);
    put<S>(out, _mm256_fmadd_ps(d, a, m), hv);
    put<S>(out + 8, _mm256_fmadd_ps(d, c, m), hv);
    bytes_to_floats(hi, a, c);
    put<S>(out + 16, _mm256_fmadd_ps(d, a, m), hv);
    put<S>(out + 24, _mm256_fmadd_ps(d, c, m), hv);
  }
}

template <bool S>
void q8_0(float h, const uint8_t* src, float* out, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(src);
  for (int64_t ib = 0; ib < n / kQK; ++ib, out += kQK)
    put_block<S>(out, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs)),
                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs + 16)), half(b[ib].d), h);
}

template <bool S>
void f32(float h, const uint8_t* src, float* out, int64_t n) {
  const auto* w = reinterpret_cast<const float*>(src);
  const __m256 hv = _mm256_set1_ps(h);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) put<S>(out + j, _mm256_loadu_ps(w + j), hv);
  for (; j < n; ++j) put1<S>(out + j, w[j], h);
}

template <bool S>
void f16(float h, const uint8_t* src, float* out, int64_t n) {
  const auto* w = reinterpret_cast<const uint16_t*>(src);
  const __m256 hv = _mm256_set1_ps(h);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    put<S>(out + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j))), hv);
  for (; j < n; ++j) put1<S>(out + j, half(w[j]), h);
}

template <bool S>
void bf16(float h, const uint8_t* src, float* out, int64_t n) {
  const auto* w = reinterpret_cast<const uint16_t*>(src);
  const __m256 hv = _mm256_set1_ps(h);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j)));
    put<S>(out + j, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), hv);
  }
  for (; j < n; ++j) {
    float v;
    const uint32_t bits = static_cast<uint32_t>(w[j]) << 16;
    __builtin_memcpy(&v, &bits, 4);
    put1<S>(out + j, v, h);
  }
}

template <void (*F)(float, const uint8_t*, float*, int64_t)>
void as_dequant(const uint8_t* src, float* dst, int64_t n) {
  F(1.0f, src, dst, n);
}

// ---- gather: 4-bit rows against one token's activation blocks -----------------------------

constexpr int kGroup = 4;  // rows in flight per thread: four accumulators and the shared operands

template <DType WT, int H>
struct BlockGather {
  static constexpr bool kMin = WT == DType::Q4_1;
  using WB = std::conditional_t<kMin, BlockQ4_1, BlockQ4_0>;
  using XB = std::conditional_t<kMin, BlockQ8_1, BlockQ8_0>;

  // y[r] = dot(row w[r], x) for r < R, prefetching the rows `next` on the way.
  template <int R>
  static void rows(const uint8_t* const* w, const uint8_t* const* next, int64_t nb, const XB* x, float* y) {
    __m256 acc[R];
    [[maybe_unused]] float msum[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), msum[r] = 0.0f;
    const __m256i ones = _mm256_set1_epi16(1), eights = _mm256_set1_epi8(8), nib = _mm256_set1_epi8(0x0F);
    for (int r = 0; r < R; ++r) prefetch_row_start<H>(next[r]);
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
      const float da = _cvtsh_ss(x[b].d);
      [[maybe_unused]] __m256i off;
      if constexpr (!kMin) off = _mm256_maddubs_epi16(eights, xa);
#pragma GCC unroll 4  // the accumulators stay in registers
      for (int r = 0; r < R; ++r) {
        prefetch_span<H>(next[r] + b * static_cast<int64_t>(sizeof(WB)), sizeof(WB));
        const WB& blk = reinterpret_cast<const WB*>(w[r])[b];
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
        const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), nib);
        __m256i p16 = _mm256_maddubs_epi16(q, xa);
        if constexpr (!kMin) p16 = _mm256_sub_epi16(p16, off);
        const __m256i p = _mm256_madd_epi16(p16, ones);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(_cvtsh_ss(blk.d) * da), acc[r]);
        if constexpr (kMin) msum[r] += _cvtsh_ss(blk.m) * _cvtsh_ss(x[b].s);
      }
    }
    for (int r = 0; r < R; ++r) {
      float s = F32Lanes<8>::reduce_add(acc[r]);
      if constexpr (kMin) s += msum[r];
      y[r] = s;
    }
  }

  static void gather(const uint8_t* w, size_t stride, const int32_t* rows_, int64_t n, int64_t k, const uint8_t* x,
                     float* y) {
    const int64_t nb = k / kQK;
    const auto* xb = reinterpret_cast<const XB*>(x);
    grouped_rows<kGroup>(w, stride, rows_, n, static_cast<size_t>(nb) * sizeof(WB),
                         [&](auto r, const uint8_t* const* cur, const uint8_t* const* next, int64_t i) {
                           rows<decltype(r)::value>(cur, next, nb, xb, y + i);
                         });
  }
};

template <int H>
void add_gathers(SparseTables& t, SimdLevel l) {
  t.gather_blocks.add(l, DType::Q4_0, &BlockGather<DType::Q4_0, H>::gather);
  t.gather_blocks.add(l, DType::Q4_1, &BlockGather<DType::Q4_1, H>::gather);
}

}  // namespace

void add_sparse_avx2(SparseTables& t) {
  const SimdLevel l = SimdLevel::avx2;
  t.rows.add(l, DType::F32, {.axpy = &f32<false>, .dequant = &as_dequant<&f32<true>>});
  t.rows.add(l, DType::F16, {.axpy = &f16<false>, .dequant = &as_dequant<&f16<true>>});
  t.rows.add(l, DType::BF16, {.axpy = &bf16<false>, .dequant = &as_dequant<&bf16<true>>});
  t.rows.add(l, DType::Q8_0, {.axpy = &q8_0<false>, .dequant = &as_dequant<&q8_0<true>>});
  t.rows.add(l, DType::Q4_0, {.axpy = &q4_0<false>, .dequant = &as_dequant<&q4_0<true>>});
  t.rows.add(l, DType::Q4_1, {.axpy = &q4_1<false>, .dequant = &as_dequant<&q4_1<true>>});
  if (into_l1()) add_gathers<_MM_HINT_T0>(t, l);
  else add_gathers<_MM_HINT_T1>(t, l);
}

}  // namespace ember::cpu::detail
