// Micro-benchmarks of the CPU matmul: decode (n = 1, memory-bound: bytes/s of weights read) and
// prompt processing (n = 512, compute-bound: also reports FLOP/s) at two Llama-1B-like shapes.
//   ember-bench-micro --benchmark_filter=Matvec
// Names ending in _R16: the same weights repacked 16 rows at a time (ops/cpu/r16/r16.hpp), as the
// engine loads them where it can.
// Thread count: EMBER_BENCH_THREADS (default 2); EMBER_BENCH_HOT=1: decode weights stay in cache.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "ops/cpu/bandwidth.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/r16/r16.hpp"
#include "tensor/quant.hpp"
#include "bench_support.hpp"

using namespace ember;
using bench::make_weights;
using bench::pool;
using bench::Weights;

namespace {

// A batch of at most this many tokens reads its weights from memory as decode does (an expert's
// share of a prompt: a few tokens each).
constexpr int64_t kFewTokens = 8;

void BM_Matmul(benchmark::State& state, DType t, int64_t rows, int64_t k, int64_t n, bool repacked) {
  // Decode reads weights from memory, not cache: cycle through copies totalling >= 256 MiB
  // (8x a 32 MiB L3).
  Weights w = make_weights(t, rows, k);
  AlignedBuffer<uint8_t> packed;
  if (repacked) {
    packed.resize(w.view.nbytes);
    cpu::repack_r16(t, w.view.data, rows, k, packed.data());
    w.view.type = cpu::r16_type(t);
    w.view.data = packed.data();
  }
  // EMBER_BENCH_HOT=1 keeps one copy (in cache): the kernel's compute speed rather than memory's.
  const bool hot = std::getenv("EMBER_BENCH_HOT") != nullptr;
  const size_t copies = n <= kFewTokens && !hot ? std::max<size_t>(1, bench::memory_span() / w.view.nbytes + 1) : 1;
  AlignedBuffer<uint8_t> pool_bytes(w.view.nbytes * copies);
  for (size_t c = 0; c < copies; ++c) std::memcpy(pool_bytes.data() + c * w.view.nbytes, w.view.data, w.view.nbytes);
  TensorView view = w.view;
  size_t next = 0;
  std::vector<float> x(n * k), y(n * rows);
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (auto& v : x) v = dist(rng);
  AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(w.view.type, k, n) + 1);
  for (auto _ : state) {
    view.data = pool_bytes.data() + next * w.view.nbytes;
    next = next + 1 == copies ? 0 : next + 1;
    cpu::matmul(pool(), view, x.data(), n, y.data(), scratch.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.view.nbytes));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * k * n * 1e-9 * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
  state.counters["threads"] = pool().size();
}

void BM_ReadBandwidth(benchmark::State& state) {
  double bw = 0;
  for (auto _ : state) bw = cpu::measure_read_bandwidth(pool(), size_t{1} << 30);
  state.counters["GB/s"] = bw * 1e-9;
  state.counters["threads"] = pool().size();
}

// The sparse axpy's access pattern without its arithmetic (ops/cpu/bandwidth.hpp): what
// SparseAxpy/Q4_0_NM/OUTxIN/P% (bench_sparse.cpp) could read at most, rows of OUT / 2 bytes.
void BM_ScatteredRead(benchmark::State& state, size_t row_bytes, int percent) {
  double bw = 0;
  for (auto _ : state) bw = cpu::measure_scattered_read_bandwidth(pool(), size_t{1} << 30, row_bytes, percent / 100.0);
  state.counters["GB/s"] = bw * 1e-9;
  state.counters["threads"] = pool().size();
}

const struct {
  const char* name;
  DType type;
} kTypes[] = {{"Q4_0", DType::Q4_0}, {"Q4_1", DType::Q4_1}, {"Q8_0", DType::Q8_0}, {"F16", DType::F16},
    {"Q5_0", DType::Q5_0}, {"Q5_1", DType::Q5_1}, {"Q2_K", DType::Q2_K}, {"Q3_K", DType::Q3_K},
    {"Q4_K", DType::Q4_K}, {"Q5_K", DType::Q5_K}, {"Q6_K", DType::Q6_K}};

void BM_Repack(benchmark::State& state, DType t, int64_t rows, int64_t k) {
  Weights w = make_weights(t, rows, k);
  AlignedBuffer<uint8_t> packed(w.view.nbytes);
  for (auto _ : state) {
    cpu::repack_r16(t, w.view.data, rows, k, packed.data());
    benchmark::DoNotOptimize(packed.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.view.nbytes));
}

const int64_t kShapes[][2] = {{2048, 2048}, {5632, 2048}, {4096, 4096}, {28672, 4096}, {4096, 14336}};

int register_all() {
  benchmark::RegisterBenchmark("ReadBandwidth/1GiB", BM_ReadBandwidth)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
  for (size_t row : {2048, 3072, 14336})
    for (int percent : {50, 100})
      benchmark::RegisterBenchmark(("ScatteredRead/1GiB/" + std::to_string(row) + "B/" + std::to_string(percent) + "%").c_str(),
                                   BM_ScatteredRead, row, percent)
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  for (const auto& t : kTypes)
    for (const auto& s : kShapes)
      for (bool repacked : {false, true}) {
        if (repacked && (!cpu::r16_fast() || cpu::r16_type(t.type) == t.type)) continue;
        for (int64_t n : {1, 512}) {
          const std::string name = std::string(n == 1 ? "Matvec/" : "Matmul512/") + t.name + (repacked ? "_R16/" : "/") +
                                   std::to_string(s[0]) + "x" + std::to_string(s[1]);
          benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, t.type, s[0], s[1], n, repacked)
              ->Unit(n == 1 ? benchmark::kMicrosecond : benchmark::kMillisecond)
              ->UseRealTime();
        }
      }
  // An expert's matrices of the Qwen3-MoE shape (768 x 2048 gate / up, 2048 x 768 down) over the
  // few tokens a prompt routes to each expert, from memory: Experts/TYPE_R16/ROWSxK/TOKENS.
  for (DType t : {DType::Q4_0, DType::Q4_K, DType::Q6_K})
    for (const auto& s : {std::pair<int64_t, int64_t>{768, 2048}, std::pair<int64_t, int64_t>{2048, 768}})
      for (int64_t n : {1, 2, 3, 4, 5, 6, 8}) {
        if (!cpu::r16_fast() || cpu::r16_type(t) == t) continue;
        const std::string name = std::string("Experts/") + std::string(dtype_name(t)) + "_R16/" + std::to_string(s.first) +
                                 "x" + std::to_string(s.second) + "/" + std::to_string(n);
        benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, t, s.first, s.second, n, true)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
  // Repacking into the 16-row layouts (one thread): what the loader and the memory tier pay for
  // each matrix; 768 x 2048 is an expert's matrix of the Qwen3-MoE shapes.
  for (const auto& t : kTypes)
    for (const auto& s : {std::pair<int64_t, int64_t>{768, 2048}, std::pair<int64_t, int64_t>{2048, 5632}}) {
      if (!cpu::r16_fast() || cpu::r16_type(t.type) == t.type) continue;
      const std::string name = std::string("Repack/") + t.name + "/" + std::to_string(s.first) + "x" + std::to_string(s.second);
      benchmark::RegisterBenchmark(name.c_str(), BM_Repack, t.type, s.first, s.second)->Unit(benchmark::kMicrosecond)->UseRealTime();
    }
  // A predictor's two layers at the 1.1B shape (rank 64): fc1 [2048 -> 64], fc2 [64 -> 5632].
  for (DType t : {DType::Q8_0, DType::Q4_0})
    for (const auto& s : {std::pair<int64_t, int64_t>{64, 2048}, std::pair<int64_t, int64_t>{5632, 64}})
      for (bool repacked : {false, true}) {
        if (repacked && (!cpu::r16_fast() || cpu::r16_type(t) == t)) continue;
        const std::string name = std::string("Predictor/") + std::string(dtype_name(t)) + (repacked ? "_R16/" : "/") +
                                 std::to_string(s.first) + "x" + std::to_string(s.second);
        benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, t, s.first, s.second, int64_t{1}, repacked)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
  return 0;
}

const int registered = register_all();

}  // namespace
