#include "core/cpu_features.hpp"

#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/log.hpp"

namespace ember {
namespace {

bool level_supported(SimdLevel level, const CpuFeatures& f) {
  switch (level) {
    case SimdLevel::scalar: return true;
    case SimdLevel::avx2: return f.avx2;
    case SimdLevel::avx_vnni: return f.avx2 && f.avx_vnni;
    case SimdLevel::avx512: return f.avx2 && f.avx512 && f.avx512_vnni;
  }
  return false;
}

// The highest level at or below `level` that this CPU runs (a box may have AVX-512 but not
// AVX-VNNI, as AMD Zen 4).
SimdLevel supported_at_most(SimdLevel level) {
  const CpuFeatures& f = cpu_features();
  for (int l = static_cast<int>(level); l > 0; --l) {
    const SimdLevel s = static_cast<SimdLevel>(l);
    if (level_supported(s, f)) return s;
  }
  return SimdLevel::scalar;
}

SimdLevel initial_level() {
  SimdLevel level = SimdLevel::avx512;
  if (const char* env = std::getenv("EMBER_SIMD")) {
    bool known = false;
    for (int l = 0; l < kSimdLevels; ++l)
      if (std::strcmp(env, simd_level_name(static_cast<SimdLevel>(l))) == 0) level = static_cast<SimdLevel>(l), known = true;
    if (!known)
      log_warn("EMBER_SIMD={} is not a SIMD level (scalar, avx2, avx_vnni, avx512): using the best this CPU runs", env);
  }
  return supported_at_most(level);
}

std::atomic<int> g_level{-1};

}  // namespace

const char* prefetch_summary(const CpuFeatures& f) {
  if (f.stream_prefetch && f.tile_prefetch) return "prefetched";
  if (!f.stream_prefetch && !f.tile_prefetch) return "not prefetched";
  return f.tile_prefetch ? "prefetched in prompts' tiles, not in decode" : "prefetched in decode, not in prompts' tiles";
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
    f.avx_vnni = __builtin_cpu_supports("avxvnni");
    f.intel = __builtin_cpu_is("intel");
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
      const int base = static_cast<int>((eax >> 8) & 0xF);
      f.family = base == 0xF ? base + static_cast<int>((eax >> 20) & 0xFF) : base;
    }
    const bool amd = __builtin_cpu_is("amd");
    f.stream_prefetch = f.intel || (amd && f.family >= 26);
    f.tile_prefetch = f.intel || (amd && f.family >= 25);
    if (const char* env = std::getenv("EMBER_PREFETCH")) {
      f.stream_prefetch_forced = std::strcmp(env, "0") == 0 || std::strcmp(env, "1") == 0;
      if (f.stream_prefetch_forced) f.stream_prefetch = f.tile_prefetch = env[0] == '1';
      else log_warn("EMBER_PREFETCH={} is neither 0 nor 1: the weight streams are {}, as this CPU decides", env,
                    prefetch_summary(f));
    }
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

void set_simd_level(SimdLevel level) { g_level.store(static_cast<int>(supported_at_most(level)), std::memory_order_relaxed); }

bool simd_level_supported(SimdLevel level) { return level_supported(level, cpu_features()); }

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::avx512: return "avx512";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::avx_vnni: return "avx_vnni";
    default: return "scalar";
  }
}

}  // namespace ember
