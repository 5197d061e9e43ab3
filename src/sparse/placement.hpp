// What a placement is, apart from how it is found (sparse/plan.hpp: the solvers, the cost model,
// plan files): per layer, whether attention and its KV cache live on the device and which FFN
// neurons do (Plan), the model as placement sees it (PlanModel), and the exact byte accounting
// every solver, plan file and device allocation counts with (device/device.hpp lays out its
// arena by these functions). Devices and executors include this header, not the planner's.
//
// Every buffer the GPU holds is counted padded to kGpuAlign bytes (cudaMalloc's alignment).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "ops/cpu/sparse/sparse.hpp"

namespace ember {

constexpr uint64_t kGpuAlign = 256;
inline uint64_t gpu_pad(uint64_t n) { return (n + kGpuAlign - 1) / kGpuAlign * kGpuAlign; }
class DeviceScratch;

// One layer as the solvers see it: byte sizes on the GPU and firing probabilities.
struct PlanLayer {
  uint64_t attn_bytes = 0;       // attention weights and norms, each tensor padded
  uint64_t kv_bytes = 0;         // K and V for the context in the cache's type (KvCache::bytes_for), of every sequence
  uint64_t predictor_bytes = 0;  // fc1 + fc2, each padded (0 when the model has no predictor)
  uint64_t gate_row = 0, up_row = 0, down_row = 0;  // bytes of one neuron in each on the GPU (down: neuron-major)
  // Bytes of one firing neuron's down the CPU reads: of hybrid_cpu_down_type for the whole layer
  // on the CPU, its scale tables spread over the firing neurons (the executor decides again for
  // the neurons the plan leaves it, which are colder).
  uint64_t cpu_down_row = 0;
  uint64_t bias_row = 0;         // bytes of one neuron's up bias (OPT: 4), 0 without one
  std::vector<float> p;          // firing probability of each neuron, in [0, 1] (empty in a mixture's layer)
  // A mixture's layer: its experts are placed whole. Each expert's routing probability (the share
  // of tokens that choose it, in [0, 1]; they sum to n_used), the bytes one expert takes on the
  // device (gate, up, down, each padded) and those the CPU reads for a token routed to it (its
  // three matrices as loaded); the router stays on the CPU, read for every token.
  std::vector<float> expert_p;
  uint64_t expert_bytes = 0, expert_cpu_bytes = 0, router_bytes = 0;
  bool moe() const { return !expert_p.empty(); }
};

struct PlanModel {
  std::string name;
  int64_t n_embd = 0, n_ff = 0, n_head = 0, q_dim = 0, kv_dim = 0, n_ctx = 0, n_vocab = 0;
  // Sequences generating at once (`ember serve --parallel`): a device holding a layer's attention
  // holds a KV cache per sequence (PlanLayer::kv_bytes counts them all).
  int64_t n_seq = 1;
  uint64_t output_bytes = 0;  // the output matrix, read per token where the head runs
  // The output head on the device (Plan::output_gpu): its norm, norm bias and matrix, each padded;
  // 0 where the head cannot go there.
  uint64_t output_weights_bytes = 0;
  // Whether the executor runs the layers' predictors (fc1/fc2, sparse/predictor.hpp) and reads
  // the predicted neurons' rows only; else every gate row is read (the oracle rule). With them a
  // layer that uses the GPU holds its predictor there (PlanLayer::predictor_bytes, 0 without).
  bool predicted = false;
  int64_t predictor_rank = 0;  // the largest fc1 rank (sizes the device's predictor scratch); 0 without
  // Mixtures: the most experts a token runs in a layer and the widest expert (size the device's
  // expert scratch); 0 in a dense model.
  int64_t n_expert_used = 0, n_ff_expert = 0;
  std::vector<PlanLayer> layers;
};

struct PlanOptions {
  int64_t group_size = 64;        // neurons per ILP variable
  int64_t min_gpu_neurons = 256;  // a layer that uses the GPU holds at least this many (or all) neurons
  int64_t max_batch = 16;         // tokens per GPU pass (sizes the scratch)
  double time_limit = 10.0;       // seconds for CBC
  double gap_tolerance = 1e-4;    // CBC stops when the relative optimality gap is below this
  // Whether the device can hold attention blocks (DeviceCaps::attention): when not, no solver
  // places attention there and validation refuses a plan that does.
  bool attention = true;
  // Whether the device runs a mixture's experts (DeviceCaps::experts): when not, no solver places
  // experts there and validation refuses a plan that does.
  bool experts = true;
  // The scratch its kernels keep (DeviceCaps::scratch); null: the common buffers only.
  const DeviceScratch* scratch = nullptr;
  // Its name as plan files record it: the device kind's ("cpu": the common buffers, the stand-in's).
  const char* scratch_name() const;
};

enum class PlanMethod { ilp, greedy, layer_split };
PlanMethod parse_plan_method(const std::string& s);  // "ilp" | "greedy" | "layer-split"
const char* plan_method_name(PlanMethod m);

struct LayerPlacement {
  bool attn_gpu = false;             // attention weights and KV cache on the GPU
  std::vector<int32_t> gpu_neurons;  // sorted ascending, no duplicates
  std::vector<int32_t> gpu_experts;  // a mixture's layer: its experts on the GPU, whole; sorted, unique
};

struct Plan {
  PlanMethod method = PlanMethod::greedy;
  std::vector<LayerPlacement> layers;
  // The output head (final norm, output matrix, soft-cap) on the device: it needs the hidden
  // state's buffers there (the attention scratch) and a device that holds hidden states.
  bool output_gpu = false;
  // Filled by the solvers (and read back from plan files):
  uint64_t vram_budget = 0;
  uint64_t gpu_bytes = 0;            // = gpu_bytes(model, opts, *this)
  double objective = 0;              // seconds per token the GPU saves (cost model)
  double seconds_per_token = 0;      // predicted by the cost model
  std::string status;                // "optimal", "time limit", "heuristic", ...
  double gap = 0;                    // ILP: (bound - objective) / max(|bound|, tiny); 0 when proven optimal
  double solve_seconds = 0;
  std::string key;                   // cache key (model, profile, budget)

  bool layer_uses_gpu(size_t l) const {
    return layers[l].attn_gpu || !layers[l].gpu_neurons.empty() || !layers[l].gpu_experts.empty();
  }
  int64_t n_gpu_neurons() const;
  int64_t n_gpu_experts() const;
};

// ---- exact byte accounting (the one function) ---------------------------------------------

// A device arena's parts, each buffer's offset given by `take(bytes)` in the order the layout
// function lists them. The same function lays a device's arena out (device_arena_layout) and sums
// it for the solvers (the *_bytes functions below), so the two cannot disagree.
using ArenaTake = std::function<uint64_t(uint64_t bytes)>;

// One layer's FFN share on the GPU: n neurons' gate, up and down rows, their up bias where the
// FFN has one, and their index list (0..n-1).
struct FfnShareLayout {
  int64_t n = 0;  // neurons
  uint64_t gate = 0, up = 0, down = 0, up_b = 0, rows = 0;
};
FfnShareLayout lay_out_ffn_share(const PlanLayer& L, int64_t n, const ArenaTake& take);
// Its bytes, each buffer padded; 0 when n == 0.
uint64_t gpu_ffn_share_bytes(const PlanLayer& L, int64_t n);
// A device arena's scratch, side by side (FFN, attention, experts): first the common buffers every
// kind of device keeps (what the CPU stand-in's kernels use), then the buffers a kind's own
// kernels keep besides (its DeviceScratch, PlanOptions::scratch; CUDA's in
// device/cuda/cuda_scratch.hpp), from the offset each side records (`*_own`), where the kind
// finds them again. The lay_out_* functions lay out both; the *_bytes ones sum them for the
// solvers.
//
// The FFN side (any layer with GPU neurons, or with its predictor there), for opts.max_batch
// tokens: the input, the partial output (n_embd floats each), the gate's and up's values (n_ff
// each; up's holds the predictor's scores first), the firing neurons' rows (n_ff int32); with
// predictors their input (n_embd: the residual, where it is not the FFN input).
struct FfnScratch {
  uint64_t x = 0, out = 0, act = 0, h = 0, active = 0, px = 0;
  uint64_t ffn_own = 0;  // where the device kind's own FFN buffers begin
};
FfnScratch lay_out_ffn_scratch(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take);
uint64_t gpu_ffn_scratch_bytes(const PlanModel& m, const PlanOptions& opts);
// Whether a plan needs the FFN scratch: some layer has GPU neurons or runs its predictor there.
bool gpu_needs_ffn_scratch(const PlanModel& m, const Plan& plan);
// The attention side (any layer with attention on the GPU, or the output head): no common buffer
// (the stand-in runs attention in a workspace of its own).
struct AttnScratch {
  uint64_t attn_own = 0;  // where the device kind's own attention buffers begin
};
AttnScratch lay_out_attn_scratch(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take);
uint64_t gpu_attn_scratch_bytes(const PlanModel& m, const PlanOptions& opts);
// Whether a plan needs the attention scratch (the device holds hidden states): some layer's
// attention is there, or the output head.
bool gpu_needs_attn_scratch(const Plan& plan);
// The experts' side (any layer with experts on the GPU), for opts.max_batch tokens of
// n_expert_used slots (a token's row for each expert it chose): the slots' inputs and outputs
// (n_embd floats each).
struct ExpertScratch {
  uint64_t ex_x = 0, ex_out = 0;
  uint64_t experts_own = 0;  // where the device kind's own experts' buffers begin
};
ExpertScratch lay_out_expert_scratch(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take);
uint64_t gpu_expert_scratch_bytes(const PlanModel& m, const PlanOptions& opts);
bool gpu_needs_expert_scratch(const Plan& plan);

// A kind of device whose kernels keep buffers besides the common ones: it gives each side's
// buffers through `take`, in its own order (its device keeps their offsets).
class DeviceScratch {
 public:
  virtual ~DeviceScratch() = default;
  virtual const char* name() const = 0;  // the device kind's (`--hybrid-device`), as plan files record it
  virtual void ffn(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) const = 0;
  virtual void attention(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) const = 0;
  virtual void experts(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) const = 0;
};
// A take that hands out offsets from `off` on (advancing it by each buffer's padded bytes): how
// an arena is laid out, and how a kind finds its own buffers from where they start.
ArenaTake arena_cursor(uint64_t& off);

// The output head on the device: its weights and the logits of max_batch rows.
uint64_t gpu_output_bytes(const PlanModel& m, const PlanOptions& opts);
// Everything layer l puts on the GPU (attention + KV when attn, predictor when it uses the GPU,
// the FFN share, n_experts whole experts).
uint64_t gpu_layer_bytes(const PlanLayer& L, bool attn, int64_t n_neurons, int64_t n_experts);
// The FFN part alone: every layer's FFN share plus the FFN scratch when the plan needs it (what
// a device running only the FFN allocates, device/device.hpp; the predictors are not in it).
uint64_t gpu_ffn_bytes(const PlanModel& m, const PlanOptions& opts, const Plan& plan);
// Everything the plan puts on the GPU: the layers, the output head, plus the scratch in use
// (the experts' scratch last).
uint64_t gpu_bytes(const PlanModel& m, const PlanOptions& opts, const Plan& plan);

// The neuron-major down of an FFN on each side of the hybrid (the planner's row sizes and the
// executor's copies agree through these two): the file's down_t where it has one (PowerInfer's
// layout); else
//  - the CPU reads a copy of its own: for Q4_0 / Q4_1 / Q4_K either the file's codes and scales
//    (Q4_0_NM / Q4_1_NM, 16/32 bytes a value, but each block of 32 neurons with one firing reads
//    its scale table, 2 bytes an output) or Q8_0 rows (34/32 bytes a value): whichever takes less
//    time per token for the CPU's neurons `ids` firing with p (neuron_major_expected_cost; the
//    tables and the slower kernel pay from about 5 firing neurons a block, 17 %: threshold-mode
//    densities, not a ReLU model's cold neurons); other types neuron_major_dtype(down, choice);
//  - a device holds its neurons' rows in the `exact` row type (F32 / F16 / BF16 as they are, else
//    Q8_0): a device's share is a list of rows, which the shared scale tables are not.
DType hybrid_device_down_type(const FfnWeights& w, int64_t n_embd);

}  // namespace ember
