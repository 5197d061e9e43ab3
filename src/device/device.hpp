// Devices of the hybrid engine. A device holds what a plan (sparse/plan.hpp) puts on it, at the
// level of a layer's blocks (model/blocks.hpp):
//   - per layer, an FFN share: the rows of gate, up, up bias and the neuron-major down of the
//     neurons the plan gives it, as an FFN of their own (FfnWeights, row i = the share's neuron
//     i), of which it computes, for a batch of tokens, the partial output over the neurons that
//     fire, while the CPU computes the rest (ffn_begin / ffn_end);
//   - with predictors (PlanModel::predicted), for every layer that uses it: the layer's predictor
//     (fc1, and fc2 with the share's neurons first), which picks the share's rows and tells the
//     CPU which of its own neurons to compute (ffn_predicted);
//   - per layer of a mixture, the experts the plan gives it, whole, which it runs for the tokens
//     the host's router sends them (experts_begin / experts_end) while the CPU runs the others;
//     the host adds every expert's output in ascending expert order (moe_merge_rows);
//   - for the layers whose attention the plan places there (LayerPlacement::attn_gpu): the
//     attention block's tensors and the FFN block's norms, and a KV cache of its own for them;
//     then the device holds the hidden state: it runs the attention block and the FFN block on
//     it, its own share included; the FFN's input comes to the host only where the CPU computes
//     neurons of the layer (ffn_host_input), whose partial output the device merges
//     (ffn_block_end). The hybrid executor moves the hidden state only where consecutive blocks
//     change device (put_hidden / get_hidden), and a run of layers with nothing for the CPU is
//     one sequence of queued work with one wait (sync), which a device may capture and replay
//     (capture_begin: a CUDA graph).
// The contract every device implements, one folder each: CpuDevice (device/cpu/: a second CPU
// device on threads of its own, standing in for a GPU where there is none, running the CPU's own
// block functions, so that the split, the ordering and the merge are tested everywhere, bit for
// bit against the CPU) and CudaDevice (device/cuda/, its kernels in ops/cuda/, when built);
// make_device (device/make_device.hpp) picks one.
//
// Memory is accounted: a device allocates one arena laid out by device_arena_layout, whose FFN
// part equals gpu_ffn_bytes(plan) and whose attention part equals the plan's attn_bytes of
// those layers (sparse/placement.hpp, the functions the solvers count with).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/thread_pool.hpp"
#include "model/blocks.hpp"
#include "model/workspace.hpp"
#include "model/kv_cache.hpp"
#include "model/model.hpp"
#include "ops/cpu/sparse/sparse.hpp"
#include "sparse/placement.hpp"

namespace ember {

// What a device can run. Checked against a model and plan before anything is loaded.
struct DeviceCaps {
  std::string name;
  bool attention = false;                // holds attention blocks (LayerPlacement::attn_gpu)
  bool parallel_residual = false;        // attention blocks of parallel-residual models (Falcon, Phi-2)
  int64_t max_head_dim = 0;              // of its attention blocks; 0: any
  std::vector<FfnGating> gatings;        // of its FFN shares
  bool up_bias = false;                  // FFN shares with an up bias (OPT)
  bool experts = false;                  // a mixture's experts, whole (LayerPlacement::gpu_experts)
  // Of its FFN share rows and attention matrices (as the file stores them: Model::file_layer);
  // empty: every type.
  std::vector<DType> weight_types;
  // Of its neuron-major down rows (hybrid_device_down_type); empty: those of weight_types.
  std::vector<DType> down_row_types;
  // The scratch its kernels keep beside the plan's weights (sparse/placement.hpp); null: the
  // common buffers only. The planner counts it (PlanOptions::scratch) and load lays it out.
  const DeviceScratch* scratch = nullptr;
};
DeviceCaps cpu_standin_caps();  // device/cpu/cpu_device.cpp
DeviceCaps cuda_caps();  // what CudaDevice runs (device/cuda/cuda_caps.cpp, built without CUDA too, so it can be checked anywhere)
// Why a device of `caps` cannot run `plan` on `model` (naming the first layer and part it cannot
// hold), or empty when it can. A device that holds attention blocks holds the file's layout of
// their matrices (Model::file_layer), and its FFN shares' down rows are in
// hybrid_device_down_type (sparse/plan.hpp), so that is what is checked.
std::string device_refusal(const DeviceCaps& caps, const Model& model, const Plan& plan);

// Where everything lives in a device's arena: per layer the FFN share's gate, up, down and up
// bias rows and its row list (0..k-1), then the FFN scratch, then per attention layer its
// tensors (LayerWeights::attention_tensors and ffn_block_tensors, in that order), then the
// attention scratch (gpu_attn_scratch_bytes: the hidden state and the block's buffers for
// max_batch tokens, the RoPE tables), then with predictors the fc1 and fc2 of every layer that
// uses the device (fc2's rows in the order of predictor_row_order), then the output head where
// the plan puts it there. Each buffer is padded to kGpuAlign. The KV cache of the attention
// layers comes on top (`kv`).
struct DeviceArenaLayout : FfnScratch, AttnScratch, ExpertScratch {  // the scratch offsets (sparse/placement.hpp)
  using Share = FfnShareLayout;
  struct Attention {
    bool on = false;
    std::vector<uint64_t> tensors;  // offsets, in the order of the two lists (0 for empty views)
  };
  struct Predictor {
    bool on = false;
    uint64_t fc1 = 0, fc2 = 0;
  };
  struct Experts {
    std::vector<uint64_t> gate, up, down;  // per expert of the layer's gpu_experts, in their order
  };
  std::vector<Share> layers;
  std::vector<Experts> experts;
  std::vector<Attention> attn;
  std::vector<Predictor> pred;
  uint64_t ffn_total = 0;   // = gpu_ffn_bytes(plan)
  uint64_t attn_weights = 0;  // = sum of the attention layers' PlanLayer::attn_bytes
  uint64_t attn_scratch = 0;  // = gpu_attn_scratch_bytes when some layer's attention is here
  uint64_t predictors = 0;    // = sum of PlanLayer::predictor_bytes of the layers that use the device
  // The output head (Plan::output_gpu): its norm, norm bias and matrix, then the logits of
  // max_batch rows.
  uint64_t out_norm = 0, out_norm_b = 0, out_w = 0, logits = 0;
  uint64_t output = 0;        // = gpu_output_bytes when the head is here
  // A mixture's experts (last): each layer's experts' matrices, then the experts' scratch.
  uint64_t experts_total = 0;  // = the experts' bytes of every layer plus their scratch where any
  uint64_t arena = 0;         // ffn_total + attn_weights + attn_scratch + predictors + output + experts_total
  uint64_t kv = 0;            // K and V of the attention layers, in the cache's type (KvCache::bytes_for)
  uint64_t total = 0;         // arena + kv
};
DeviceArenaLayout device_arena_layout(const Model& model, const PlanModel& m, const PlanOptions& opts,
                                      const Plan& plan, DType kv_type);

// The order of fc2's rows in a device's predictor of layer l: the share's neurons (the plan's
// gpu_neurons, ascending), then the CPU's (the rest, ascending). Score i < k is then share row i
// and score k + c the CPU's c-th neuron.
std::vector<int32_t> predictor_row_order(const Plan& plan, size_t l, int64_t n_ff);

// How a share picks the neurons it computes (Device::ffn_begin).
struct ShareRule {
  cpu::Activation act = cpu::Activation::relu;
  float threshold = 0.0f;  // a neuron fires when |firing value| > threshold (model/ffn.hpp)
  // With the layer's predictor on the device: it first runs the predictor, computes the firing
  // values of its predicted rows only, and publishes which CPU neurons are predicted
  // (ffn_predicted). A neuron is predicted when its score >= predictor_threshold for some token.
  bool predict = false;
  float predictor_threshold = 0.0f;
  enum class Input { ffn_input, host, hidden };
  Input predictor_input = Input::ffn_input;  // what the predictor reads: the FFN's input x, host
  const float* predictor_x = nullptr;        // floats at predictor_x (n * n_embd), or the device's
  int64_t hidden_row0 = 0;                   // hidden state from token hidden_row0 on (the residual)
};

// A device's memory, as its driver reports it now, and what its runtime takes besides Ember's
// own allocations (a CUDA context with its modules, which nvidia-smi counts to the process).
struct DeviceMemory {
  uint64_t free = 0, total = 0;
  uint64_t reserve = 0;
};
// What CUDA's context takes on the device (nvidia-smi's process memory less Ember's arena):
// measured 521 MiB on an H200 with CUDA 13 (2026-11-27, scripts/gpu_run.sh, docs/hybrid.md),
// kept with a tenth more for the modules of newer kernels. A budget given for the process is
// this much more than the plan's arena. (scripts/gpu_run.sh reads the number from here.)
constexpr uint64_t kCudaContextReserve = uint64_t{576} << 20;
// Left free on the device by --vram-budget auto and by the check of a given budget or plan
// (modules loaded lazily at a kernel's first launch, the allocator's granularity): 256 MiB, or
// a sixteenth of the free memory where that is less (a small stand-in device).
uint64_t device_free_margin(const DeviceMemory& mem);
// The plan's budget (its arena and KV cache, sparse/plan.hpp) for a process that may take
// `requested` bytes of the device (0: auto, the free memory less the margin, rounded down to
// 16 MiB so that a cached plan is found again): requested less the runtime's reserve. Throws
// naming the free memory when that does not fit.
uint64_t device_plan_budget(const DeviceMemory& mem, uint64_t requested, const std::string& device);

// Rows of a device's hidden state that belong to one sequence: rows first.. first + n - 1, at
// positions pos0.. of sequence `seq` (PlanModel::n_seq of them, each with its KV caches there).
struct AttnSpan {
  int64_t seq = 0, first = 0, n = 0, pos0 = 0;
};
// Checks that spans cover rows 0..n-1 in order, n <= max_rows, each of a sequence below n_seq.
void check_attn_spans(std::span<const AttnSpan> spans, int64_t n, int64_t max_rows, int64_t n_seq, const char* device);

// What a device is given to load.
struct DeviceLoad {
  const PlanModel* pm = nullptr;
  const PlanOptions* opts = nullptr;
  const Plan* plan = nullptr;
  // Per layer, the down rows of the device's neurons: row i is neuron plan->layers[l].gpu_neurons[i]
  // in hybrid_device_down_type (cpu::neuron_major_rows makes them); empty for a layer without any.
  std::vector<TensorView> down_rows;
  DType kv_type = DType::F16;       // of the KV cache of its attention layers
  int64_t n_batch = 1;              // the most tokens an attention block takes at once
};

// An FFN share of neurons `ids` of w: their rows as an FFN of their own, over the rows at
// `base` (gate, up, down_rows, up_b at the layout's offsets); down and down_b are left empty
// (the merge adds down_b once).
FfnWeights share_weights(const FfnWeights& w, const TensorView& down_rows, const uint8_t* base,
                         const DeviceArenaLayout::Share& s);
// What every Device::load starts with: checks that the plan, its model and options are given, that
// a device of `caps` runs the plan (device_refusal), the down rows (check_down_rows) and that the
// options count the scratch the device keeps (PlanOptions::scratch == DeviceCaps::scratch); then
// the arena's layout (device_arena_layout). Throws naming the device.
DeviceArenaLayout load_layout(const DeviceCaps& caps, const Model& model, const DeviceLoad& d);
// Checks DeviceLoad::down_rows against the plan: one per layer, as many rows as the layer's
// device neurons, of hybrid_device_down_type. Throws naming the layer.
void check_down_rows(const Model& model, const DeviceLoad& what);

// Which of a batch's tokens each of some neurons serves, token-major: token t and neuron c at
// data[t * stride + c], 1 where the token's own prediction names the neuron. Predictors are
// applied per token (a batch computes what its tokens decode one by one, as SparseFfn does).
struct PredictedMask {
  const uint8_t* data = nullptr;
  int64_t stride = 0;
  bool has(int64_t t, int64_t c) const { return data[t * stride + c] != 0; }
};

// Per-call scratch of ffn_share_partial, for up to max_batch tokens and n rows.
struct FfnShareScratch {
  float* act = nullptr;       // [max_batch][n]
  float* h = nullptr;         // [max_batch][n]
  int32_t* active = nullptr;  // [n] rows of the firing neurons
  void* mm = nullptr;         // gather_matmul_scratch_bytes(type, n_embd, max_batch)
  float* axpy = nullptr;      // sparse_axpy_scratch_floats(n_embd, max_batch, threads)
};

// out[t] = sum over the rows[i] (i < n_rows) of `share` that fire for some token of the batch
// (|firing value| > threshold, model/ffn.hpp) of their value times their down_t row. out holds
// n * n_embd floats and is overwritten; share.down_b is not added. Returns the number of
// (token, neuron) pairs that fired. With `allowed` (n x n_rows bytes, token-major), a row serves
// only the tokens it allows (their firing value is zeroed for the others: per-token predictions).
uint64_t ffn_share_partial(ThreadPool& pool, const FfnWeights& share, const int32_t* rows, int64_t n_rows,
                           cpu::Activation act, float threshold, const float* x, int64_t n, float* out,
                           const FfnShareScratch& s, const uint8_t* allowed = nullptr);

// Why a device of `caps` cannot hold layer l's experts the plan gives it, or empty.
std::string experts_refusal(const DeviceCaps& caps, const Model& model, size_t l);
// The same for layer l's attention block (its kind, head size and matrix types), and the output
// head (the hidden state it needs, its matrix's type).
std::string attention_refusal(const DeviceCaps& caps, const Model& model, size_t l);
std::string output_refusal(const DeviceCaps& caps, const Model& model);

// Bytes that crossed between the host and a device's hidden state (the hybrid's boundaries).
struct CrossingStats {
  uint64_t hidden_in = 0, hidden_out = 0;  // put_hidden / get_hidden calls
  uint64_t bytes = 0;                      // of those and of the FFN inputs and outputs
};

// What a device did on the host's behalf since its last reset_stats: kernels it launched one by
// one, graphs it replayed (and the nodes in them), the times the host waited for it, and the
// bytes copied each way. `ember bench` reports them per decode token. The CPU stand-in launches
// nothing; its waits are the caller's waits for its thread.
struct DeviceCounters {
  uint64_t launches = 0, graphs = 0, graph_nodes = 0, host_waits = 0, bytes_in = 0, bytes_out = 0;
};

// What a device holds (its arena and KV cache, since load) and what it did since its last
// reset_stats: the (token, neuron) pairs that fired there, the hidden state's crossings, and its
// launches, graphs, waits and copies.
struct DeviceStats {
  uint64_t bytes = 0;
  uint64_t fired = 0;
  CrossingStats crossings;
  DeviceCounters counters;
};

// The FFN block's merge, one rule for every device and the hybrid: o = cpu + dev + down_b, each
// part optional and added in that order (an absent CPU part counts as +0), n rows of n_embd.
void ffn_merge_partials(const float* cpu, const float* dev, const FfnWeights& w, float* o, int64_t n);

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;
  virtual DeviceCaps caps() const = 0;
  // Allocates the arena (device_arena_layout) and copies every layer's share and attention
  // tensors. Refuses (throws naming why) what caps() does not cover.
  virtual void load(const Model& model, const DeviceLoad& what) = 0;

  // FFN share of a layer whose attention is on the CPU and that has a share (or its predictor,
  // with rule.predict): starts the partial FFN on n <= max_batch tokens (x: n * n_embd floats,
  // read before ffn_begin returns); ffn_end waits for the partial output (n * n_embd floats,
  // valid until the next ffn_begin; zeros for a layer with no share).
  virtual void ffn_begin(int64_t layer, const float* x, int64_t n, const ShareRule& rule) = 0;
  virtual const float* ffn_end() = 0;
  // After ffn_begin, or ffn_block_begin with host input, with rule.predict: waits for the
  // prediction (not for the share) and returns, per token of the batch, one byte per CPU neuron
  // of the layer (the neurons not in its share, ascending), 1 where the predictor names it for
  // that token. Valid until the next ffn_begin.
  virtual PredictedMask ffn_predicted() = 0;

  // A mixture's layer with experts here (LayerPlacement::gpu_experts): starts them on n <= max_batch
  // tokens of x (n * n_embd floats, the FFN's input; read before it returns) whose choices are
  // ids (n * n_used expert ids, the host's routing: moe_route); experts_end waits and returns,
  // for each of its experts that some token chose, ascending, one row of n_embd floats per slot
  // (each of the expert's tokens ascending): the expert's output, unweighted (moe_expert_rows).
  // Valid until the next call. Devices without experts (caps().experts false) refuse them.
  virtual void experts_begin(int64_t layer, const float* x, int64_t n, const int32_t* ids);
  virtual const float* experts_end();

  // Runs of layers whose attention is here. The hidden state in (n * n_embd floats; spans: its
  // rows' sequences and positions, empty for rows that only the output head reads):
  virtual void put_hidden(const float* x, int64_t n, std::span<const AttnSpan> spans) = 0;
  // The attention block of `layer` on the hidden state's n rows, which hold the spans' rows in
  // order (those given to put_hidden): each span's tokens of sequence `seq` at positions pos0..
  // (its own KV cache here).
  virtual void attention(int64_t layer, std::span<const AttnSpan> spans, int64_t n) = 0;
  // The FFN block here: its norm, then the layer's share (and predictor) on it (rule). With
  // host_input the FFN's input (n * n_embd floats) and, predicting, the CPU's part of the
  // prediction (ffn_predicted) come to the host: ffn_host_input waits for them (the one wait of
  // a layer whose CPU neurons need its input). ffn_block_end takes the CPU's partial output
  // (n * n_embd floats; null where the CPU has none) and merges it there (ffn_merge_partials),
  // then the post-norm and the residual, without waiting.
  virtual void ffn_block_begin(int64_t layer, int64_t n, const ShareRule& rule, bool host_input) = 0;
  virtual const float* ffn_host_input() = 0;
  virtual void ffn_block_end(int64_t layer, const float* cpu_out, int64_t n) = 0;
  // The hidden state's first n rows out to x, and the output head (Plan::output_gpu) on them:
  // logits (n x n_vocab floats). Both are queued: x and logits hold the results after sync().
  virtual void get_hidden(float* x, int64_t n) = 0;
  virtual void output(int64_t n, float* logits) = 0;
  // Waits for everything queued and writes the results of get_hidden and output.
  virtual void sync() = 0;
  // The calls from capture_begin(key) to the next sync(), none of them with host input, may be
  // recorded once per key and replayed for later calls with that key (a CUDA graph): the same
  // calls with the same shapes, positions and inputs read on the device. key 0: not captured.
  // Devices without graphs run the calls as they come.
  virtual void capture_begin(uint64_t key) { (void)key; }

  virtual DeviceMemory memory() const = 0;        // free and total now, the runtime's reserve
  virtual DeviceStats stats() const = 0;
  virtual void reset_stats() = 0;
};

}  // namespace ember
