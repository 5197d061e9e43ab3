// AVX-512 kernel of the neuron-major 4-bit axpy (ops/cpu/nm4.hpp). Per segment, 64 outputs at a
// time: each neuron's codes are widened once and mapped to floats by a 16-entry permute (the
// permute reads an index's low 4 bits, so the low nibble needs no mask and the high one a
// shift), multiplied by its factor into four accumulators, and the segment's sums are scaled
// into the output once. The rows a little further down the list are prefetched on the way, as
// in the other grouped sparse kernels (sparse_avx512.cpp). Same operations per output as the
// scalar kernel, so the same bits.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "ops/cpu/nm4.hpp"

namespace ember::cpu::detail {
namespace {

constexpr int64_t kPrefetchAhead = 16384;  // bytes of rows ahead

inline void prefetch_line(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }

template <bool kMin>
inline __m512 table() {
  return kMin ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
              : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}

// out[k * 16 .. +16) = fma(d, acc[k], Q4_1: fma(m, s, out)) for the K vectors at `o`.
template <bool kMin, int K>
inline void scale_into(float* o, const uint16_t* d, const uint16_t* m, __m512 s, const __m512 (&acc)[4]) {
  for (int k = 0; k < K; ++k) {
    __m512 v = _mm512_loadu_ps(o + 16 * k);
    if constexpr (kMin)
      v = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + 16 * k))), s, v);
    v = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + 16 * k))), acc[k], v);
    _mm512_storeu_ps(o + 16 * k, v);
  }
}

template <bool kMin, int R>
void segment(const uint8_t* const* src, const uint8_t* const* next, const float* hs, const uint16_t* d,
             const uint16_t* m, int64_t len, float* out) {
  const __m512 lut = table<kMin>();
  const __m512 s = _mm512_set1_ps(kMin ? nm4_factor_sum(hs, R) : 0.0f);
  __m512 hv[R];
  for (int r = 0; r < R; ++r) hv[r] = _mm512_set1_ps(hs[r]);
  int64_t j = 0;
  for (; j + 64 <= len; j += 64) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int r = 0; r < R; ++r) {
      prefetch_line(next[r] + j / 2);
      const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src[r] + j / 2)));
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src[r] + j / 2 + 16)));
      acc[0] = _mm512_fmadd_ps(hv[r], _mm512_permutexvar_ps(a, lut), acc[0]);
      acc[1] = _mm512_fmadd_ps(hv[r], _mm512_permutexvar_ps(_mm512_srli_epi32(a, 4), lut), acc[1]);
      acc[2] = _mm512_fmadd_ps(hv[r], _mm512_permutexvar_ps(b, lut), acc[2]);
      acc[3] = _mm512_fmadd_ps(hv[r], _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut), acc[3]);
    }
    scale_into<kMin, 4>(out + j, d + j, m + j, s, acc);
  }
  if (j < len) {  // 32 outputs left
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int r = 0; r < R; ++r) {
      const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src[r] + j / 2)));
      acc[0] = _mm512_fmadd_ps(hv[r], _mm512_permutexvar_ps(a, lut), acc[0]);
      acc[1] = _mm512_fmadd_ps(hv[r], _mm512_permutexvar_ps(_mm512_srli_epi32(a, 4), lut), acc[1]);
    }
    scale_into<kMin, 2>(out + j, d + j, m + j, s, acc);
  }
}

template <bool kMin>
void axpy(const TensorView& D, const int32_t* rows, const float* h, int64_t n, int64_t col0, int64_t len,
          float* out) {
  const int64_t n_embd = D.cols();
  const size_t stride = D.row_stride();
  const uint8_t* base = D.data + col0 / 2;
  const int64_t ahead = std::clamp<int64_t>(kPrefetchAhead / std::max<int64_t>(len / 2, 1), kNm4Segment, 64);
  nm4_segments(rows, h, n, [&](const int32_t* ids, const float* hs, int c, int64_t block, int64_t after) {
    const uint8_t* src[kNm4Segment];
    const uint8_t* next[kNm4Segment];
    for (int r = 0; r < c; ++r) {
      src[r] = base + static_cast<size_t>(ids[r]) * stride;
      next[r] = base + static_cast<size_t>(rows[std::min(after + ahead - c + r, n - 1)]) * stride;
    }
    const uint16_t* d = nm4_scales(D, block) + col0;
    const uint16_t* m = d + n_embd;
    switch (c) {
      case 8: segment<kMin, 8>(src, next, hs, d, m, len, out); break;
      case 7: segment<kMin, 7>(src, next, hs, d, m, len, out); break;
      case 6: segment<kMin, 6>(src, next, hs, d, m, len, out); break;
      case 5: segment<kMin, 5>(src, next, hs, d, m, len, out); break;
      case 4: segment<kMin, 4>(src, next, hs, d, m, len, out); break;
      case 3: segment<kMin, 3>(src, next, hs, d, m, len, out); break;
      case 2: segment<kMin, 2>(src, next, hs, d, m, len, out); break;
      default: segment<kMin, 1>(src, next, hs, d, m, len, out); break;
    }
  });
}

}  // namespace

Nm4AxpyFn nm4_axpy_avx512(DType t) {
  if (t == DType::Q4_0_NM) return &axpy<false>;
  if (t == DType::Q4_1_NM) return &axpy<true>;
  return nullptr;
}

}  // namespace ember::cpu::detail
