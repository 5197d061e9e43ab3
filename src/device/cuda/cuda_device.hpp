// The CUDA device of the hybrid engine (built with EMBER_HAS_CUDA): everything the plan puts on it
// in one cudaMalloc'd arena laid out by device_arena_layout (exactly the plan's byte count), the
// KV cache of its attention layers after it, its block-type matrices in the split layout of
// cuda::pack_matrix; transfers through pinned host buffers with asynchronous copies on a stream
// of its own, the kernels of ops/cuda/ in between.
//   - FFN shares of layers whose attention is on the CPU: ffn_begin returns once the work is
//     queued, so the CPU computes its neurons meanwhile. With predictors it runs each layer's
//     predictor first (fc1 and ReLU, fc2 with the selection test in one pass), computes its
//     predicted rows only, and copies the CPU's prediction back behind an event the CPU waits on
//     (ffn_predicted) while the share goes on.
//   - Attention layers: the attention block (ops/cuda/cuda_blocks.hpp) on the hidden state it
//     holds, with its own KV cache, from the file's layout of the matrices (Model::file_layer);
//     then the FFN block: its norm (rounded to 8 bits in the same kernel), the share, and the
//     merge with the CPU's partial output where the CPU has neurons (the FFN input goes to the
//     host then, with the CPU's part of the prediction, behind one event: one wait a layer), the
//     post-norm and the residual, all queued.
//   - A mixture's experts the plan gives it, whole (the file's layout): experts_begin gathers the
//     rows of the tokens that chose them on the host, sends them up in one copy and queues, per
//     expert, its gate (act in the epilogue), up (times it in the epilogue) and down over its
//     tokens; experts_end waits once for the outputs.
//   - The output head, where the plan puts it there: norm, output matrix (the file's layout),
//     soft-cap, the logits copied back.
// Results for the host land in pinned buffers and are copied out at sync(), its one wait; a run
// of layers with no host input in between (capture_begin's key) is captured as a CUDA graph the
// first time and replayed after, its positions read on the device (EMBER_CUDA_GRAPHS=0: never;
// the default where the runtime has graphs). stats() says what each token cost the host.
// What it runs is cuda_caps() (device/device.hpp); anything else is refused before a byte is
// copied.
#pragma once
#include <initializer_list>
#include <map>

#include "device/cuda/cuda_scratch.hpp"
#include "device/device.hpp"
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
  PredictedMask ffn_predicted() override;
  void experts_begin(int64_t layer, const float* x, int64_t n, const int32_t* ids) override;
  const float* experts_end() override;
  void put_hidden(const float* x, int64_t n, std::span<const AttnSpan> spans) override;
  void attention(int64_t layer, std::span<const AttnSpan> spans, int64_t n) override;
  void ffn_block_begin(int64_t layer, int64_t n, const ShareRule& rule, bool host_input) override;
  const float* ffn_host_input() override;
  void ffn_block_end(int64_t layer, const float* cpu_out, int64_t n) override;
  void get_hidden(float* x, int64_t n) override;
  void output(int64_t n, float* logits) override;
  void sync() override;
  void capture_begin(uint64_t key) override;
  DeviceStats stats() const override;
  void reset_stats() override;
  // Whether runs are captured as graphs (EMBER_CUDA_GRAPHS, default on where the runtime has them).
  bool graphs() const { return graphs_; }

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
  // Where the calls go: queued as they come, captured into a graph, or only their host side done
  // (the graph of their key replays at sync()).
  enum class Mode { direct, capture, replay };
  // A host copy done at sync(): pinned bytes to where the caller wants them.
  struct HostCopy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  struct Graph {
    void* exec = nullptr;
    size_t nodes = 0;
    int calls = 0;  // the calls captured into it, checked at each replay
  };
  const Attn& attn_layer(int64_t layer) const;
  bool queue() const { return mode_ != Mode::replay; }  // whether a call enqueues its work now
  // What a matvec of these weight types reads from x (n rows of cols): x, and rounded to 8 bits
  // into the arena at xq first where one of them takes that (cuda::takes_q8).
  cuda::Activations activations(const float* x, int64_t n, int64_t cols, uint64_t xq, std::initializer_list<DType> types);
  // Queues layer l's predictor and share on x (its activations `xa`): the partial sums of the
  // down into own_.ffn.partial; the CPU's part of the prediction copied to the host before
  // `event` (null: not copied) is recorded.
  void queue_share(size_t l, cuda::Activations xa, int64_t n, const ShareRule& rule, const float* px, void* event);
  cuda::Matrix matrix(const TensorView& t) const { return {t.type, t.data, t.rows(), t.cols()}; }
  void to_host(void* pinned, const void* dev, size_t bytes, void* dst);  // queued; dst at sync()
  void wait_event(void* event);
  float* at(uint64_t offset) const { return reinterpret_cast<float*>(arena_ + offset); }

  const Model* model_ = nullptr;
  DeviceArenaLayout layout_;
  CudaScratchLayout own_;  // the buffers of its kernels' own (cuda_scratch.hpp)
  // A mixture's experts here, per layer in gpu_experts' order (the file's layout, packed), and
  // each expert id's place among them (-1: not here).
  struct Expert {
    cuda::Matrix gate, up, down;
  };
  std::vector<std::vector<Expert>> experts_;
  std::vector<std::vector<int32_t>> expert_index_;
  std::vector<int32_t> expert_slots_;  // experts_begin: each expert's first slot, its filling place, the slots' tokens
  std::vector<cuda::ExpertRun> ex_runs_;  // experts_begin: the chosen experts run together
  float* ex_x_host_ = nullptr;         // pinned: the slots' inputs (max_batch x n_used x n_embd)
  float* ex_out_host_ = nullptr;       // pinned: their outputs
  int64_t ex_rows_ = -1;               // experts_begin's slots until experts_end; -1: none
  std::vector<Share> types_;
  std::vector<Attn> attn_;
  uint8_t* arena_ = nullptr;        // device: layout_.arena bytes, then the KV cache (layout_.kv)
  float* x_host_ = nullptr;         // pinned: the FFN input (max_batch x n_embd)
  float* out_host_ = nullptr;       // pinned: the partial output (and a host predictor input)
  float* hidden_host_ = nullptr;    // pinned: the hidden state in
  float* hidden_out_host_ = nullptr;  // pinned: the hidden state out
  float* ffn_in_host_ = nullptr;    // pinned: the FFN input handed out by ffn_host_input
  float* ffn_out_host_ = nullptr;   // pinned: the CPU's partial output taken by ffn_block_end
  float* logits_host_ = nullptr;    // pinned: the output head's logits (max_batch x n_vocab)
  int32_t* positions_host_ = nullptr;  // pinned: the spans' first positions (max_batch)
  OutputWeights out_;               // the output head's tensors in the arena (the file's layout)
  uint8_t* mask_host_ = nullptr;      // pinned: the prediction per token ([max_batch][n_ff])
  void* stream_ = nullptr;
  void* predicted_event_ = nullptr;   // ffn_begin: recorded after the mask's copy
  void* input_event_ = nullptr;       // ffn_block_begin: after the FFN input's (and mask's) copy
  bool input_waited_ = false;         // input_event_ already waited for
  int64_t n_embd_ = 0, n_ff_ = 0, max_batch_ = 0, pending_n_ = 0;
  // The KV caches: K of every (sequence, attention layer), sequence-major, then V.
  int64_t n_ctx_ = 0, kv_layers_ = 0, n_attn_ = 0, n_seq_ = 1;
  uint64_t kv_layer_bytes_ = 0;         // K (or V) of one layer
  DType kv_type_ = DType::F16;
  std::vector<AttnSpan> spans_;         // put_hidden's, their positions on the device
  bool pending_ = false, pending_predict_ = false, pending_share_ = false;
  int64_t block_layer_ = -1;            // ffn_block_begin's layer until ffn_block_end
  int64_t predicted_layer_ = -1;        // the layer whose prediction mask_host_ holds
  CrossingStats crossings_;
  // Graphs and the host side of queued results.
  bool graphs_ = false;
  Mode mode_ = Mode::direct;
  uint64_t key_ = 0;
  int calls_ = 0;                       // device calls since capture_begin
  uint64_t capture_launches0_ = 0;
  std::map<uint64_t, Graph> graph_cache_;
  std::vector<HostCopy> host_copies_;
  DeviceCounters counters_;             // host waits, graphs, bytes (launches: below)
  uint64_t launches0_ = 0, captured_launches_ = 0;
};

}  // namespace ember
