// What the CPU can do, read once; kernels pick their variant from it.
#pragma once
#include <string>

namespace ember {

struct CpuFeatures {
  bool avx2 = false;      // with FMA and F16C
  bool avx512 = false;    // F, BW, VL, DQ
  bool avx512_vnni = false;
  bool intel = false;     // the vendor, where kernels tune for it (the sparse kernels' prefetch hint)
};

enum class SimdLevel { scalar = 0, avx2 = 1, avx512 = 2 };

const CpuFeatures& cpu_features();
// The best level this CPU supports, capped by EMBER_SIMD=scalar|avx2|avx512 when set.
SimdLevel simd_level();
const char* simd_level_name(SimdLevel level);
// Overrides the level (tests use it to run every variant); clamps to what the CPU supports.
void set_simd_level(SimdLevel level);

}  // namespace ember
