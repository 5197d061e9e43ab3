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

// scalar, then avx2 and avx512 where supported.
inline std::vector<SimdLevel> simd_levels() {
  std::vector<SimdLevel> v{SimdLevel::scalar};
  if (cpu_features().avx2) v.push_back(SimdLevel::avx2);
  if (cpu_features().avx512 && cpu_features().avx512_vnni) v.push_back(SimdLevel::avx512);
  return v;
}

}  // namespace ember::test_support
