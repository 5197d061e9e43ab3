// What the CPU can do, read once; kernels pick their variant from it.
#pragma once
#include <string>

namespace ember {

struct CpuFeatures {
  bool avx2 = false;      // with FMA and F16C
  bool avx512 = false;    // F, BW, VL, DQ
  bool avx512_vnni = false;
  bool avx_vnni = false;  // vpdpbusd on 256-bit registers without AVX-512 (Intel Alder Lake and later)
  bool intel = false;     // the vendor, where kernels tune for it (the sparse kernels' prefetch hint)
  int family = 0;         // the CPU family (base + extended): AMD Zen 3 and 4 are 25, Zen 5 is 26
  // Whether the dense kernels' weight streams read faster with software prefetch ahead of them
  // than with the hardware prefetchers alone. One token (decode): Intel (Sapphire Rapids: 1.1B
  // Q4_0 decode 1.23x) and AMD from Zen 5 (the Q4_K decode 1.28x), not Zen 4, where decode
  // measured 0.80-0.86x with it. Tiles of several tokens (prompts, a mixture's experts), which
  // fetch the next row group while they compute this one: also AMD Zen 3 / 4 (family 25; Zen 4:
  // the mixtures' prompts 1.14-1.28x, dense prompts 0.97-1.09x). EMBER_PREFETCH=0|1 sets both.
  bool stream_prefetch = false;
  bool tile_prefetch = false;
  bool stream_prefetch_forced = false;  // by EMBER_PREFETCH
};

// avx_vnni is AVX2 with vpdpbusd on 256 bits: only 8-bit dot products have kernels of their own
// there; everything else runs its AVX2 kernels (vector_level()).
enum class SimdLevel { scalar = 0, avx2 = 1, avx_vnni = 2, avx512 = 3 };
constexpr int kSimdLevels = 4;

const CpuFeatures& cpu_features();
// The weight streams' software prefetch in words: "prefetched", "not prefetched" or
// "prefetched in prompts' tiles, not in decode".
const char* prefetch_summary(const CpuFeatures& f);
// The best level this CPU supports, capped by EMBER_SIMD=scalar|avx2|avx_vnni|avx512 when set.
SimdLevel simd_level();
const char* simd_level_name(SimdLevel level);
// The level of the float and quantizing kernels: simd_level(), with avx_vnni read as avx2.
inline SimdLevel vector_level() {
  const SimdLevel l = simd_level();
  return l == SimdLevel::avx_vnni ? SimdLevel::avx2 : l;
}
// Overrides the level (tests use it to run every variant): the highest level at or below it that
// the CPU supports.
void set_simd_level(SimdLevel level);
bool simd_level_supported(SimdLevel level);

}  // namespace ember
