// Software prefetch of the KV cache's rows ahead of the attention loops that read them (the SIMD
// files' kernels, each loop over positions prefetching the row kKvAhead positions on). A decode
// step finds its cache rows evicted by the weights streamed since the step before, and the
// hardware prefetchers, given one head's slice of each position (a line or two at the cache's
// stride, for a few hundred positions), fetched them late: SmolLM2 at depth 224 decoded at 0.75x
// its depth-0 speed, with this at 0.96x (AMD Zen 5, docs/benchmarks.md).
#pragma once
#include <xmmintrin.h>

#include <cstdint>

namespace ember::cpu::detail {

constexpr int64_t kKvAhead = 16;  // positions: 16 and 32 measured alike, 4 and 8 slower, 64 slower

// The lines of elements [0, count) of a row at p (E: float or uint16_t) into L1.
template <class E>
inline void prefetch_kv_row(const E* p, int64_t count) {
  const char* b = reinterpret_cast<const char*>(p);
  const int64_t bytes = count * static_cast<int64_t>(sizeof(E));
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(b + o, _MM_HINT_T0);
  _mm_prefetch(b + bytes - 1, _MM_HINT_T0);  // the last line, where the row starts mid-line
}

// Row j + kKvAhead of a cache of n rows `stride` apart, where there is one.
template <class E>
inline void prefetch_kv_ahead(const E* base, int64_t stride, int64_t j, int64_t n, int64_t count) {
  if (j + kKvAhead < n) prefetch_kv_row(base + (j + kKvAhead) * stride, count);
}

}  // namespace ember::cpu::detail
