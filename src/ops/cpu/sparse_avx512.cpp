// AVX-512 kernels of the neuron-sparse FFN for one token (decode), working on groups of
// scattered rows at once.
//
// Why groups: an active row is a short read (1-2 KB) somewhere in a large matrix, so its first
// cache lines are a DRAM latency away and the hardware prefetcher has not seen it coming. Going
// through eight rows in step keeps eight independent streams in flight, and the rows of the next
// group are prefetched while the current one is computed (spread over the loop, a couple of
// lines per step, so that the prefetches do not queue up in front of the loads).
//
//   gather (gate, up; Q4_0 / Q4_1 rows, activations in the quad layout of kernels.hpp): every
//     row's dot product is the same chain of operations as in the dense decode kernel (lane-wise
//     accumulators over steps of four blocks, one horizontal sum), so the results are
//     bit-identical to matmul()'s rows.
//   axpy (down, neuron-major Q8_0 / Q4_0 / Q4_1 rows): 32 output floats stay in two registers
//     while the group's rows are added into them in list order, so each output element sees the
//     chain out += h0 w0, += h1 w1, ... exactly as the one-row-at-a-time kernel computes it
//     (rounded as it rounds, see add_block), at an eighth of the loads and stores of the output.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "ops/cpu/kernels.hpp"
#include "ops/cpu/sparse_impl.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

constexpr int kGroup = 8;  // rows in flight per thread

// How many rows ahead the prefetches run: about kPrefetchAhead bytes of rows, at least a group
// (short rows need more of them; 4 KB to 16 KB measured about the same).
constexpr int64_t kPrefetchAhead = 16384;
inline int64_t rows_ahead(size_t row_bytes) {
  return std::clamp<int64_t>(kPrefetchAhead / static_cast<int64_t>(row_bytes), kGroup, 8 * kGroup);
}

// Prefetches into L2 the lines that start in [p, p + n): one prefetch per line as the spans of
// a row go by; prefetch_row_start asks for the row's first line. The T0 hint (into L1) measured
// 5-8% slower: it holds the few L1 miss buffers longer.
inline void prefetch_span(const uint8_t* p, int n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), end = a + static_cast<uintptr_t>(n);
  for (uintptr_t line = (a + 63) & ~uintptr_t{63}; line < end; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T1);
}
inline void prefetch_row_start(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }

// ---- gather: 4-bit rows against the quad layout ------------------------------------------

template <DType WT>
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
    for (int r = 0; r < R; ++r) prefetch_row_start(next[r]);
    for (int64_t s = 0; s < full; ++s) {
      for (int r = 0; r < R; ++r) prefetch_span(next[r] + s * kStep, kStep);
      step<R, false>(w, x + s * kQuadBytes, s, 4, acc, qw, sw);
    }
    if (nb % 4) {
      for (int r = 0; r < R; ++r) prefetch_span(next[r] + full * kStep, static_cast<int>(nb % 4) * kBlock);
      step<R, true>(w, x + full * kQuadBytes, full, static_cast<int>(nb % 4), acc, qw, sw);
    }
    for (int r = 0; r < R; ++r) y[r] = _mm512_reduce_add_ps(acc[r]);
  }

  static void gather(const uint8_t* w, size_t stride, const int32_t* rows_, int64_t n, int64_t k, const uint8_t* x,
                     float* y) {
    const int64_t nb = k / kQK, ahead = rows_ahead(static_cast<size_t>(nb) * kBlock);
    const auto row = [&](int64_t i) { return w + static_cast<size_t>(rows_[std::min(i, n - 1)]) * stride; };
    for (int64_t i = 0; i < n; i += kGroup) {
      const uint8_t* cur[kGroup];
      const uint8_t* next[kGroup];
      for (int g = 0; g < kGroup; ++g) cur[g] = row(i + g), next[g] = row(i + ahead + g);
      switch (std::min<int64_t>(kGroup, n - i)) {
        case 8: rows<8>(cur, next, nb, x, y + i); break;
        case 7: rows<7>(cur, next, nb, x, y + i); break;
        case 6: rows<6>(cur, next, nb, x, y + i); break;
        case 5: rows<5>(cur, next, nb, x, y + i); break;
        case 4: rows<4>(cur, next, nb, x, y + i); break;
        case 3: rows<3>(cur, next, nb, x, y + i); break;
        case 2: rows<2>(cur, next, nb, x, y + i); break;
        default: rows<1>(cur, next, nb, x, y + i); break;
      }
    }
  }
};

// ---- axpy: neuron-major rows into the output -----------------------------------------------

// Bytes of one 32-value block.
template <DType T>
constexpr int kBlockBytes = T == DType::Q8_0 ? 34 : T == DType::Q4_1 ? 20 : 18;

// a0, a1 += h * (block at p), rounded as the one-row kernel rounds it. Q8_0 and Q4_0: the
// scale goes into the factor, (h * d) * q, which saves a multiply per 16 values (these kernels
// are bound by their int8-to-float conversions); Q4_1: one fused multiply-add on the exactly
// dequantized d * q + m.
template <DType T>
inline void add_block(const uint8_t* p, float h, __m512 hv, __m512& a0, __m512& a1) {
  if constexpr (T == DType::Q4_1) {
    // d * q is exact in float, so the fused multiply-add rounds as multiply-then-add does.
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(*reinterpret_cast<const uint16_t*>(p)));
    const __m512 m = _mm512_set1_ps(_cvtsh_ss(*reinterpret_cast<const uint16_t*>(p + 2)));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    a0 = _mm512_fmadd_ps(hv, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), m), a0);
    a1 = _mm512_fmadd_ps(hv, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), m), a1);
  } else {
    const __m512 hd = _mm512_set1_ps(h * _cvtsh_ss(*reinterpret_cast<const uint16_t*>(p)));
    if constexpr (T == DType::Q8_0) {
      const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
      const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18));
      a0 = _mm512_fmadd_ps(hd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), a0);
      a1 = _mm512_fmadd_ps(hd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), a1);
    } else {
      // Byte i holds values i (low nibble) and i + 16 (high): widened once, each nibble is the
      // index of q - 8 in a 16-float table (the permute reads only an index's low 4 bits).
      const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)));
      a0 = _mm512_fmadd_ps(hd, _mm512_permutexvar_ps(b, table), a0);
      a1 = _mm512_fmadd_ps(hd, _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table), a1);
    }
  }
}

template <DType T, int R>
void axpy_group(const uint8_t* const* src, const uint8_t* const* next, const float* h, float* out, int64_t nblocks) {
  constexpr int kBytes = kBlockBytes<T>;
  __m512 hv[R];
  for (int r = 0; r < R; ++r) hv[r] = _mm512_set1_ps(h[r]), prefetch_row_start(next[r]);
  // Two blocks at a time: four independent chains of fused multiply-adds hide their latency.
  int64_t b = 0;
  for (; b + 2 <= nblocks; b += 2, out += 2 * kQK) {
    __m512 a0 = _mm512_loadu_ps(out), a1 = _mm512_loadu_ps(out + 16);
    __m512 a2 = _mm512_loadu_ps(out + 32), a3 = _mm512_loadu_ps(out + 48);
    for (int r = 0; r < R; ++r) {
      prefetch_span(next[r] + b * kBytes, 2 * kBytes);
      add_block<T>(src[r] + b * kBytes, h[r], hv[r], a0, a1);
      add_block<T>(src[r] + (b + 1) * kBytes, h[r], hv[r], a2, a3);
    }
    _mm512_storeu_ps(out, a0);
    _mm512_storeu_ps(out + 16, a1);
    _mm512_storeu_ps(out + 32, a2);
    _mm512_storeu_ps(out + 48, a3);
  }
  if (b < nblocks) {
    __m512 a0 = _mm512_loadu_ps(out), a1 = _mm512_loadu_ps(out + 16);
    for (int r = 0; r < R; ++r) {
      prefetch_span(next[r] + b * kBytes, kBytes);
      add_block<T>(src[r] + b * kBytes, h[r], hv[r], a0, a1);
    }
    _mm512_storeu_ps(out, a0);
    _mm512_storeu_ps(out + 16, a1);
  }
}

template <DType T>
void axpy_rows(const uint8_t* d, size_t stride, size_t offset, const int32_t* rows, const float* h, int64_t n,
               float* out, int64_t len) {
  const int64_t nblocks = len / kQK, ahead = rows_ahead(static_cast<size_t>(nblocks) * kBlockBytes<T>);
  const auto row = [&](int64_t i) { return d + static_cast<size_t>(rows[std::min(i, n - 1)]) * stride + offset; };
  const uint8_t* cur[kGroup];
  const uint8_t* next[kGroup];
  float hc[kGroup];
  int c = 0;
  // Groups of kGroup rows with a nonzero factor, in list order (a zero adds exactly nothing).
  const auto flush = [&](int64_t after) {
    for (int g = 0; g < kGroup; ++g) next[g] = row(after + ahead - kGroup + g);
    switch (c) {
      case 8: axpy_group<T, 8>(cur, next, hc, out, nblocks); break;
      case 7: axpy_group<T, 7>(cur, next, hc, out, nblocks); break;
      case 6: axpy_group<T, 6>(cur, next, hc, out, nblocks); break;
      case 5: axpy_group<T, 5>(cur, next, hc, out, nblocks); break;
      case 4: axpy_group<T, 4>(cur, next, hc, out, nblocks); break;
      case 3: axpy_group<T, 3>(cur, next, hc, out, nblocks); break;
      case 2: axpy_group<T, 2>(cur, next, hc, out, nblocks); break;
      case 1: axpy_group<T, 1>(cur, next, hc, out, nblocks); break;
      default: break;
    }
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

}  // namespace

GatherFn sparse_gather_avx512(DType type) {
  switch (type) {
    case DType::Q4_0: return &QuadGather<DType::Q4_0>::gather;
    case DType::Q4_1: return &QuadGather<DType::Q4_1>::gather;
    default: return nullptr;
  }
}

AxpyRowsFn sparse_axpy_rows_avx512(DType type) {
  switch (type) {
    case DType::Q8_0: return &axpy_rows<DType::Q8_0>;
    case DType::Q4_0: return &axpy_rows<DType::Q4_0>;
    case DType::Q4_1: return &axpy_rows<DType::Q4_1>;
    default: return nullptr;
  }
}

}  // namespace ember::cpu::detail
