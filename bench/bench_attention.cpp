// Micro-benchmarks of the CPU attention over a filled KV cache: one decode step (one token, all
// heads) and a 512-token prompt, at three models' head layouts, with an F32 or an F16 cache.
//   ember-bench-micro --benchmark_filter=Attention
// Reports the cache bytes read per second (each K and V value once per step); EMBER_SIMD=avx2
// or scalar runs the portable kernel for comparison.
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "ops/cpu/attention/attention.hpp"
#include "tensor/quant.hpp"
#include "bench_support.hpp"

using namespace ember;
using bench::pool;

namespace {

struct Layout {
  const char* name;
  int64_t n_head, n_head_kv, head_dim;
};

const Layout kLayouts[] = {{"TinyLlama", 32, 4, 64}, {"Mistral", 32, 8, 128}, {"Gemma3-270M", 4, 1, 256}, {"SmolLM2", 9, 3, 64}};

// n_tokens queries at the end of a context of `depth` + n_tokens positions.
void BM_Attention(benchmark::State& state, Layout l, bool f16, int64_t depth, int64_t n_tokens) {
  cpu::AttentionShape s{l.n_head, l.n_head_kv, l.head_dim, 1.0f / std::sqrt(static_cast<float>(l.head_dim)), 0, 0};
  s.kv_f16 = f16;
  const int64_t n_ctx = depth + n_tokens, row = l.n_head_kv * l.head_dim;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 1.f);
  // The caches in AlignedBuffers, as the engine's KvCache (huge pages when large).
  std::vector<float> q(n_tokens * l.n_head * l.head_dim);
  AlignedBuffer<float> k(n_ctx * row), v(n_ctx * row);
  for (auto& x : q) x = dist(rng);
  for (size_t i = 0; i < k.size(); ++i) k[i] = dist(rng), v[i] = dist(rng);
  AlignedBuffer<uint16_t> k16(k.size()), v16(v.size());
  quantize_row(DType::F16, k.data(), k16.data(), static_cast<int64_t>(k.size()));
  quantize_row(DType::F16, v.data(), v16.data(), static_cast<int64_t>(v.size()));
  const void* kp = f16 ? static_cast<const void*>(k16.data()) : k.data();
  const void* vp = f16 ? static_cast<const void*>(v16.data()) : v.data();
  std::vector<float> out(q.size()), scratch(cpu::attention_scratch_floats(n_ctx, l.n_head, l.head_dim, pool().size()));
  for (auto _ : state) {
    cpu::attention(pool(), s, q.data(), n_tokens, depth, kp, vp, row, out.data(), scratch.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * n_ctx * row * (f16 ? 2 : 4));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(n_tokens * state.iterations()), benchmark::Counter::kIsRate);
  state.counters["threads"] = pool().size();
}

int register_all() {
  for (const Layout& l : kLayouts)
    for (bool f16 : {false, true}) {
      const std::string cache = f16 ? "F16" : "F32";
      for (int64_t depth : {256, 512, 4096}) {
        const std::string name = std::string("AttentionDecode/") + l.name + "/" + cache + "/d" + std::to_string(depth);
        benchmark::RegisterBenchmark(name.c_str(), BM_Attention, l, f16, depth, 1)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
      const std::string name = std::string("AttentionPrompt512/") + l.name + "/" + cache;
      benchmark::RegisterBenchmark(name.c_str(), BM_Attention, l, f16, 0, 512)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  return 0;
}

const int registered = register_all();

}  // namespace
