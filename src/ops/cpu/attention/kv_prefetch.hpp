// Software prefetch of the KV cache's rows ahead of the attention loops that read them (the SIMD
// files' kernels, each loop over positions prefetching the row kKvAhead positions on). A decode
// step finds its cache rows evicted by the weights streamed since the step before, and the
// hardware prefetchers, given one head's slice of each position (a line or two at the cache's
// stride, for a few hundred positions), fetched them late: SmolLM2 at depth 224 decoded at 0.75x
// its depth-0 speed, with this at 0.96x (AMD Zen 5, docs/benchmarks.md).
#pragma once
#include <cstdint>

#include "ops/cpu/prefetch.hpp"

namespace ember::cpu::detail {

constexpr int64_t kKvAhead = 16;  // positions: 16 and 32 measured alike, 4 and 8 slower, 64 slower

// Elements [0, count) of row j + kKvAhead (E: float or uint16_t) of a cache of n rows `stride`
// apart, into L1, where there is such a row.
template <class E>
inline void prefetch_kv_ahead(const E* base, int64_t stride, int64_t j, int64_t n, int64_t count) {
  if (j + kKvAhead < n) prefetch_lines(base + (j + kKvAhead) * stride, static_cast<size_t>(count) * sizeof(E));
}

}  // namespace ember::cpu::detail
