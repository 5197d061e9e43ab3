// Software prefetch of a span of memory: every cache line holding one of its bytes, once.
#pragma once
#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

namespace ember::cpu {

// The lines holding bytes [p, p + n), with hint H (_MM_HINT_T0: into L1; T1: into L2).
template <int H = _MM_HINT_T0>
inline void prefetch_lines(const void* p, size_t n) {
  if (n == 0) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), end = a + n;
  for (uintptr_t line = a & ~uintptr_t{63}; line < end; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), static_cast<_mm_hint>(H));
}

}  // namespace ember::cpu
