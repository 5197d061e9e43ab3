// The hybrid executor (PowerInfer's hybrid GPU-CPU inference, on a Device, device/device.hpp).
// Per layer, following the plan:
//   - the FFN: the plan's device neurons run on the device while the CPU computes its own
//     neurons concurrently; the two partial sums are added in a fixed order (CPU first, then
//     the device's), then the down bias, so results are deterministic for fixed thread counts.
//     Both sides use the oracle rule (model/ffn.hpp): a neuron fires for a token when its
//     |firing value| > threshold (exact for ReLU models at threshold 0), and a batch takes the
//     union of its tokens' firing neurons. Batches longer than the plan's max_batch go in chunks.
//   - with predictors (HybridOptions::predictor, the model's fc1/fc2): the firing values are
//     computed for the predicted neurons only, as --sparse-mode predictor does. A layer that uses
//     the device runs its predictor there, which picks the device's rows and hands the CPU the
//     prediction of its own neurons; the other layers run theirs on the CPU.
//   - the attention block, where the plan puts it on the device (LayerPlacement::attn_gpu): the
//     device holds the hidden state from the first such layer on, runs the attention block and
//     the FFN block's norms there, and hands out only the FFN's input (for the CPU's neurons) and
//     takes back the merged FFN output; the hidden state crosses to the CPU only before a layer
//     whose attention is on the CPU, and before the output head.
// With the CPU stand-in device every block runs the CPU's own functions, so placing attention
// on the device changes no bit of the output.
//
//   - the output head, where the plan puts it on the device (Plan::output_gpu): the rows whose
//     logits are wanted go up in chunks of max_batch, the logits come back.
// The layers whose attention is on the device keep their KV cache there only (Session allocates
// none for them on the host).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "engine/hybrid_plan.hpp"
#include "model/ffn.hpp"
#include "model/kv_cache.hpp"
#include "model/workspace.hpp"

namespace ember {

struct HybridStats {
  uint64_t device_fired = 0, cpu_fired = 0;  // (token, neuron) pairs that fired on each side
  uint64_t device_layer_calls = 0;           // layer-chunks the device took part in
  uint64_t cpu_predicted = 0;                // (token-chunk, neuron) pairs the CPU computed the gate of, with predictors
  // Where the time went (seconds, wall clock of the calling thread): the CPU's FFN shares (its
  // predictor included), waiting for the device's share or prediction, the device's blocks and
  // boundaries (attention queued, the FFN input fetched, the output and the hidden state moved:
  // each fetch waits for the device), and whole layers on the CPU (their FFN time is also in the
  // first two).
  double cpu_ffn_seconds = 0, wait_seconds = 0, device_block_seconds = 0, cpu_layer_seconds = 0;
  uint64_t device_expert_runs = 0, cpu_expert_runs = 0;  // (token, expert) pairs of a mixture run on each side
};

class HybridExecutor final : public FfnExecutor, public LayerExecutor {
 public:
  // Runs of device layers over at most this many rows (decode steps) are captured by the device
  // once per shape and replayed (Device::capture_begin).
  static constexpr int64_t kCaptureRows = 8;
  // n_batch: the most tokens a forward pass takes at once (the device's attention blocks take
  // them whole).
  HybridExecutor(const Model& model, ThreadPool& pool, const HybridOptions& opts, int64_t n_ctx, int64_t n_batch,
            std::unique_ptr<Device> device = nullptr);  // null: make_device(opts.device_kind, ...)

  void run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
           float* out, Workspace& ws) override;
  std::string refusal(const Model& model) const override;
  // A mixture's layer: the host routes; the plan's experts run on the device while the CPU runs
  // the others, and every token's outputs are added in ascending expert order (moe_merge_rows),
  // so on the CPU stand-in it equals the all-CPU mixture bit for bit.
  bool takes_experts() const override { return true; }
  void run_moe(ThreadPool& pool, int64_t layer, const MoeWeights& moe, cpu::Activation act, const float* x, int64_t n,
               float* out, Workspace& ws) override;
  void run_layers(const Model& model, ThreadPool& pool, std::span<const SeqSpan> seqs, Workspace& ws,
                  int64_t n) override;
  void sync_hidden() override;
  bool output(const Model& model, ThreadPool& pool, Workspace& ws, const int64_t* rows, int64_t n_rows,
              float* logits) override;

  const Plan& plan() const { return plan_; }
  const Device& device() const { return *device_; }
  HybridStats stats() const;
  void reset_stats();
  size_t cpu_bytes() const;  // what the CPU side holds beyond the model (down copies, scratch)

 private:
  const Model& model_;
  Plan plan_;
  PlanModel pm_;
  PlanOptions popts_;
  float threshold_;
  std::unique_ptr<Device> device_;
  std::vector<cpu::NeuronMajorMatrix> down_nm_;  // per layer, the CPU's copy when the file has no down_t
  std::vector<TensorView> down_views_;            // per layer, the CPU's neuron-major down
  std::vector<FfnWeights> cpu_share_;             // per layer: the FFN with down_t = down_views_ (no down_b)
  std::vector<std::vector<int32_t>> cpu_rows_;    // per layer: the CPU's neurons
  AlignedBuffer<float> act_, h_, partial_, axpy_;
  // Mixtures: per layer which experts are on the device; the CPU's experts' rows (max_batch x
  // n_used slots), the chosen experts split by side, the rows of each chosen expert.
  std::vector<std::vector<char>> expert_on_;
  AlignedBuffer<float> expert_rows_;
  AlignedBuffer<int32_t> cpu_experts_;
  std::vector<const float*> expert_ptrs_;
  // One chunk of n <= max_batch tokens of a mixture's layer: out = the mixture of x.
  void moe_chunk(ThreadPool& pool, size_t l, const MoeWeights& moe, cpu::Activation act, const float* x, int64_t n,
                 float* out, Workspace& ws);
  AlignedBuffer<int32_t> active_;
  // Predictors: the CPU's predicted rows (the batch's union; their places among the CPU's
  // neurons), which tokens each serves (allowed_, [n][rows]), and predict_active's scratch for
  // the layers whose predictor runs on the CPU.
  bool predict_ = false;
  AlignedBuffer<int32_t> predicted_, predicted_pos_;
  AlignedBuffer<uint8_t> allowed_;
  AlignedBuffer<float> pred_scratch_;
  AlignedBuffer<uint8_t> pred_mm_;
  uint64_t cpu_fired_ = 0, device_calls_ = 0, cpu_predicted_ = 0, device_expert_runs_ = 0, cpu_expert_runs_ = 0;
  double cpu_ffn_s_ = 0, wait_s_ = 0, device_block_s_ = 0, cpu_layer_s_ = 0;
  std::vector<AttnSpan> chunk_spans_;  // run_layers: the spans of a chunk of the device's rows
  // Rows of the hidden state the device holds for output() (run_layers queued their copy back,
  // the head follows with one wait for both); 0: none.
  int64_t held_rows_ = 0;
  // The constructor's steps: the plan for what the device can hold and has free; each layer's
  // neurons or experts split by side; the CPU's neuron-major down copies; the device's load; the
  // scratch buffers; the log of what went where.
  void plan_for_device(const HybridOptions& opts, int64_t n_ctx);
  void split_layers();
  void make_cpu_downs(ThreadPool& pool, const HybridOptions& opts);
  void load_device(ThreadPool& pool, const HybridOptions& opts, int64_t n_batch);
  void size_buffers(ThreadPool& pool, const HybridOptions& opts);
  void log_placement(double seconds) const;
  // A layer whose attention is on the device: whether the CPU computes some of its neurons.
  bool cpu_takes_part(size_t l) const;
  // The rows the CPU computes for layer l's chunk of n tokens at x (token t0 of the pass), and
  // with predictors and n > 1 which tokens each serves (*allowed, [n][rows]; else null).
  int64_t cpu_rows_for(ThreadPool& pool, size_t l, const float* x, int64_t n, int64_t t0, const Workspace& ws,
                       bool device_predicts, const int32_t** rows, const uint8_t** allowed);
  ShareRule share_rule(size_t l, cpu::Activation act, int64_t t0, const Workspace& ws) const;
};

}  // namespace ember
