// The weight stream's software prefetch for the 16-row repacked kernels' frames (r16/r16_avx2.hpp,
// r16/r16_avx512.hpp): what a call of a kernel's block function fetches, kR16PrefetchAhead bytes
// ahead of its reads, where it pays (CpuFeatures::stream_prefetch for one token, tile_prefetch for
// tiles of several). Inside an anonymous namespace:
// each translation unit keeps its own copy, compiled for its own target.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "core/cpu_features.hpp"

namespace ember::cpu::detail {
namespace {

// How far ahead of the reads the stream is fetched (into L2). On Intel Xeon (the 2026-11-24 box)
// the hardware prefetchers alone held a core's stream to about 12.5 GB/s with both cores reading,
// and decode of the 1.1B Q4_0 synth went 43.6 -> 53.4 tok/s with it (2.5 to 3.5 KB ahead measured
// alike, 4 KB and more a little slower); on AMD Zen 5 the K-quants' streams, with twice Q4_0's
// operations a byte, fell behind without it (1.1B Q4_K decode 57.7 -> 73.7 tok/s at AVX-512; 1.5
// to 3 KB ahead alike). Only a group's first tile of tokens prefetches: the tiles after it find
// the group in cache.
constexpr size_t kR16PrefetchAhead = 3072;
template <int T>
inline bool r16_prefetch() {
  return T > 1 ? cpu_features().tile_prefetch : cpu_features().stream_prefetch;
}

// The lines [from, from + bytes) a call fetches (none where `from` is null): all at once (all()),
// or spread over the kernel's steps, share i of kShares at step i (share<kShares>(i)). A K-quant's
// long block (Q4_K 36 lines, Q6_K 53) fetched in one burst at its start held its loop back (in
// cache, one thread, Zen 5: Matvec Q4_K 1.07-1.12x and Q6_K 1.09-1.16x at AVX2 spread; the 1.1B
// Q4_K synth's decode 1.15x where memory is slow, level where it is fast: docs/benchmarks.md).
struct R16Fetch {
  const uint8_t* from = nullptr;
  size_t bytes = 0;  // a multiple of 64
  template <int kShares>
  void share(int i) const {
    if (from == nullptr) return;
    const size_t per = (bytes / 64 + kShares - 1) / kShares * 64, end = per * static_cast<size_t>(i + 1);
    for (size_t o = per * static_cast<size_t>(i); o < end && o < bytes; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(from + o), _MM_HINT_T1);
  }
  void all() const { share<1>(0); }
};

// Bytes [lo, hi) of the block at p, kR16PrefetchAhead on, where `on`.
inline R16Fetch r16_fetch(bool on, const uint8_t* p, size_t lo, size_t hi) {
  return on ? R16Fetch{p + kR16PrefetchAhead + lo, hi - lo} : R16Fetch{};
}
// A block of kGroupBytes in whole lines, and half of them.
template <size_t kGroupBytes>
constexpr size_t kR16FetchBytes = (kGroupBytes + 63) / 64 * 64;
template <size_t kGroupBytes>
constexpr size_t kR16FetchHalf = (kR16FetchBytes<kGroupBytes> / 64 + 1) / 2 * 64;

}  // namespace
}  // namespace ember::cpu::detail
