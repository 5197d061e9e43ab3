// The CPU stand-in device (device/device.hpp): a second CPU device on threads of its own, standing
// in for a GPU where there is none. It runs the CPU's own block functions (model/blocks.hpp), so
// that the split, the ordering and the merge are tested everywhere, bit for bit against the CPU.
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/thread_pool.hpp"
#include "device/device.hpp"
#include "model/kv_cache.hpp"
#include "model/workspace.hpp"

namespace ember {

// A CPU standing in for the GPU: its own arena (host memory), its own thread pool, its own
// workspace and KV cache, its FFN shares driven by a thread of its own so that they run
// concurrently with the caller's pool. Its blocks are the CPU's (model/blocks.hpp).
class CpuDevice final : public Device {
 public:
  // vram: the memory it reports as a GPU's (free and total; 0: the host's available memory).
  explicit CpuDevice(int n_threads, uint64_t vram = 0);
  ~CpuDevice() override;

  const char* name() const override { return "cpu-standin"; }
  DeviceCaps caps() const override { return cpu_standin_caps(); }
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
  void sync() override {}
  DeviceStats stats() const override { return {layout_.total, fired_, crossings_, counters_}; }
  void reset_stats() override { fired_ = 0, crossings_ = {}, counters_ = {}; }
  size_t kernel_scratch_bytes() const { return kernel_scratch_.size(); }
  const DeviceArenaLayout& layout() const { return layout_; }

 private:
  void driver();
  void compute();
  void compute_experts();
  const LayerWeights& attn_layer(int64_t layer) const;

  int n_threads_;
  uint64_t vram_ = 0;
  std::unique_ptr<ThreadPool> pool_;  // used by the driver thread, and by the caller's thread
                                      // for attention blocks while no FFN share is pending
  const Model* model_ = nullptr;
  DeviceArenaLayout layout_;
  AlignedBuffer<uint8_t> arena_, kernel_scratch_;
  AlignedBuffer<float> pred_scratch_;   // predict_active's scores and hidden rows (host: CPU kernels)
  AlignedBuffer<uint8_t> pred_mm_, mask_, allowed_;  // per token: the CPU's neurons, the share's rows
  AlignedBuffer<int32_t> pred_list_;
  std::vector<FfnWeights> shares_;
  // Per layer of a mixture with experts here: the layer's experts, those here as views into the
  // arena (the others empty), their ids, and a workspace of the mixture's buffers for max_batch tokens.
  std::vector<MoeWeights> moe_;
  std::vector<std::vector<int32_t>> expert_ids_;
  AlignedBuffer<int32_t> expert_list_;
  Workspace ex_ws_;
  std::vector<TensorView> fc1_, fc2_;  // per layer: its predictor in the arena (fc2 in predictor_row_order)
  std::vector<LayerWeights> attn_;    // per layer: views into the arena (attention layers only)
  OutputWeights out_;                 // the output head's copies (Plan::output_gpu), views into the arena
  std::vector<int64_t> kv_slot_;      // per layer: its layer in each of kvs_ (-1: none)
  std::vector<KvCache> kvs_;          // per sequence, of the attention layers (layout_.kv bytes in all)
  std::vector<SeqSpan> seq_spans_;    // attention's spans over kvs_
  Workspace ws_;                      // the hidden state (ws_.x) and the blocks' buffers
  AlignedBuffer<float> io_;           // the FFN input handed out (host side)
  int64_t n_embd_ = 0, max_batch_ = 0, n_batch_ = 0;
  size_t mm_bytes_ = 0, pred_mm_bytes_ = 0;
  uint64_t fired_ = 0;
  CrossingStats crossings_;
  DeviceCounters counters_;
  // The FFN block under way (ffn_block_begin .. ffn_block_end): its share's job was started.
  bool block_job_ = false;
  // The job (written by the caller before `pending_` is set, read by the driver).
  int64_t job_layer_ = 0, job_n_ = 0;
  bool job_experts_ = false;  // the job is a mixture's experts (experts_begin)
  ShareRule job_;
  const float* job_px_ = nullptr;  // the predictor's input (in the arena or the hidden state)
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, done_ = true, predicted_ = true, stop_ = false;
  std::thread thread_;
};

}  // namespace ember
