// The CUDA device of the hybrid engine (built with EMBER_HAS_CUDA): everything the plan puts on it
// in one cudaMalloc'd arena laid out by device_arena_layout (exactly the plan's byte count), the
// KV cache of its attention layers after it; transfers through pinned host buffers with
// asynchronous copies on a stream of its own, the kernels of ops/cuda/ in between.
//   - FFN shares: ffn_begin returns once the work is queued, so the CPU computes its neurons
//     meanwhile. With predictors it runs each layer's predictor first (fc1, ReLU, fc2 in
//     predictor_row_order), computes its predicted rows only, and copies the CPU's prediction
//     back behind an event the CPU waits on (ffn_predicted) while the share goes on.
//   - Attention layers: the attention block (ops/cuda/cuda_blocks.hpp) on the hidden state it
//     holds, with its own KV cache, from the file's layout of the matrices (Model::file_layer);
//     ffn_input copies the FFN's input to the host once (the CPU's neurons need it) and keeps it
//     on the device for the share; ffn_finish takes the merged output back.
//   - The output head, where the plan puts it there: norm, output matrix (the file's layout),
//     soft-cap, the logits copied back.
// What it runs is cuda_caps() (engine/device.hpp); anything else is refused before a byte is
// copied.
#pragma once
#include <initializer_list>

#include "engine/device.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace ember {

class CudaDevice final : public Device {
 public:
  CudaDevice();  // throws ember::Error naming why when no CUDA device can be used
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const char* name() const override { return "cuda"; }
  DeviceCaps caps() const override { return cuda_caps(); }
  DeviceMemory memory() const override;
  void load(const Model& model, const DeviceLoad& what) override;
  void ffn_begin(int64_t layer, const float* x, int64_t n, const ShareRule& rule) override;
  const float* ffn_end() override;
  const uint8_t* ffn_predicted() override;
  void put_hidden(const float* x, int64_t n) override;
  void get_hidden(float* x, int64_t n) override;
  void attention(int64_t layer, std::span<const AttnSpan> spans, int64_t n) override;
  const float* ffn_input(int64_t layer, int64_t n) override;
  void ffn_finish(int64_t layer, const float* out, int64_t n) override;
  void output(int64_t n, float* logits) override;
  uint64_t bytes() const override { return layout_.total; }
  uint64_t fired() const override { return fired_; }
  CrossingStats crossings() const override { return crossings_; }
  void reset_stats() override { fired_ = 0, crossings_ = {}; }

 private:
  struct Share {
    DType gate = DType::F32, up = DType::F32, down = DType::F32;
    DType fc1 = DType::F32, fc2 = DType::F32;
    int64_t rank = 0;
  };
  // An attention layer here: its tensors as views into the arena (the file's layout), its place
  // in the KV cache.
  struct Attn {
    int64_t slot = -1;  // -1: not here
    LayerWeights w;
  };
  const Attn& attn_layer(int64_t layer) const;
  // What a matvec of these weight types reads from x (n rows of cols): x, and rounded to 8 bits
  // into the arena at xq first where one of them takes that (cuda::takes_q8).
  cuda::Activations activations(const float* x, int64_t n, int64_t cols, uint64_t xq, std::initializer_list<DType> types);
  float* at(uint64_t offset) const { return reinterpret_cast<float*>(arena_ + offset); }
  const Model* model_ = nullptr;
  DeviceArenaLayout layout_;
  std::vector<Share> types_;
  std::vector<Attn> attn_;
  uint8_t* arena_ = nullptr;        // device: layout_.arena bytes, then the KV cache (layout_.kv)
  float* x_host_ = nullptr;         // pinned: the FFN input (max_batch x n_embd)
  float* out_host_ = nullptr;       // pinned: the partial output (and a host predictor input)
  float* hidden_host_ = nullptr;    // pinned: the hidden state in and out
  float* ffn_in_host_ = nullptr;    // pinned: the FFN input handed out by ffn_input
  float* ffn_out_host_ = nullptr;   // pinned: the merged FFN output taken by ffn_finish
  float* logits_host_ = nullptr;    // pinned: the output head's logits (max_batch x n_vocab)
  OutputWeights out_;               // the output head's tensors in the arena (the file's layout)
  int32_t* counters_host_ = nullptr;  // pinned: active, fired
  uint8_t* mask_host_ = nullptr;      // pinned: the CPU's predicted neurons
  void* stream_ = nullptr;
  void* predicted_event_ = nullptr;   // recorded after the mask's copy
  int64_t n_embd_ = 0, n_ff_ = 0, max_batch_ = 0, pending_n_ = 0;
  // The KV caches: K of every (sequence, attention layer), sequence-major, then V.
  int64_t n_ctx_ = 0, kv_layers_ = 0, n_attn_ = 0, n_seq_ = 1;
  uint64_t kv_layer_bytes_ = 0;         // K (or V) of one layer
  DType kv_type_ = DType::F16;
  int64_t ffn_in_layer_ = -1, ffn_in_n_ = 0;  // what ffn_input last handed out (still in layout_.xn)
  bool pending_ = false, pending_predict_ = false, pending_share_ = false;
  uint64_t fired_ = 0;
  CrossingStats crossings_;
};

}  // namespace ember
