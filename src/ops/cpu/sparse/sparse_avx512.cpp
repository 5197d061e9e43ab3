// AVX-512 kernels of the neuron-sparse FFN for one token (decode), working on groups of eight
// scattered rows at once (why groups, and the prefetches: sparse/sparse_groups.hpp).
//
//   gather (gate, up; Q4_0 / Q4_1 rows, activations in the quad layout of gemm/gemm_kernels.hpp): every
//     row's dot product is the same chain of operations as in the dense decode kernel (lane-wise
//     accumulators over steps of four blocks, one horizontal sum), so the results are
//     bit-identical to matmul()'s rows.
//   axpy (down, neuron-major Q8_0 / Q4_0 / Q4_1 rows): 32 output floats stay in two registers
//     while the group's rows are added into them in list order, so each output element sees the
//     chain out += h0 w0, += h1 w1, ... exactly as the one-row-at-a-time kernel computes it
//     (rounded as it rounds, see add_block), at an eighth of the loads and stores of the output.
//   up_down (up and down of the same neurons, sparse_up_down_rows): a group's up rows, then its
//     down rows, in turn, so that the next group's loads are in flight during the axpy's
//     arithmetic; bit-identical to the two kernels above one after the other.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "core/cpu_features.hpp"
#include "ops/cpu/gemm/gemm_kernels.hpp"
#include "ops/cpu/sparse/sparse_impl.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/sparse/sparse_groups.hpp"

constexpr int kGroup = 8;  // rows in flight per thread

// ---- gather: 4-bit rows against the quad layout ------------------------------------------

template <DType WT, int H>
struct QuadGather {
  static constexpr bool kMin = WT == DType::Q4_1;
  static constexpr int kBlock = kMin ? 20 : 18;  // bytes of one weight block
  static constexpr int kQsAt = kMin ? 4 : 2;     // offset of its quants
  static constexpr int kStep = 4 * kBlock;       // four blocks: one step
  static constexpr int kTailAt = kStep - 64;     // the second 64-byte load of a step

  // Word j of a step's quants (block j / 8, word j % 8) from the two loads.
  static __m512i quant_words() {
    alignas(64) int16_t idx[32];
    for (int j = 0; j < 32; ++j) {
      const int at = kBlock * (j / 8) + kQsAt + 2 * (j % 8);
      idx[j] = static_cast<int16_t>(at < 64 ? at / 2 : 32 + (at - kTailAt) / 2);
    }
    return _mm512_load_si512(idx);
  }
  // Words 0..15: scale d of block j / 4; words 16..31: min m of block (j - 16) / 4.
  static __m512i scale_words() {
    alignas(64) int16_t idx[32];
    for (int j = 0; j < 32; ++j) idx[j] = static_cast<int16_t>(kBlock * ((j & 15) / 4) / 2 + (j >> 4));
    return _mm512_load_si512(idx);
  }

  // One step (blocks 4s .. 4s + 3) of R rows; kTail: only `valid` blocks remain.
  template <int R, bool kTail>
  static inline void step(const uint8_t* const* w, const uint8_t* xs, int64_t s, int valid, __m512 (&acc)[R],
                          __m512i qw, __m512i sw) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i xlo = _mm512_load_si512(xs), xhi = _mm512_load_si512(xs + 64);
    const __m512 dx = _mm512_load_ps(xs + 128);
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w[r] + s * kStep;
      __m512i a, b;
      if constexpr (kTail) {
        const int n = valid * kBlock;  // bytes past the row end read as zero
        a = _mm512_maskz_loadu_epi8(n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1, p);
        b = _mm512_maskz_loadu_epi8(n > kTailAt ? (__mmask64{1} << (n - kTailAt)) - 1 : 0, p + kTailAt);
      } else {
        a = _mm512_loadu_si512(p);
        b = _mm512_loadu_si512(p + kTailAt);
      }
      const __m512i q = _mm512_permutex2var_epi16(a, qw, b);
      const __m512i sc = _mm512_permutexvar_epi16(sw, a);
      const __m512 scale = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(sc)), dx);
      __m512i dot = kMin ? _mm512_setzero_si512() : _mm512_load_si512(xs + 192);
      dot = _mm512_dpbusd_epi32(dot, _mm512_and_si512(q, nib), xlo);
      dot = _mm512_dpbusd_epi32(dot, _mm512_and_si512(_mm512_srli_epi16(q, 4), nib), xhi);
      if constexpr (kMin) {
        const __m512 m = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc, 1)), _mm512_load_ps(xs + 192));
        acc[r] = _mm512_add_ps(acc[r], _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, m));
      } else {
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
      }
    }
  }

  // y[r] = dot(row w[r], x) for r < R, prefetching the rows `next` on the way.
  template <int R>
  static void rows(const uint8_t* const* w, const uint8_t* const* next, int64_t nb, const uint8_t* x, float* y) {
    const __m512i qw = quant_words(), sw = scale_words();
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const int64_t full = nb / 4;
    for (int r = 0; r < R; ++r) prefetch_row_start<H>(next[r]);
    for (int64_t s = 0; s < full; ++s) {
      for (int r = 0; r < R; ++r) prefetch_span<H>(next[r] + s * kStep, kStep);
      step<R, false>(w, x + s * kQuadBytes, s, 4, acc, qw, sw);
    }
    if (nb % 4) {
      for (int r = 0; r < R; ++r) prefetch_span<H>(next[r] + full * kStep, static_cast<int>(nb % 4) * kBlock);
      step<R, true>(w, x + full * kQuadBytes, full, static_cast<int>(nb % 4), acc, qw, sw);
    }
    for (int r = 0; r < R; ++r) y[r] = _mm512_reduce_add_ps(acc[r]);
  }

  static void gather(const uint8_t* w, size_t stride, const int32_t* rows_, int64_t n, int64_t k, const uint8_t* x,
                     float* y) {
    const int64_t nb = k / kQK;
    grouped_rows<kGroup>(w, stride, rows_, n, static_cast<size_t>(nb) * kBlock,
                         [&](auto r, const uint8_t* const* cur, const uint8_t* const* next, int64_t i) {
                           rows<decltype(r)::value>(cur, next, nb, x, y + i);
                         });
  }
};

// ---- axpy: neuron-major rows into the output -----------------------------------------------

// Bytes of one 32-value block.
template <DType T>
constexpr int kBlockBytes = T == DType::Q8_0 ? 34 : T == DType::Q4_1 ? 20 : 18;

// a0, a1 += (block at p) times its factor f, rounded as the one-row kernel rounds it. Q8_0 and
// Q4_0: f = h * d, the block's scale in the factor, (h * d) * q, which saves a multiply per 16
// values; Q4_1: f = h, one fused multiply-add on the exactly dequantized d * q + m.
template <DType T>
inline void add_block(const uint8_t* p, __m512 f, __m512& a0, __m512& a1) {
  if constexpr (T == DType::Q4_1) {
    // d * q is exact in float, so the fused multiply-add rounds as multiply-then-add does.
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(*reinterpret_cast<const uint16_t*>(p)));
    const __m512 m = _mm512_set1_ps(_cvtsh_ss(*reinterpret_cast<const uint16_t*>(p + 2)));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    a0 = _mm512_fmadd_ps(f, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), m), a0);
    a1 = _mm512_fmadd_ps(f, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), m), a1);
  } else if constexpr (T == DType::Q8_0) {
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18));
    a0 = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), a0);
    a1 = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), a1);
  } else {
    // Byte i holds values i (low nibble) and i + 16 (high): widened once, each nibble is the
    // index of q - 8 in a 16-float table (the permute reads only an index's low 4 bits).
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)));
    a0 = _mm512_fmadd_ps(f, _mm512_permutexvar_ps(b, table), a0);
    a1 = _mm512_fmadd_ps(f, _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table), a1);
  }
}

// Blocks per span of the axpy: the factors of a span's blocks are computed together.
constexpr int64_t kSpan = 16;

// f[r * kSpan + i] = h[r] * (scale of block b0 + i of row r) for Q8_0 / Q4_0, i < kSpan (blocks
// past nblocks: 0). One gather of 16 scales and one multiply per row, where a block at a time
// cost a scalar conversion, multiply and broadcast per block (a quarter of the Q4_0 kernel's
// time). The products equal the scalar h * d bit for bit.
template <DType T, int R>
inline void block_factors(const uint8_t* const* src, const float* h, int64_t b0, int64_t nblocks, float* f) {
  const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32(kBlockBytes<T>));
  const __mmask16 valid =
      nblocks - b0 >= kSpan ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (nblocks - b0)) - 1);
  for (int r = 0; r < R; ++r) {
    // 32 bits at each block's start: its fp16 scale in the low half.
    const __m512i w = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, at, src[r] + b0 * kBlockBytes<T>, 1);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w));
    _mm512_store_ps(f + r * kSpan, _mm512_mul_ps(_mm512_set1_ps(h[r]), d));
  }
}

template <DType T, int R, int H>
void axpy_group(const uint8_t* const* src, const uint8_t* const* next, const float* h, float* out, int64_t nblocks) {
  constexpr int kBytes = kBlockBytes<T>;
  constexpr bool kFactors = T != DType::Q4_1;  // a factor per block (else h itself)
  alignas(64) float f[R * kSpan];
  for (int r = 0; r < R; ++r) prefetch_row_start<H>(next[r]);
  const auto factor = [&](int r, int64_t i) { return kFactors ? _mm512_set1_ps(f[r * kSpan + i]) : _mm512_set1_ps(h[r]); };
  for (int64_t b0 = 0; b0 < nblocks; b0 += kSpan) {
    if constexpr (kFactors) block_factors<T, R>(src, h, b0, nblocks, f);
    const int64_t span = std::min(kSpan, nblocks - b0);
    float* o = out + b0 * kQK;
    // Two blocks at a time: four independent chains of fused multiply-adds hide their latency.
    int64_t i = 0;
    for (; i + 2 <= span; i += 2, o += 2 * kQK) {
      __m512 a0 = _mm512_loadu_ps(o), a1 = _mm512_loadu_ps(o + 16);
      __m512 a2 = _mm512_loadu_ps(o + 32), a3 = _mm512_loadu_ps(o + 48);
      for (int r = 0; r < R; ++r) {
        const int64_t b = b0 + i;
        prefetch_span<H>(next[r] + b * kBytes, 2 * kBytes);
        add_block<T>(src[r] + b * kBytes, factor(r, i), a0, a1);
        add_block<T>(src[r] + (b + 1) * kBytes, factor(r, i + 1), a2, a3);
      }
      _mm512_storeu_ps(o, a0);
      _mm512_storeu_ps(o + 16, a1);
      _mm512_storeu_ps(o + 32, a2);
      _mm512_storeu_ps(o + 48, a3);
    }
    if (i < span) {
      __m512 a0 = _mm512_loadu_ps(o), a1 = _mm512_loadu_ps(o + 16);
      for (int r = 0; r < R; ++r) {
        prefetch_span<H>(next[r] + (b0 + i) * kBytes, kBytes);
        add_block<T>(src[r] + (b0 + i) * kBytes, factor(r, i), a0, a1);
      }
      _mm512_storeu_ps(o, a0);
      _mm512_storeu_ps(o + 16, a1);
    }
  }
}

template <DType T, int H>
void axpy_rows(const uint8_t* d, size_t stride, size_t offset, const int32_t* rows, const float* h, int64_t n,
               float* out, int64_t len) {
  const int64_t nblocks = len / kQK, ahead = rows_ahead<kGroup>(static_cast<size_t>(nblocks) * kBlockBytes<T>);
  const auto row = [&](int64_t i) { return d + static_cast<size_t>(rows[std::min(i, n - 1)]) * stride + offset; };
  const uint8_t* cur[kGroup];
  const uint8_t* next[kGroup];
  float hc[kGroup];
  int c = 0;
  // Groups of kGroup rows with a nonzero factor, in list order (a zero adds exactly nothing).
  const auto flush = [&](int64_t after) {
    if (c == 0) return;  // nothing gathered (an empty list, or only zero factors): no rows to read
    for (int g = 0; g < kGroup; ++g) next[g] = row(after + ahead - kGroup + g);
    with_rows<kGroup>(c, [&](auto r) { axpy_group<T, decltype(r)::value, H>(cur, next, hc, out, nblocks); });
    c = 0;
  };
  for (int64_t i = 0; i < n; ++i) {
    if (h[i] == 0.0f) continue;
    cur[c] = row(i);
    hc[c] = h[i];
    if (++c == kGroup) flush(i + 1);
  }
  flush(n);
}

// ---- up and down in one pass -----------------------------------------------------------------

// A group of up rows (a gather that waits on memory), then the same neurons' down rows (an axpy
// bound by its arithmetic), in turn: the prefetches of the next group's rows run while this
// group's arithmetic does. Each row's dot and each output element's chain of adds are those of
// the gather and the axpy kernels above, so the results are theirs bit for bit.
template <DType UT, DType DT, int H>
void up_down(const uint8_t* up, size_t up_stride, const uint8_t* down, size_t down_stride, const int32_t* rows,
             const float* g, int64_t n, int64_t k, const uint8_t* x, float* h, float* out) {
  const int64_t nb = k / kQK;
  const auto up_row = [&](int64_t i) { return up + static_cast<size_t>(rows[std::min(i, n - 1)]) * up_stride; };
  const auto down_row = [&](int64_t i) {
    return down + static_cast<size_t>(rows[std::min(i, n - 1)]) * down_stride;
  };
  for (int64_t g0 = 0; g0 < std::min<int64_t>(n, kGroup); ++g0)
    prefetch_row_start<H>(up_row(g0)), prefetch_row_start<H>(down_row(g0));
  for (int64_t i = 0; i < n; i += kGroup) {
    const int64_t m = std::min<int64_t>(kGroup, n - i);
    const uint8_t* cur[kGroup];
    const uint8_t* next[kGroup];
    for (int j = 0; j < kGroup; ++j) cur[j] = up_row(i + j), next[j] = up_row(i + kGroup + j);
    with_rows<kGroup>(m, [&](auto r) { QuadGather<UT, H>::template rows<decltype(r)::value>(cur, next, nb, x, h + i); });
    // The down rows of the neurons with a nonzero value (a zero adds exactly nothing).
    float hc[kGroup];
    int c = 0;
    for (int64_t j = 0; j < m; ++j) {
      h[i + j] *= g[i + j];
      if (h[i + j] != 0.0f) cur[c] = down_row(i + j), hc[c++] = h[i + j];
    }
    for (int j = 0; j < kGroup; ++j) next[j] = down_row(i + kGroup + j);
    with_rows<kGroup>(c, [&](auto r) { axpy_group<DT, decltype(r)::value, H>(cur, next, hc, out, nb); });
  }
}

template <int H>
GatherFn gather_for(DType type) {
  switch (type) {
    case DType::Q4_0: return &QuadGather<DType::Q4_0, H>::gather;
    case DType::Q4_1: return &QuadGather<DType::Q4_1, H>::gather;
    default: return nullptr;
  }
}

template <int H>
AxpyRowsFn axpy_rows_for(DType type) {
  switch (type) {
    case DType::Q8_0: return &axpy_rows<DType::Q8_0, H>;
    case DType::Q4_0: return &axpy_rows<DType::Q4_0, H>;
    case DType::Q4_1: return &axpy_rows<DType::Q4_1, H>;
    default: return nullptr;
  }
}

template <DType UT, int H>
UpDownFn up_down_for(DType down) {
  switch (down) {
    case DType::Q8_0: return &up_down<UT, DType::Q8_0, H>;
    case DType::Q4_0: return &up_down<UT, DType::Q4_0, H>;
    case DType::Q4_1: return &up_down<UT, DType::Q4_1, H>;
    default: return nullptr;
  }
}

template <int H>
UpDownFn up_down_for(DType up, DType down) {
  switch (up) {
    case DType::Q4_0: return up_down_for<DType::Q4_0, H>(down);
    case DType::Q4_1: return up_down_for<DType::Q4_1, H>(down);
    default: return nullptr;
  }
}

}  // namespace

void add_sparse_avx512(SparseTables& t) {
  const SimdLevel l = SimdLevel::avx512;
  const bool l1 = into_l1();
  for (DType w : {DType::Q4_0, DType::Q4_1})
    t.gather.add(l, w, l1 ? gather_for<_MM_HINT_T0>(w) : gather_for<_MM_HINT_T1>(w));
  for (DType w : {DType::Q8_0, DType::Q4_0, DType::Q4_1})
    t.axpy_rows.add(l, w, l1 ? axpy_rows_for<_MM_HINT_T0>(w) : axpy_rows_for<_MM_HINT_T1>(w));
}

UpDownFn sparse_up_down_avx512(DType up, DType down) {
  return into_l1() ? up_down_for<_MM_HINT_T0>(up, down) : up_down_for<_MM_HINT_T1>(up, down);
}

}  // namespace ember::cpu::detail
