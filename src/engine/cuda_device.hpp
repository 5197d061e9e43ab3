// The CUDA device of the hybrid engine (built with EMBER_HAS_CUDA): the plan's FFN shares in one
// cudaMalloc'd arena laid out by device_arena_layout (exactly the plan's byte count), the layer
// input and the partial output through pinned host buffers with asynchronous copies on a stream
// of its own, the kernels of ops/cuda/cuda_ops.hpp in between. ffn_begin returns once the work
// is queued, so the CPU computes its neurons meanwhile. With predictors it runs each layer's
// predictor first (fc1, ReLU, fc2 in predictor_row_order), computes its predicted rows only, and
// copies the CPU's prediction back behind an event the CPU waits on (ffn_predicted) while the
// share goes on. What it runs is cuda_caps() (engine/device.hpp): gated FFN shares (act(gate) *
// up) and predictors of F32, F16, Q8_0 and Q4_0 rows, the predictors reading the FFN input or a host
// residual, no attention blocks yet (the GPU issue); anything else is refused before a byte is
// copied.
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
  DeviceCaps caps() const override { return cuda_caps(); }
  void load(const Model& model, const DeviceLoad& what) override;
  void ffn_begin(int64_t layer, const float* x, int64_t n, const ShareRule& rule) override;
  const float* ffn_end() override;
  const uint8_t* ffn_predicted() override;
  // No attention blocks on CUDA yet: caps() says so and load() refuses such a plan.
  void put_hidden(const float*, int64_t) override { no_attention(); }
  void get_hidden(float*, int64_t) override { no_attention(); }
  void attention(int64_t, int64_t, int64_t) override { no_attention(); }
  const float* ffn_input(int64_t, int64_t) override { no_attention(); }
  void ffn_finish(int64_t, const float*, int64_t) override { no_attention(); }
  uint64_t bytes() const override { return layout_.total; }
  uint64_t fired() const override { return fired_; }
  CrossingStats crossings() const override { return {}; }
  void reset_stats() override { fired_ = 0; }

 private:
  struct Share {
    DType gate = DType::F32, up = DType::F32, down = DType::F32;
    DType fc1 = DType::F32, fc2 = DType::F32;
    int64_t rank = 0;
  };
  [[noreturn]] static void no_attention();
  DeviceArenaLayout layout_;
  std::vector<Share> types_;
  uint8_t* arena_ = nullptr;        // device
  float* x_host_ = nullptr;         // pinned
  float* out_host_ = nullptr;       // pinned
  int32_t* counters_host_ = nullptr;  // pinned: active, fired
  uint8_t* mask_host_ = nullptr;      // pinned: the CPU's predicted neurons
  void* stream_ = nullptr;
  void* predicted_event_ = nullptr;   // recorded after the mask's copy
  int64_t n_embd_ = 0, n_ff_ = 0, max_batch_ = 0, pending_n_ = 0;
  bool pending_ = false, pending_predict_ = false, pending_share_ = false;
  uint64_t fired_ = 0;
};

}  // namespace ember
