// Micro-benchmarks of the neuron-sparse decode kernels (ops/cpu/sparse/sparse.hpp) at the 1.1B FFN
// shape (n_ff 5632, n_embd 2048): gather_matmul over a sorted random subset of gate/up rows and
// sparse_axpy over the same subset of a neuron-major down, one token. Bytes/s counts the rows
// read; compare with Matvec/<type>/5632x2048 (bench_matmul.cpp) for the dense rate.
//   ember-bench-micro --benchmark_filter=Sparse
// Threads: EMBER_BENCH_THREADS (default 2). EMBER_BENCH_HOT=1: one copy of the weights (in cache),
// the kernels' compute speed rather than memory's.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench_support.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/nm4/nm4.hpp"
#include "ops/cpu/sparse/sparse.hpp"

using namespace ember;

namespace {

constexpr int64_t kNff = 5632, kNembd = 2048;

// A sorted random subset of [0, n) with `percent` % of the rows.
std::vector<int32_t> active_rows(int64_t n, int percent) {
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(3);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(n * percent / 100));
  std::sort(all.begin(), all.end());
  return all;
}

std::vector<float> random_vector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

void BM_Gather(benchmark::State& state, DType t, int percent) {
  const bench::Weights w = bench::make_weights(t, kNff, kNembd);
  bench::MemoryCopies copies(w.view);
  const auto active = active_rows(kNff, percent);
  const auto x = random_vector(kNembd, 2);
  std::vector<float> y(active.size());
  AlignedBuffer<uint8_t> scratch(cpu::gather_matmul_scratch_bytes(t, kNembd, 1));
  const int64_t na = static_cast<int64_t>(active.size());
  for (auto _ : state) {
    cpu::gather_matmul(bench::pool(), copies.advance(w.view), x.data(), 1, active.data(), na, y.data(), na,
                       scratch.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * na * static_cast<int64_t>(w.view.row_stride()));
  state.counters["threads"] = bench::pool().size();
}

void BM_Axpy(benchmark::State& state, DType t, int percent) {
  const bench::Weights w = bench::make_weights(t, kNff, kNembd);  // neuron-major: a row per neuron
  bench::MemoryCopies copies(w.view);
  const auto active = active_rows(kNff, percent);
  const int64_t na = static_cast<int64_t>(active.size());
  const auto h = random_vector(na, 4);
  std::vector<float> out(kNembd), scratch(cpu::sparse_axpy_scratch_floats(kNembd, 1, bench::pool().size(),
                                                                           cpu::AxpySplit::columns));
  for (auto _ : state) {
    cpu::sparse_axpy(bench::pool(), copies.advance(w.view), active.data(), na, h.data(), 1, na, out.data(), kNembd,
                     scratch.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * na * static_cast<int64_t>(w.view.row_stride()));
  state.counters["threads"] = bench::pool().size();
}

// The same over an input-channel-major 4-bit copy (Q4_0_NM: the file's codes, scale tables per
// 32 rows; Q4_0_NM8: those tables in 8 bits) at the 7B shapes input sparsity reads: 4096
// outputs x 4096 inputs (q / o), 6144 x 4096 (q, k, v side by side), 28672 x 4096 (gate and up
// side by side), 4096 x 14336 (down): the kept rows in order; and 2048 x 1024, a 1 MiB copy that
// stays in L2 with EMBER_BENCH_HOT=1: the kernel's compute rate. Bytes/s counts the rows and the
// tables of the blocks with a kept row; compare with Matvec/Q4_0(_R16)/4096x4096 for the dense
// rate.
void BM_AxpyNm4(benchmark::State& state, DType type, int64_t kOut, int64_t kN, int percent) {
  const bench::Weights file = bench::make_weights(DType::Q4_0, kOut, kN);  // input-major, as in GGUF
  const cpu::NeuronMajorMatrix nm = cpu::make_neuron_major(bench::pool(), file.view, type);
  bench::MemoryCopies copies(nm.view);
  const auto active = active_rows(kN, percent);
  const int64_t na = static_cast<int64_t>(active.size());
  const auto h = random_vector(na, 4);
  std::vector<float> out(kOut), scratch(cpu::sparse_axpy_scratch_floats(kOut, 1, bench::pool().size(),
                                                                        cpu::AxpySplit::columns));
  for (auto _ : state) {
    cpu::sparse_axpy(bench::pool(), copies.advance(nm.view), active.data(), na, h.data(), 1, na, out.data(), kOut,
                     scratch.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  int64_t blocks = 0;
  for (int64_t i = 0; i < na; ++i) blocks += i == 0 || active[i] / 32 != active[i - 1] / 32 ? 1 : 0;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          (na * kOut / 2 + blocks * static_cast<int64_t>(cpu::nm4_block_table_bytes(type, kOut))));
  state.counters["threads"] = bench::pool().size();
}

// Up and down of the same active neurons on the pool's threads (each an equal share of the
// list), as the fused decode runs them: `one_pass` = sparse_up_down_rows, else the gather and
// the axpy in turn; `bundled`: each neuron's up and down rows one after the other (as the
// resident copy lays them out), else two matrices. Bytes/s counts the up and down rows read.
void BM_UpDown(benchmark::State& state, bool one_pass, bool bundled, int percent) {
  const DType t = DType::Q4_0;
  // Rows of 2 x n_embd: up's row then down's (the two matrices' are their halves when not bundled).
  const bench::Weights w = bench::make_weights(t, kNff, 2 * kNembd);
  bench::MemoryCopies copies(w.view);
  const size_t rb = row_bytes(t, kNembd);
  const auto active = active_rows(kNff, percent);
  const int64_t na = static_cast<int64_t>(active.size());
  const auto x = random_vector(kNembd, 2);
  const auto g = random_vector(na, 5);
  AlignedBuffer<uint8_t> xq(cpu::matmul_scratch_bytes(t, kNembd, 1));
  cpu::quantize_activations(t, x.data(), 1, kNembd, xq.data());
  const int nth = bench::pool().size();
  std::vector<std::vector<float>> out(nth, std::vector<float>(kNembd)), h(nth, std::vector<float>(na)),
      tmp(nth, std::vector<float>(kNembd));
  for (auto _ : state) {
    const uint8_t* base = copies.advance(w.view).data;
    TensorView up = matrix_view(t, base, kNff, kNembd), down = up;
    if (bundled) {
      down.data = base + rb;
      up.stride = down.stride = 2 * rb;
    } else {
      down.data = base + rb * kNff;  // the second half of the copy
    }
    bench::pool().run([&](int ith, int n) {
      int64_t i0, i1;
      split_range(na, ith, n, i0, i1);
      float* o = out[ith].data();
      float* hv = h[ith].data();
      if (one_pass) {
        cpu::sparse_up_down_rows(up, xq.data(), down, active.data() + i0, i1 - i0, g.data() + i0, hv, o,
                                 tmp[ith].data());
      } else {
        cpu::gather_matmul_rows(up, xq.data(), 1, active.data() + i0, i1 - i0, hv, i1 - i0);
        for (int64_t i = 0; i < i1 - i0; ++i) hv[i] *= g[i0 + i];
        cpu::sparse_axpy_rows(down, active.data() + i0, i1 - i0, hv, 1, i1 - i0, 0, kNembd, o, kNembd,
                              tmp[ith].data());
      }
    });
    benchmark::DoNotOptimize(out[0].data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * na * 2 * static_cast<int64_t>(rb));
  state.counters["threads"] = nth;
}

int register_all() {
  for (int percent : {10, 25, 50}) {
    for (auto [name, t] : {std::pair{"Q4_0", DType::Q4_0}, std::pair{"Q4_1", DType::Q4_1}})
      benchmark::RegisterBenchmark(("SparseGather/" + std::string(name) + "/5632x2048/" + std::to_string(percent) + "%").c_str(),
                                   BM_Gather, t, percent)->Unit(benchmark::kMicrosecond)->UseRealTime();
    for (auto [name, t] : {std::pair{"Q8_0", DType::Q8_0}, std::pair{"Q4_0", DType::Q4_0}})
      benchmark::RegisterBenchmark(("SparseAxpy/" + std::string(name) + "/5632x2048/" + std::to_string(percent) + "%").c_str(),
                                   BM_Axpy, t, percent)->Unit(benchmark::kMicrosecond)->UseRealTime();
    for (auto [name, one_pass, bundled] : {std::tuple{"gather+axpy", false, false},
                                          std::tuple{"one_pass", true, false},
                                          std::tuple{"one_pass_bundled", true, true}})
      benchmark::RegisterBenchmark(("SparseUpDown/Q4_0/5632x2048/" + std::to_string(percent) + "%/" + name).c_str(),
                                   BM_UpDown, one_pass, bundled, percent)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
  }
  for (auto [out, in] : {std::pair<int64_t, int64_t>{4096, 4096}, {28672, 4096}, {6144, 4096}, {4096, 14336}, {2048, 5632},
                         {2048, 1024}})
    for (int percent : {10, 25, 50, 100})
      for (DType t : {DType::Q4_0_NM, DType::Q4_0_NM8})
        benchmark::RegisterBenchmark(("SparseAxpy/" + std::string(dtype_name(t)) + "/" + std::to_string(out) + "x" +
                                      std::to_string(in) + "/" + std::to_string(percent) + "%").c_str(),
                                     BM_AxpyNm4, t, out, in, percent)->Unit(benchmark::kMicrosecond)->UseRealTime();
  return 0;
}
const int registered = register_all();

}  // namespace
