// Neuron placement for hybrid GPU-CPU inference (`ember plan`).
//
// A plan says, per layer, whether attention and its KV cache live on the GPU and which FFN
// neurons do. Three solvers produce one:
//   ilp:         an integer linear program solved with COIN-OR CBC (plan_ilp.cpp): neurons in
//                groups (hot first) as binary variables, time-limited, optimality gap reported;
//   greedy:      groups by benefit per byte (plan_greedy.cpp), for comparison and as a fallback
//                (and the ILP's starting solution, so the ILP is never worse);
//   layer_split: whole layers from the first (llama.cpp's -ngl) (plan_layer_split.cpp).
//
// What a plan is and what it puts on the device are in sparse/placement.hpp, which devices read
// without this header. Memory is counted by one function there, gpu_bytes(), used by all three
// solvers, by the plan file's validation and by a device's allocation (device/device.hpp): a plan
// never exceeds its budget by construction, and every solver's result is checked against it
// before it is returned.
//
// Cost model (seconds per generated token, one token at a time): every byte a layer reads is
// read at its device's bandwidth: attention weights plus half the KV cache (the mean position
// over a full context), and the FFN rows the executor reads; in a mixture's layer the router
// (on the CPU) and each expert's matrices times its routing probability (from the profile's
// routing counts, `blk.N.ffn_expert_count`). With predictors (PlanModel::
// predicted) that is the predictor and p_j * (gate + up + down) bytes for each neuron j (firing
// probability p_j from the activation profile, standing for the predicted rows); without, the
// gate decides, so every gate row is read on its side, and p_j * (up + down). Down is counted in
// the bytes of the side's own copy (PlanLayer::down_row, cpu_down_row). A layer that uses the GPU pays a fixed
// synchronization plus two n_embd float transfers over PCIe. The output matrix is read where
// the head runs (Plan::output_gpu), which then pays one synchronization and the hidden state up
// and the logits down. The model adds the CPU and GPU parts of a layer (no overlap): conservative, and linear,
// so the ILP's objective and the reported speed are one and the same function.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "ops/cpu/sparse/sparse.hpp"
#include "sparse/placement.hpp"

namespace ember {

// The machine: the GPU memory budget and the throughputs of the cost model.
struct DeviceDesc {
  uint64_t vram_budget = 0;       // bytes Ember may allocate on the GPU (CUDA's context not included)
  double gpu_bandwidth = 1.5e12;  // bytes/s the GPU reads weights at
  double cpu_bandwidth = 50e9;    // bytes/s the CPU reads weights at
  double pcie_bandwidth = 25e9;   // bytes/s host <-> device
  double sync_seconds = 20e-6;    // per layer that uses the GPU: launches, events, the wait
};

// ---- cost model ---------------------------------------------------------------------------

// The bytes a layer reads per generated token on each side under a placement, as the cost model
// counts them (attention and half the KV cache, the predictor, the neurons' rows by their firing
// probabilities, a mixture's router and experts by their routing probabilities).
struct LayerTraffic {
  double cpu = 0, gpu = 0;
};
LayerTraffic layer_bytes_per_token(const PlanModel& m, const PlanLayer& L, const LayerPlacement& P);
// Predicted seconds per generated token of a placement: each layer's traffic at its side's
// bandwidth, a synchronization per layer that uses the GPU, the output head.
double predict_seconds_per_token(const PlanModel& m, const DeviceDesc& dev, const Plan& plan);
// Seconds per token with everything on the CPU.
double predict_cpu_seconds_per_token(const PlanModel& m, const DeviceDesc& dev);

// ---- solvers ------------------------------------------------------------------------------

// Checks the inputs (positive sizes, probabilities in [0, 1], sane options); throws naming what
// is wrong.
void validate(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts);
// Checks a plan against a model and budget: shapes, sorted unique neuron ids, the minimum
// neuron count, and gpu_bytes <= budget. Throws naming the first problem.
void validate_plan(const PlanModel& m, const PlanOptions& opts, const Plan& plan, uint64_t budget);

Plan plan_greedy(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts);
Plan plan_layer_split(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts);
Plan plan_ilp(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts);
Plan make_plan(PlanMethod method, const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts);

// Fills gpu_bytes, objective, seconds_per_token and vram_budget of a placement (solvers call it).
void finish_plan(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts, Plan& plan);
// finish_plan for a solver without a bound (no gap), then validate_plan against the budget.
Plan finish_heuristic(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts, Plan plan,
                      const char* status, double seconds);

// Neurons of layer L sorted by firing probability, hottest first (ties by index), cut into
// groups of group_size (the last may be smaller): the ILP's and greedy's unit of placement.
// Group g is order[begin[g] .. begin[g + 1]) with firing mass mass[g] (sum of p).
struct NeuronGroups {
  std::vector<int32_t> order;
  std::vector<int64_t> begin;  // n_groups + 1 entries
  std::vector<double> mass;
  size_t size() const { return mass.size(); }
  int64_t count(size_t g) const { return begin[g + 1] - begin[g]; }
};
NeuronGroups neuron_groups(const PlanLayer& L, int64_t group_size);
// The sorted neuron ids of the chosen groups.
std::vector<int32_t> neurons_of_groups(const NeuronGroups& groups, const std::vector<char>& chosen);

// Cost-model helpers the solvers share (seconds per token).
// FFN neurons moved to the GPU: `count` neurons of firing mass `mass` (their gate rows whole
// without predictors, m.predicted).
double neuron_seconds_saved(const PlanModel& m, const DeviceDesc& dev, const PlanLayer& L, double mass, int64_t count);
double attn_seconds_saved(const DeviceDesc& dev, const PlanLayer& L);                 // attention + KV moved
// Expert e of a mixture's layer moved, whole: its routing probability times its bytes at each
// side's bandwidth.
double expert_seconds_saved(const DeviceDesc& dev, const PlanLayer& L, size_t e);
// The fewest neurons a layer that uses the GPU holds: min(min_gpu_neurons, its neurons); 0 in a
// mixture's layer (its experts are placed whole).
int64_t layer_min_neurons(const PlanLayer& L, const PlanOptions& opts);
// The output head moved: its matrix at the GPU's bandwidth, less a synchronization and the
// transfers (the hidden state up, the logits down).
double output_seconds_saved(const PlanModel& m, const DeviceDesc& dev);
double layer_fixed_seconds(const PlanModel& m, const DeviceDesc& dev, const PlanLayer& L);  // sync - predictor saving

// ---- inputs -------------------------------------------------------------------------------

// Per-layer firing probabilities from a profile file (docs/sparse_formats.md): counts / n_tokens.
std::vector<std::vector<float>> read_profile_probabilities(const std::string& path, int64_t n_layer, int64_t n_ff);
// A synth model's known profile (ember.synth.* metadata); empty when the file has none.
std::vector<std::vector<float>> synth_profile_probabilities(const Model& model);
// The probabilities of the units a plan places in each layer (plan_units): a dense layer's
// neurons' firing, a mixture layer's experts' routing. From `profile_path` when given, else the
// synth model's known profile (dense), else <model>.profile.gguf beside the model; a mixture
// without a profile counts every expert as equally likely (n_used / n_expert). Throws naming the
// ways to provide one. `source` (optional) receives what was used, for messages and cache keys.
int64_t plan_units(const Model& model, size_t layer);  // n_ff, or a mixture layer's n_expert
std::vector<std::vector<float>> plan_probabilities(const Model& model, const std::string& profile_path,
                                                   std::string* source = nullptr);
// Expected bytes per token of reading the down rows of neurons ids[] (neuron j fires with
// probability p[j], independently) in a neuron-major matrix of type t: the firing neurons' rows,
// and for Q4_0_NM / Q4_1_NM the scale tables of every block of 32 neurons with one firing.
double neuron_major_expected_bytes(DType t, int64_t n_embd, const std::vector<float>& p,
                                   const std::vector<int32_t>& ids);
// The shared-scale axpy (ops/cpu/nm4/nm4.hpp) reads its bytes at about this share of the rate of the
// row-wise axpy over Q8_0 rows: measured one thread, cold, Zen 4 (bench_sparse, docs/benchmarks.md:
// SparseAxpy/Q4_0_NM/2048x5632 against SparseAxpy/Q8_0/5632x2048): 0.80-1.01 at 10 % of
// the rows, 0.75-0.81 at 25 and 50 %.
constexpr double kNm4AxpyRate = 0.8;
// neuron_major_expected_bytes in bytes of the row-wise kernels' time: the shared-scale layout's
// divided by kNm4AxpyRate.
double neuron_major_expected_cost(DType t, int64_t n_embd, const std::vector<float>& p,
                                  const std::vector<int32_t>& ids);

// The CPU's neuron-major down in the hybrid: see hybrid_device_down_type (sparse/placement.hpp),
// the rule for both sides.
DType hybrid_cpu_down_type(const FfnWeights& w, int64_t n_embd, cpu::NeuronMajorType choice,
                           const std::vector<float>& p, const std::vector<int32_t>& ids);

// The solver's view of a loaded model with probabilities p[layer][unit] (plan_probabilities), for a context of n_ctx
// with a KV cache of kv_type (F16 as the engine's default; KvCache::bytes_for counts it).
// `predictors`: the executor runs the model's predictors (it must have them): counted on the
// GPU of the layers that use it, and the cost model charges predicted rows only. `cpu_down`: the
// CPU's copy of down (hybrid_cpu_down_type), whose bytes the cost model charges the CPU.
PlanModel plan_model_from(const Model& model, const std::vector<std::vector<float>>& p, int64_t n_ctx,
                          DType kv_type = DType::F16, bool predictors = false,
                          cpu::NeuronMajorType cpu_down = cpu::NeuronMajorType::exact, int64_t n_seq = 1);
// The same from shapes alone (a model too large to write, e.g. 7B): weights of `type`, llama
// layout, no predictor, probabilities p.
PlanModel plan_model_from_shapes(const std::string& name, int64_t n_embd, int64_t n_ff, int64_t n_layer,
                                 int64_t n_head, int64_t n_head_kv, int64_t n_vocab, DType type, int64_t n_ctx,
                                 const std::vector<std::vector<float>>& p, DType kv_type = DType::F16);

// A plan model for n_seq sequences at once (PlanModel::n_seq; every layer's KV bytes scaled).
void set_plan_sequences(PlanModel& m, int64_t n_seq);

// "4GiB", "512MiB", "1.5G", "123456" (bytes) -> bytes; throws naming the accepted forms.
uint64_t parse_byte_size(const std::string& s);

// ---- plan files (GGUF, general.architecture = "ember-plan", docs/sparse_formats.md) --------

void write_plan(const Plan& plan, const PlanModel& m, const PlanOptions& opts, const std::string& path);
// Reads and validates a plan for model m (shape, ids, budget). Throws naming the problem.
Plan read_plan(const std::string& path, const PlanModel& m, PlanOptions* opts_out = nullptr);

}  // namespace ember
