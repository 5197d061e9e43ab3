// The CUDA device of the hybrid engine (built with EMBER_HAS_CUDA): the plan's FFN shares in one
// cudaMalloc'd arena laid out by ffn_arena_layout (exactly the plan's byte count), the layer
// input and the partial output through pinned host buffers with asynchronous copies on a stream
// of its own, the kernels of ops/cuda/cuda_ops.hpp in between. ffn_begin returns once the work
// is queued, so the CPU computes its neurons meanwhile.
#pragma once
#include "engine/device.hpp"

namespace ember {

class CudaDevice final : public Device {
 public:
  CudaDevice();  // throws ember::Error naming why when no CUDA device can be used
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const char* name() const override { return "cuda"; }
  void load(const Model& model, const std::vector<TensorView>& down_nm, const PlanModel& pm, const PlanOptions& opts,
            const Plan& plan) override;
  void ffn_begin(int64_t layer, const float* x, int64_t n, cpu::Activation act, float threshold) override;
  const float* ffn_end() override;
  uint64_t bytes() const override { return layout_.total; }
  uint64_t fired() const override { return fired_; }
  void reset_stats() override { fired_ = 0; }

 private:
  struct Share {
    DType gate = DType::F32, up = DType::F32, down = DType::F32;
  };
  FfnArenaLayout layout_;
  std::vector<Share> types_;
  uint8_t* arena_ = nullptr;        // device
  float* x_host_ = nullptr;         // pinned
  float* out_host_ = nullptr;       // pinned
  int32_t* counters_host_ = nullptr;  // pinned: active, fired
  void* stream_ = nullptr;
  int64_t n_embd_ = 0, n_ff_ = 0, max_batch_ = 0, pending_n_ = 0;
  bool pending_ = false;
  uint64_t fired_ = 0;
};

}  // namespace ember
