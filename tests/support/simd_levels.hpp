// Running a kernel test at every SIMD level this CPU has.
#pragma once
#include <vector>

#include "core/cpu_features.hpp"

namespace ember::test_support {

// Restores the SIMD level a test changed.
struct SimdGuard {
  SimdLevel saved = simd_level();
  ~SimdGuard() { set_simd_level(saved); }
};

// scalar, then avx2, avx_vnni and avx512 where supported.
inline std::vector<SimdLevel> simd_levels() {
  std::vector<SimdLevel> v;
  for (int l = 0; l < kSimdLevels; ++l)
    if (simd_level_supported(static_cast<SimdLevel>(l))) v.push_back(static_cast<SimdLevel>(l));
  return v;
}

}  // namespace ember::test_support
