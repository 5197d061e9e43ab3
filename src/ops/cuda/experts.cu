// A mixture's experts, several in one launch (see cuda_ops.hpp: experts_gate_up, experts_down).
// Each block takes kMvWarps rows of one expert (blockIdx.y) over that expert's slots, a warp a
// row as matvec_kernel does it (the same lane_dots, warp sums and float operations), so a call
// gives the bits of the three matvecs an expert it replaces, from one launch per step.
#include <algorithm>

#include "ops/cuda/matvec.cuh"

namespace ember::cuda {

using namespace detail;

namespace {

struct Runs {  // a launch's experts, by value in its arguments
  ExpertRun r[kExpertsPerLaunch];
};

// gate_up: h[s][i] = (up_i . x[s]) * act(gate_i . x[s]); otherwise out[s][i] = down_i . x[s].
template <DType T, bool kGateUp>
__global__ void __launch_bounds__(kMvWarps * kWarp)
    experts_kernel(Runs runs, int64_t rows, int64_t cols, const void* x, int64_t n_slots, float* y, cpu::Activation act) {
  const ExpertRun& e = runs.r[blockIdx.y];
  const int lane = threadIdx.x % kWarp;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMvWarps + threadIdx.x / kWarp;
  const bool valid = i < rows;  // a warp past the end still takes part in the (uniform) shuffles
  const auto* w0 = static_cast<const uint8_t*>(kGateUp ? e.gate : e.down);
  const auto* w1 = static_cast<const uint8_t*>(e.up);
  const int64_t end = static_cast<int64_t>(e.first) + e.n;
  for (int64_t t0 = e.first; t0 < end; t0 += kMvTokens) {
    const int ng = static_cast<int>(end - t0 < kMvTokens ? end - t0 : kMvTokens);
    float a0[kMvTokens], a1[kMvTokens];
#pragma unroll
    for (int j = 0; j < kMvTokens; ++j) a0[j] = a1[j] = 0.0f;
    if (valid) {
      lane_dots<T>(w0, rows, cols, i, x, n_slots, t0, ng, lane, a0);
      if constexpr (kGateUp) lane_dots<T>(w1, rows, cols, i, x, n_slots, t0, ng, lane, a1);
    }
#pragma unroll
    for (int j = 0; j < kMvTokens; ++j) {
      a0[j] = warp_sum(a0[j]);
      if constexpr (kGateUp) a1[j] = warp_sum(a1[j]);
    }
    if (!valid || lane != 0) continue;
    for (int j = 0; j < ng; ++j) y[(t0 + j) * rows + i] = kGateUp ? a1[j] * act_value(act, a0[j]) : a0[j];
  }
}

template <bool kGateUp>
void launch(DType type, const ExpertRun* runs, int n_runs, int64_t rows, int64_t cols, Activations x, int64_t n_slots,
            float* y, cpu::Activation act, void* stream) {
  check_type(type, cols);
  const void* xp = takes_q8(type) ? x.q8 : static_cast<const void*>(x.f);
  EMBER_CHECK(xp, "CUDA experts: {} rows need {} activations", dtype_name(type), takes_q8(type) ? "8-bit" : "float");
  for (int r0 = 0; r0 < n_runs; r0 += kExpertsPerLaunch) {
    const int k = std::min(kExpertsPerLaunch, n_runs - r0);
    Runs rs{};
    for (int j = 0; j < k; ++j) {
      const ExpertRun& e = runs[r0 + j];
      EMBER_CHECK(e.first >= 0 && e.n >= 0 && e.first + e.n <= n_slots, "CUDA experts: slots {} .. {} of {}", e.first,
                  e.first + e.n, n_slots);
      rs.r[j] = e;
    }
    const dim3 grid(grid_of(rows, kMvWarps), static_cast<unsigned>(k));
    by_type(type, [&](auto tag) {
      constexpr DType T = decltype(tag)::value;
      experts_kernel<T, kGateUp><<<grid, kMvWarps * kWarp, 0, as_stream(stream)>>>(rs, rows, cols, xp, n_slots, y, act);
    });
    launched("experts kernel");
  }
}

}  // namespace

void experts_gate_up(const ExpertShape& shape, const ExpertRun* runs, int n_runs, Activations x, int64_t n_slots,
                     float* h, void* stream) {
  launch<true>(shape.gate_up, runs, n_runs, shape.n_ff, shape.n_embd, x, n_slots, h, shape.act, stream);
}

void experts_down(const ExpertShape& shape, const ExpertRun* runs, int n_runs, Activations h, int64_t n_slots,
                  float* out, void* stream) {
  launch<false>(shape.down, runs, n_runs, shape.n_embd, shape.n_ff, h, n_slots, out, shape.act, stream);
}

}  // namespace ember::cuda
