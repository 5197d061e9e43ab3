// Devices of the hybrid engine (issue 5). A device holds its share of each layer's FFN neurons
// (the rows of gate, up and the neuron-major down of the neurons a plan gives it, copied into its
// own memory) and computes, for a batch of tokens, the partial FFN output over those of its
// neurons that fire, while the CPU computes the rest. Two implementations: CpuDevice (a second
// CPU device on threads of its own, standing in for a GPU where there is none, so that the split,
// ordering and merge are tested everywhere) and the CUDA device (ops/cuda/, when built).
//
// Memory is accounted: a device allocates exactly gpu_ffn_bytes(plan) (sparse/plan.hpp) in one
// arena laid out by FfnArenaLayout, the function the solvers count with.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/thread_pool.hpp"
#include "model/model.hpp"
#include "ops/cpu/sparse.hpp"
#include "sparse/plan.hpp"

namespace ember {

// Where everything lives in a device's FFN arena: per layer the share's gate, up and down rows
// and its row list (0..k-1), then the scratch. Each buffer is padded to kGpuAlign; `total`
// equals gpu_ffn_bytes(model, opts, plan).
struct FfnArenaLayout {
  struct Share {
    int64_t n = 0;  // neurons
    uint64_t gate = 0, up = 0, down = 0, rows = 0;  // byte offsets
  };
  std::vector<Share> layers;
  uint64_t x = 0, out = 0, act = 0, h = 0, active = 0, pos = 0;  // scratch offsets
  uint64_t total = 0;
};
FfnArenaLayout ffn_arena_layout(const PlanModel& m, const PlanOptions& opts, const Plan& plan);

// The weights of an FFN share: row i of gate, up and down_nm belongs to the share's neuron i.
struct FfnShareWeights {
  TensorView gate, up, down_nm;
};

// Per-call scratch of ffn_share_partial, for up to max_batch tokens and n rows.
struct FfnShareScratch {
  float* act = nullptr;     // [max_batch][n]
  float* h = nullptr;       // [max_batch][n]
  int32_t* active = nullptr;  // [n] rows of the firing neurons
  int32_t* pos = nullptr;     // [n] their positions in `rows`
  void* mm = nullptr;         // gather_matmul_scratch_bytes(type, n_embd, max_batch)
  float* axpy = nullptr;      // sparse_axpy_scratch_floats(n_embd, max_batch, threads)
};

// out[t] = sum over rows[i] (i < n_rows) whose |act(gate . x[t])| > threshold for some token of
// the batch: act(gate . x[t]) * (up . x[t]) * down_nm row. out holds n * n_embd floats and is
// overwritten. Returns the number of (token, neuron) pairs that fired.
uint64_t ffn_share_partial(ThreadPool& pool, const FfnShareWeights& w, const int32_t* rows, int64_t n_rows,
                           cpu::Activation act, float threshold, const float* x, int64_t n, float* out,
                           const FfnShareScratch& s);

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;
  // Allocates the arena (ffn_arena_layout) and copies every layer's share: rows of w.gate and
  // w.up and of the neuron-major down `down_nm[layer]` for the plan's neuron ids.
  virtual void load(const Model& model, const std::vector<TensorView>& down_nm, const PlanModel& pm,
                    const PlanOptions& opts, const Plan& plan) = 0;
  // Starts layer `layer`'s partial FFN on n <= max_batch tokens (x: n * n_embd floats, read
  // before ffn_begin returns or kept alive until ffn_end). Only for layers with a share.
  virtual void ffn_begin(int64_t layer, const float* x, int64_t n, cpu::Activation act, float threshold) = 0;
  // Waits for the partial output: n * n_embd floats, valid until the next ffn_begin.
  virtual const float* ffn_end() = 0;
  virtual uint64_t bytes() const = 0;             // device memory held (the arena)
  virtual uint64_t fired() const = 0;             // (token, neuron) pairs that fired here so far
  virtual void reset_stats() = 0;
};

// A CPU standing in for the GPU: its own arena (host memory) and its own thread pool, driven
// by a thread of its own so that it runs concurrently with the caller's pool.
class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int n_threads);
  ~CpuDevice() override;

  const char* name() const override { return "cpu-standin"; }
  void load(const Model& model, const std::vector<TensorView>& down_nm, const PlanModel& pm, const PlanOptions& opts,
            const Plan& plan) override;
  void ffn_begin(int64_t layer, const float* x, int64_t n, cpu::Activation act, float threshold) override;
  const float* ffn_end() override;
  uint64_t bytes() const override { return layout_.total; }
  uint64_t fired() const override { return fired_; }
  void reset_stats() override { fired_ = 0; }
  size_t kernel_scratch_bytes() const { return kernel_scratch_.size(); }

 private:
  void driver();
  void compute();

  int n_threads_;
  std::unique_ptr<ThreadPool> pool_;  // made on the driver thread's side, used only by it
  FfnArenaLayout layout_;
  AlignedBuffer<uint8_t> arena_, kernel_scratch_;
  std::vector<FfnShareWeights> shares_;
  int64_t n_embd_ = 0, max_batch_ = 0;
  size_t mm_bytes_ = 0;
  uint64_t fired_ = 0;
  // The job (written by the caller before `pending_` is set, read by the driver).
  int64_t job_layer_ = 0, job_n_ = 0;
  cpu::Activation job_act_ = cpu::Activation::relu;
  float job_threshold_ = 0.0f;
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, done_ = true, stop_ = false;
  std::thread thread_;
};

}  // namespace ember
