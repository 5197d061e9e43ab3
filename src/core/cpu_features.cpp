#include "core/cpu_features.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace ember {
namespace {

SimdLevel best_supported() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512 && f.avx512_vnni && f.avx2) return SimdLevel::avx512;
  if (f.avx2) return SimdLevel::avx2;
  return SimdLevel::scalar;
}

SimdLevel initial_level() {
  SimdLevel level = best_supported();
  if (const char* env = std::getenv("EMBER_SIMD")) {
    if (std::strcmp(env, "scalar") == 0) level = SimdLevel::scalar;
    else if (std::strcmp(env, "avx2") == 0 && level >= SimdLevel::avx2) level = SimdLevel::avx2;
  }
  return level;
}

std::atomic<int> g_level{-1};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
    f.intel = __builtin_cpu_is("intel");
    return f;
  }();
  return features;
}

SimdLevel simd_level() {
  int v = g_level.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(initial_level());
    g_level.store(v, std::memory_order_relaxed);
  }
  return static_cast<SimdLevel>(v);
}

void set_simd_level(SimdLevel level) {
  SimdLevel best = best_supported();
  if (level > best) level = best;
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::avx512: return "avx512";
    case SimdLevel::avx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace ember
