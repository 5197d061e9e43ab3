// Placement: byte accounting, cost model, validation, inputs and plan files. The solvers are
// in plan_ilp.cpp, plan_greedy.cpp and plan_layer_split.cpp.
#include "sparse/plan.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <numeric>

#include "core/error.hpp"
#include "gguf/writer.hpp"
#include "model/kv_cache.hpp"
#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_ops.hpp"
#include "sparse/predictor.hpp"
#include "model/synth.hpp"
#include "ops/cpu/nm4.hpp"
#include "ops/cpu/sparse.hpp"

namespace ember {

PlanMethod parse_plan_method(const std::string& s) {
  if (s == "ilp") return PlanMethod::ilp;
  if (s == "greedy") return PlanMethod::greedy;
  if (s == "layer-split") return PlanMethod::layer_split;
  fail("unknown placement method '{}' (expected ilp, greedy or layer-split)", s);
}

const char* plan_method_name(PlanMethod m) {
  switch (m) {
    case PlanMethod::ilp: return "ilp";
    case PlanMethod::greedy: return "greedy";
    case PlanMethod::layer_split: return "layer-split";
  }
  return "?";
}

int64_t Plan::n_gpu_neurons() const {
  int64_t n = 0;
  for (const auto& L : layers) n += static_cast<int64_t>(L.gpu_neurons.size());
  return n;
}

// ---- byte accounting ----------------------------------------------------------------------

uint64_t gpu_ffn_share_bytes(const PlanLayer& L, int64_t n) {
  if (n <= 0) return 0;
  const uint64_t k = static_cast<uint64_t>(n);
  return gpu_pad(k * L.gate_row) + gpu_pad(k * L.up_row) + gpu_pad(k * L.down_row) +
         (L.bias_row ? gpu_pad(k * L.bias_row) : 0) + gpu_pad(k * sizeof(int32_t));
}

uint64_t gpu_ffn_counts_bytes(const PlanModel& m) {
  return sizeof(uint64_t) + static_cast<uint64_t>(m.n_ff) * sizeof(int32_t);
}

uint64_t gpu_ffn_scratch_bytes(const PlanModel& m, const PlanOptions& opts) {
  const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
  // x in, partial out (n_embd each), gate and up activations (n_ff each; the up buffer holds
  // the predictor's scores first), the active neurons' rows (n_ff) and their positions in the
  // share (n_ff, then two counters: active, fired).
  // Then the down axpy's partial sums (cuda::sparse_axpy: kAxpyChunks rows of n_embd), x
  // rounded to 8 bits for the quantized gate and up rows (gpu_q8_bytes), and the firing counts
  // per position (gpu_ffn_counts_bytes).
  uint64_t t = 2 * gpu_pad(b * m.n_embd * f) + 2 * gpu_pad(b * m.n_ff * f) + gpu_pad(m.n_ff * sizeof(int32_t)) +
               gpu_pad((m.n_ff + 2) * sizeof(int32_t)) +
               gpu_pad(static_cast<uint64_t>(cuda::kAxpyChunks) * m.n_embd * f) +
               gpu_pad(gpu_q8_bytes(m.n_embd, opts.max_batch)) + gpu_pad(gpu_ffn_counts_bytes(m));
  // With predictors: their input (n_embd: the residual, where it is not the FFN input), hidden
  // layer (rank), the prediction of the layer's neurons per token (max_batch x n_ff bytes) and
  // the predicted share rows (n_ff, then their count and a spare: cuda::compact's totals), then
  // the input and the hidden layer rounded to 8 bits.
  if (m.predicted)
    t += gpu_pad(b * m.n_embd * f) + gpu_pad(b * static_cast<uint64_t>(m.predictor_rank) * f) + gpu_pad(b * m.n_ff) +
         gpu_pad((m.n_ff + 2) * sizeof(int32_t)) + gpu_pad(gpu_q8_bytes(m.n_embd, opts.max_batch)) +
         gpu_pad(gpu_q8_bytes(m.predictor_rank, opts.max_batch));
  return t;
}

bool gpu_needs_ffn_scratch(const PlanModel& m, const Plan& plan) {
  for (const auto& P : plan.layers)
    if (!P.gpu_neurons.empty() || (m.predicted && P.attn_gpu)) return true;
  return false;
}

uint64_t gpu_attn_scratch_bytes(const PlanModel& m, const PlanOptions& opts) {
  const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
  // The hidden state, the norm's output and the block's output; q, k, v, the attention's
  // output, the scores of every head over the context; the RoPE tables (global, local) of
  // head_dim / 2 inverse frequencies (doubles) each. device_arena_layout lays them out in this order.
  // Then the block's inputs rounded to 8 bits for quantized matrices (n_embd or q_dim values),
  // the attention's partial results over chunks of the context (cuda_blocks.hpp), and the
  // positions of the rows' sequences (max_batch int32, read by the kernels on the device).
  const uint64_t rope = gpu_pad(static_cast<uint64_t>(m.q_dim / m.n_head / 2) * sizeof(double));
  const uint64_t partial = static_cast<uint64_t>(
      cuda::attention_partial_floats(opts.max_batch, m.n_head, m.q_dim / m.n_head, m.n_ctx));
  return 3 * gpu_pad(b * m.n_embd * f) + gpu_pad(b * m.q_dim * f) + 2 * gpu_pad(b * m.kv_dim * f) +
         gpu_pad(b * m.q_dim * f) + gpu_pad(b * m.n_head * m.n_ctx * f) + 2 * rope +
         gpu_pad(gpu_q8_bytes(std::max(m.n_embd, m.q_dim), opts.max_batch)) + gpu_pad(partial * f) +
         gpu_pad(b * sizeof(int32_t));
}

bool gpu_needs_attn_scratch(const Plan& plan) {
  if (plan.output_gpu) return true;
  for (const auto& P : plan.layers)
    if (P.attn_gpu) return true;
  return false;
}

uint64_t gpu_output_bytes(const PlanModel& m, const PlanOptions& opts) {
  return m.output_weights_bytes +
         gpu_pad(static_cast<uint64_t>(opts.max_batch) * static_cast<uint64_t>(m.n_vocab) * sizeof(float));
}

uint64_t gpu_layer_bytes(const PlanLayer& L, bool attn, int64_t n_neurons) {
  uint64_t b = gpu_ffn_share_bytes(L, n_neurons);
  if (attn) b += L.attn_bytes + L.kv_bytes;
  if (attn || n_neurons > 0) b += L.predictor_bytes;
  return b;
}

uint64_t gpu_ffn_bytes(const PlanModel& m, const PlanOptions& opts, const Plan& plan) {
  EMBER_CHECK(plan.layers.size() == m.layers.size(), "plan has {} layers, the model {}", plan.layers.size(),
              m.layers.size());
  uint64_t total = 0;
  for (size_t l = 0; l < m.layers.size(); ++l)
    total += gpu_ffn_share_bytes(m.layers[l], static_cast<int64_t>(plan.layers[l].gpu_neurons.size()));
  return gpu_needs_ffn_scratch(m, plan) ? total + gpu_ffn_scratch_bytes(m, opts) : 0;
}

uint64_t gpu_bytes(const PlanModel& m, const PlanOptions& opts, const Plan& plan) {
  EMBER_CHECK(plan.layers.size() == m.layers.size(), "plan has {} layers, the model {}", plan.layers.size(),
              m.layers.size());
  uint64_t total = 0;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const auto& P = plan.layers[l];
    total += gpu_layer_bytes(m.layers[l], P.attn_gpu, static_cast<int64_t>(P.gpu_neurons.size()));
  }
  if (plan.output_gpu) total += gpu_output_bytes(m, opts);
  if (gpu_needs_ffn_scratch(m, plan)) total += gpu_ffn_scratch_bytes(m, opts);
  if (gpu_needs_attn_scratch(plan)) total += gpu_attn_scratch_bytes(m, opts);
  return total;
}

// ---- cost model ---------------------------------------------------------------------------

namespace {

double attn_read_bytes(const PlanLayer& L) { return static_cast<double>(L.attn_bytes) + 0.5 * L.kv_bytes; }
// Bytes read per firing neuron, and per neuron whether it fires or not (the gate, where it decides).
double neuron_bytes(const PlanModel& m, const PlanLayer& L, bool cpu) {
  return static_cast<double>((m.predicted ? L.gate_row : 0) + L.up_row + (cpu ? L.cpu_down_row : L.down_row));
}
double neuron_fixed_bytes(const PlanModel& m, const PlanLayer& L) {
  return m.predicted ? 0.0 : static_cast<double>(L.gate_row);
}
double sync_seconds(const PlanModel& m, const DeviceDesc& dev) {
  return dev.sync_seconds + 2.0 * m.n_embd * sizeof(float) / dev.pcie_bandwidth;
}

}  // namespace

double predict_seconds_per_token(const PlanModel& m, const DeviceDesc& dev, const Plan& plan) {
  const double c = 1.0 / dev.cpu_bandwidth;
  double t = static_cast<double>(m.output_bytes) * c;
  if (plan.output_gpu) t -= output_seconds_saved(m, dev);
  const double g = 1.0 / dev.gpu_bandwidth;
  std::vector<char> on_gpu;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const PlanLayer& L = m.layers[l];
    const LayerPlacement& P = plan.layers[l];
    const bool uses = P.attn_gpu || !P.gpu_neurons.empty();
    t += attn_read_bytes(L) * (P.attn_gpu ? g : c);
    t += static_cast<double>(L.predictor_bytes) * (uses ? g : c);
    on_gpu.assign(L.p.size(), 0);
    for (int32_t j : P.gpu_neurons) on_gpu[static_cast<size_t>(j)] = 1;
    double mass_cpu = 0, mass_gpu = 0;
    for (size_t j = 0; j < L.p.size(); ++j) (on_gpu[j] ? mass_gpu : mass_cpu) += L.p[j];
    const double n_gpu = static_cast<double>(P.gpu_neurons.size()), n_cpu = static_cast<double>(L.p.size()) - n_gpu;
    t += mass_cpu * neuron_bytes(m, L, true) * c + mass_gpu * neuron_bytes(m, L, false) * g +
         neuron_fixed_bytes(m, L) * (n_cpu * c + n_gpu * g);
    if (uses) t += sync_seconds(m, dev);
  }
  return t;
}

double predict_cpu_seconds_per_token(const PlanModel& m, const DeviceDesc& dev) {
  Plan none;
  none.layers.resize(m.layers.size());
  return predict_seconds_per_token(m, dev, none);
}

void finish_plan(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts, Plan& plan) {
  plan.vram_budget = dev.vram_budget;
  plan.gpu_bytes = gpu_bytes(m, opts, plan);
  plan.seconds_per_token = predict_seconds_per_token(m, dev, plan);
  plan.objective = predict_cpu_seconds_per_token(m, dev) - plan.seconds_per_token;
}

NeuronGroups neuron_groups(const PlanLayer& L, int64_t group_size) {
  NeuronGroups gr;
  gr.order.resize(L.p.size());
  std::iota(gr.order.begin(), gr.order.end(), 0);
  std::stable_sort(gr.order.begin(), gr.order.end(), [&](int32_t a, int32_t b) { return L.p[a] > L.p[b]; });
  const int64_t n = static_cast<int64_t>(L.p.size());
  for (int64_t b = 0; b < n; b += group_size) {
    gr.begin.push_back(b);
    double s = 0;
    for (int64_t i = b; i < std::min(n, b + group_size); ++i) s += L.p[static_cast<size_t>(gr.order[i])];
    gr.mass.push_back(s);
  }
  gr.begin.push_back(n);
  return gr;
}

Plan finish_heuristic(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts, Plan plan,
                      const char* status, double seconds) {
  finish_plan(m, dev, opts, plan);
  plan.status = status;
  plan.gap = -1;
  plan.solve_seconds = seconds;
  validate_plan(m, opts, plan, dev.vram_budget);
  return plan;
}

std::vector<int32_t> neurons_of_groups(const NeuronGroups& groups, const std::vector<char>& chosen) {
  std::vector<int32_t> ids;
  for (size_t g = 0; g < groups.size(); ++g)
    if (chosen[g])
      for (int64_t i = groups.begin[g]; i < groups.begin[g + 1]; ++i) ids.push_back(groups.order[i]);
  std::sort(ids.begin(), ids.end());
  return ids;
}

double neuron_seconds_saved(const PlanModel& m, const DeviceDesc& dev, const PlanLayer& L, double mass, int64_t count) {
  return mass * (neuron_bytes(m, L, true) / dev.cpu_bandwidth - neuron_bytes(m, L, false) / dev.gpu_bandwidth) +
         static_cast<double>(count) * neuron_fixed_bytes(m, L) * (1.0 / dev.cpu_bandwidth - 1.0 / dev.gpu_bandwidth);
}

double attn_seconds_saved(const DeviceDesc& dev, const PlanLayer& L) {
  return attn_read_bytes(L) * (1.0 / dev.cpu_bandwidth - 1.0 / dev.gpu_bandwidth);
}

double output_seconds_saved(const PlanModel& m, const DeviceDesc& dev) {
  return static_cast<double>(m.output_bytes) * (1.0 / dev.cpu_bandwidth - 1.0 / dev.gpu_bandwidth) - dev.sync_seconds -
         static_cast<double>(m.n_embd + m.n_vocab) * sizeof(float) / dev.pcie_bandwidth;
}

double layer_fixed_seconds(const PlanModel& m, const DeviceDesc& dev, const PlanLayer& L) {
  return sync_seconds(m, dev) - static_cast<double>(L.predictor_bytes) * (1.0 / dev.cpu_bandwidth - 1.0 / dev.gpu_bandwidth);
}

// ---- validation ---------------------------------------------------------------------------

void validate(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts) {
  EMBER_CHECK(!m.layers.empty(), "plan: the model has no layers");
  EMBER_CHECK(m.n_embd > 0 && m.n_ff > 0 && m.n_head > 0 && m.q_dim > 0 && m.kv_dim > 0 && m.n_ctx > 0,
              "plan: model shape must be positive (n_embd {}, n_ff {}, n_head {}, q_dim {}, kv_dim {}, n_ctx {})",
              m.n_embd, m.n_ff, m.n_head, m.q_dim, m.kv_dim, m.n_ctx);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const PlanLayer& L = m.layers[l];
    EMBER_CHECK(static_cast<int64_t>(L.p.size()) == m.n_ff, "plan: layer {} has {} firing probabilities, expected n_ff = {}",
                l, L.p.size(), m.n_ff);
    EMBER_CHECK(L.up_row > 0 && L.down_row > 0 && L.cpu_down_row > 0, "plan: layer {} has a zero neuron row size",
                l);  // gate: 0 without one
    for (size_t j = 0; j < L.p.size(); ++j)
      EMBER_CHECK(std::isfinite(L.p[j]) && L.p[j] >= 0.0f && L.p[j] <= 1.0f,
                  "plan: layer {} neuron {} has firing probability {} (must be in [0, 1]); is the profile corrupt?", l,
                  j, L.p[j]);
  }
  for (double v : {dev.gpu_bandwidth, dev.cpu_bandwidth, dev.pcie_bandwidth})
    EMBER_CHECK(std::isfinite(v) && v > 0, "plan: device bandwidths must be positive, got {}", v);
  EMBER_CHECK(std::isfinite(dev.sync_seconds) && dev.sync_seconds >= 0, "plan: sync time must be >= 0, got {}",
              dev.sync_seconds);
  EMBER_CHECK(opts.group_size >= 1 && opts.group_size <= (int64_t{1} << 20), "plan: group size must be in [1, 2^20], got {}",
              opts.group_size);
  EMBER_CHECK(opts.min_gpu_neurons >= 0, "plan: minimum GPU neurons must be >= 0, got {}", opts.min_gpu_neurons);
  EMBER_CHECK(opts.max_batch >= 1 && opts.max_batch <= 4096, "plan: GPU batch must be in [1, 4096], got {}",
              opts.max_batch);
  EMBER_CHECK(std::isfinite(opts.time_limit) && opts.time_limit > 0, "plan: solver time limit must be > 0 s, got {}",
              opts.time_limit);
  EMBER_CHECK(opts.gap_tolerance >= 0 && opts.gap_tolerance < 1, "plan: gap tolerance must be in [0, 1), got {}",
              opts.gap_tolerance);
}

void validate_plan(const PlanModel& m, const PlanOptions& opts, const Plan& plan, uint64_t budget) {
  EMBER_CHECK(plan.layers.size() == m.layers.size(), "plan has {} layers but the model has {}; was it made for another model?",
              plan.layers.size(), m.layers.size());
  const int64_t min_n = std::min(opts.min_gpu_neurons, m.n_ff);
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    const auto& ids = plan.layers[l].gpu_neurons;
    for (size_t i = 0; i < ids.size(); ++i) {
      EMBER_CHECK(ids[i] >= 0 && ids[i] < m.n_ff, "plan: layer {} names neuron {} (n_ff is {})", l, ids[i], m.n_ff);
      EMBER_CHECK(i == 0 || ids[i] > ids[i - 1], "plan: layer {} neuron ids are not sorted and unique (at {})", l, i);
    }
    EMBER_CHECK(opts.attention || !plan.layers[l].attn_gpu,
                "plan: layer {} puts attention on a device that runs no attention blocks", l);
    if (plan.layer_uses_gpu(l))
      EMBER_CHECK(static_cast<int64_t>(ids.size()) >= min_n,
                  "plan: layer {} uses the GPU with {} neurons, fewer than the minimum {}", l, ids.size(), min_n);
  }
  EMBER_CHECK(!plan.output_gpu || opts.attention, "plan: the output head on a device that holds no hidden state "
              "(no attention blocks)");
  EMBER_CHECK(!plan.output_gpu || m.output_weights_bytes > 0, "plan: the output head on the device, but this model's "
              "head cannot go there");
  const uint64_t b = gpu_bytes(m, opts, plan);
  EMBER_CHECK(b <= budget, "plan needs {} bytes of GPU memory, more than the budget of {} bytes", b, budget);
}

Plan make_plan(PlanMethod method, const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts) {
  switch (method) {
    case PlanMethod::ilp: return plan_ilp(m, dev, opts);
    case PlanMethod::greedy: return plan_greedy(m, dev, opts);
    case PlanMethod::layer_split: return plan_layer_split(m, dev, opts);
  }
  fail("unknown placement method");
}

// ---- inputs -------------------------------------------------------------------------------

std::vector<std::vector<float>> read_profile_probabilities(const std::string& path, int64_t n_layer, int64_t n_ff) {
  gguf::Reader r(path);
  EMBER_CHECK(r.opt_string("general.architecture").value_or("") == "ember-profile",
              "{} is not an activation profile (general.architecture is not 'ember-profile'); make one with "
              "`ember profile`",
              path);
  const int64_t nl = r.get_int("ember.profile.n_layer"), nf = r.get_int("ember.profile.n_ff");
  const int64_t nt = r.get_int("ember.profile.n_tokens");
  EMBER_CHECK(nl == n_layer && nf == n_ff, "profile {} is for {} layers x {} neurons, the model has {} x {}", path, nl,
              nf, n_layer, n_ff);
  EMBER_CHECK(nt > 0, "profile {} counts no tokens", path);
  std::vector<std::vector<float>> p(static_cast<size_t>(n_layer));
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string name = fmt::format("blk.{}.ffn_act_count", l);
    TensorView v = r.view(name);
    EMBER_CHECK(v.data && v.type == DType::F32 && v.ne[0] == n_ff && v.rows() == 1,
                "profile {}: tensor {} is missing or not F32 [{}]", path, name, n_ff);
    const float* c = reinterpret_cast<const float*>(v.data);
    auto& out = p[static_cast<size_t>(l)];
    out.resize(static_cast<size_t>(n_ff));
    for (int64_t j = 0; j < n_ff; ++j) {
      EMBER_CHECK(std::isfinite(c[j]) && c[j] >= 0 && c[j] <= static_cast<double>(nt),
                  "profile {}: {}[{}] = {} is not a count in [0, n_tokens = {}]", path, name, j, c[j], nt);
      out[static_cast<size_t>(j)] = static_cast<float>(c[j] / static_cast<double>(nt));
    }
  }
  return p;
}

std::vector<std::vector<float>> synth_profile_probabilities(const Model& model) {
  const gguf::Reader& r = *model.file;
  auto sp = r.opt_float("ember.synth.sparsity");
  if (!sp || *sp <= 0) return {};
  SynthOptions o;
  o.n_ff = model.hp.n_ff;
  o.act = FfnActivation::relu;  // synth writes a profile for ReLU models only
  o.sparsity = static_cast<float>(*sp);
  o.zipf = static_cast<float>(r.opt_float("ember.synth.zipf").value_or(1.1));
  o.seed = static_cast<uint64_t>(r.opt_int("ember.synth.seed").value_or(1));
  std::vector<std::vector<float>> p;
  for (int64_t l = 0; l < model.hp.n_layer; ++l) p.push_back(synth_firing_probabilities(o, l));
  return p;
}

std::vector<std::vector<float>> plan_probabilities(const Model& model, const std::string& profile_path,
                                                   std::string* source) {
  const int64_t nl = model.hp.n_layer, nf = model.hp.n_ff;
  std::string src = profile_path;
  std::vector<std::vector<float>> p;
  if (!profile_path.empty()) {
    p = read_profile_probabilities(profile_path, nl, nf);
  } else if (p = synth_profile_probabilities(model); !p.empty()) {
    src = "synth profile";
  } else {
    std::filesystem::path beside(model.file->path());
    beside.replace_extension(".profile.gguf");
    EMBER_CHECK(std::filesystem::exists(beside),
                "placement needs an activation profile of {}: pass --profile FILE, or make {} with `ember profile`",
                model.file->path(), beside.string());
    src = beside.string();
    p = read_profile_probabilities(src, nl, nf);
  }
  if (source) *source = src;
  return p;
}

namespace {

uint64_t padded(const TensorView& v) { return v.data ? gpu_pad(v.nbytes) : 0; }

// PlanLayer::cpu_down_row: the CPU's down bytes per firing neuron with the whole layer there (in
// bytes of the row-wise kernels' time: the cost model reads them at the CPU's bandwidth).
uint64_t cpu_down_row_bytes(const FfnWeights& w, int64_t n_embd, cpu::NeuronMajorType choice, const std::vector<float>& p) {
  std::vector<int32_t> all(p.size());
  std::iota(all.begin(), all.end(), 0);
  const DType t = hybrid_cpu_down_type(w, n_embd, choice, p, all);
  const double mass = std::accumulate(p.begin(), p.end(), 0.0);
  if (!cpu::is_nm4(t) || mass <= 0) return cpu::neuron_major_row_bytes(t, n_embd);
  return static_cast<uint64_t>(std::llround(neuron_major_expected_cost(t, n_embd, p, all) / mass));
}

PlanModel base_shape(const std::string& name, int64_t n_embd, int64_t n_ff, int64_t n_head, int64_t q_dim,
                     int64_t kv_dim, int64_t n_ctx, const std::vector<std::vector<float>>& p, size_t n_layer,
                     DType kv_type) {
  EMBER_CHECK(p.size() == n_layer, "plan: {} layers of firing probabilities for a model of {} layers", p.size(),
              n_layer);
  PlanModel m;
  m.name = name;
  m.n_embd = n_embd, m.n_ff = n_ff, m.n_head = n_head, m.q_dim = q_dim, m.kv_dim = kv_dim, m.n_ctx = n_ctx;
  m.layers.resize(n_layer);
  for (size_t l = 0; l < n_layer; ++l) {
    m.layers[l].p = p[l];
    m.layers[l].kv_bytes = KvCache::bytes_for(1, n_ctx, kv_dim, kv_type);  // what the cache allocates
  }
  return m;
}

}  // namespace

double neuron_major_expected_bytes(DType t, int64_t n_embd, const std::vector<float>& p,
                                   const std::vector<int32_t>& ids) {
  const bool nm4 = cpu::is_nm4(t);
  const double row = nm4 ? static_cast<double>(n_embd) / 2 : static_cast<double>(row_bytes(t, n_embd));
  const double table = nm4 ? static_cast<double>(cpu::nm4_table_bytes(t, cpu::kNm4Block, n_embd)) : 0.0;
  double bytes = 0, silent = 1;  // silent: the chance that no neuron of the current block fires
  int64_t block = -1;
  for (int32_t j : ids) {  // ascending
    const double pj = p[static_cast<size_t>(j)];
    bytes += pj * row;
    if (j / cpu::kNm4Block != block) bytes += (1 - silent) * table, silent = 1, block = j / cpu::kNm4Block;
    silent *= 1 - pj;
  }
  return bytes + (1 - silent) * table;
}

double neuron_major_expected_cost(DType t, int64_t n_embd, const std::vector<float>& p,
                                  const std::vector<int32_t>& ids) {
  return neuron_major_expected_bytes(t, n_embd, p, ids) / (cpu::is_nm4(t) ? kNm4AxpyRate : 1.0);
}

DType hybrid_cpu_down_type(const FfnWeights& w, int64_t n_embd, cpu::NeuronMajorType choice,
                           const std::vector<float>& p, const std::vector<int32_t>& ids) {
  if (w.down_t.data) return w.down_t.type;
  const DType shared = cpu::neuron_major_dtype(w.down.type, choice, n_embd, /*shared_scales=*/true);
  const DType rows = cpu::neuron_major_dtype(w.down.type, choice, n_embd);
  if (shared == rows) return rows;
  return neuron_major_expected_cost(shared, n_embd, p, ids) <= neuron_major_expected_cost(rows, n_embd, p, ids)
             ? shared
             : rows;
}

DType hybrid_device_down_type(const FfnWeights& w, int64_t n_embd) {
  if (w.down_t.data) return w.down_t.type;
  return cpu::neuron_major_dtype(w.down.type, cpu::NeuronMajorType::exact, n_embd);
}

PlanModel plan_model_from(const Model& model, const std::vector<std::vector<float>>& p, int64_t n_ctx, DType kv_type,
                          bool predictors, cpu::NeuronMajorType cpu_down, int64_t n_seq) {
  const std::string moe = model_moe_refusal(model, "the placement planner");
  EMBER_CHECK(moe.empty(), "{}", moe);
  const Hparams& hp = model.hp;
  EMBER_CHECK(n_ctx >= 1, "plan: context size must be positive, got {}", n_ctx);
  n_ctx = std::min(n_ctx, hp.n_ctx_train);
  PlanModel m = base_shape(std::filesystem::path(model.file->path()).filename().string(), hp.n_embd, hp.n_ff, hp.n_head,
                           hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, n_ctx, p, model.layers.size(), kv_type);
  m.output_bytes = model.output.nbytes;
  m.n_vocab = hp.n_vocab;
  m.output_weights_bytes = padded(model.output_norm) + padded(model.output_norm_b) + padded(model.output);
  EMBER_CHECK(!predictors || has_predictors(model), "plan: placement with predictors, but {} has none for some layer",
              model.file->path());
  m.predicted = predictors;
  set_plan_sequences(m, n_seq);
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerWeights& W = model.layers[l];
    PlanLayer& L = m.layers[l];
    // The tensors a device holding the layer's hidden state holds (LayerWeights' own list).
    L.attn_bytes = 0;
    for (const TensorView* t : W.attention_tensors()) L.attn_bytes += padded(*t);
    for (const TensorView* t : W.ffn_block_tensors()) L.attn_bytes += padded(*t);
    if (predictors) {
      L.predictor_bytes = padded(W.ffn.fc1) + padded(W.ffn.fc2);
      m.predictor_rank = std::max(m.predictor_rank, W.ffn.fc1.rows());
    }
    L.gate_row = W.ffn.gated() ? row_bytes(W.ffn.gate.type, hp.n_embd) : 0;  // OPT has no gate
    L.up_row = row_bytes(W.ffn.up.type, hp.n_embd);
    L.bias_row = W.ffn.up_b.valid() ? sizeof(float) : 0;
    L.down_row = row_bytes(hybrid_device_down_type(W.ffn, hp.n_embd), hp.n_embd);
    L.cpu_down_row = cpu_down_row_bytes(W.ffn, hp.n_embd, cpu_down, L.p);
  }
  return m;
}

void set_plan_sequences(PlanModel& m, int64_t n_seq) {
  EMBER_CHECK(n_seq >= 1 && n_seq <= 256, "plan: {} sequences (1 to 256)", n_seq);
  for (PlanLayer& L : m.layers) L.kv_bytes = L.kv_bytes / static_cast<uint64_t>(m.n_seq) * static_cast<uint64_t>(n_seq);
  m.n_seq = n_seq;
}

PlanModel plan_model_from_shapes(const std::string& name, int64_t n_embd, int64_t n_ff, int64_t n_layer,
                                 int64_t n_head, int64_t n_head_kv, int64_t n_vocab, DType type, int64_t n_ctx,
                                 const std::vector<std::vector<float>>& p, DType kv_type) {
  EMBER_CHECK(n_embd > 0 && n_ff > 0 && n_layer > 0 && n_head > 0 && n_head_kv > 0 && n_embd % n_head == 0,
              "plan: bad shape (n_embd {}, n_ff {}, n_layer {}, n_head {}, n_head_kv {})", n_embd, n_ff, n_layer, n_head,
              n_head_kv);
  const int64_t head_dim = n_embd / n_head;
  PlanModel m = base_shape(name, n_embd, n_ff, n_head, n_embd, n_head_kv * head_dim, n_ctx, p,
                           static_cast<size_t>(n_layer), kv_type);
  auto mat = [&](int64_t cols, int64_t rows) { return gpu_pad(row_bytes(type, cols) * static_cast<uint64_t>(rows)); };
  const uint64_t norm = gpu_pad(static_cast<uint64_t>(n_embd) * sizeof(float));  // attention's and the FFN's
  m.output_bytes = row_bytes(type, n_embd) * static_cast<uint64_t>(n_vocab);
  m.n_vocab = n_vocab;
  m.output_weights_bytes = norm + gpu_pad(m.output_bytes);
  for (auto& L : m.layers) {
    L.attn_bytes = 2 * norm + mat(n_embd, n_embd) + 2 * mat(n_embd, n_head_kv * head_dim) + mat(n_embd, n_embd);
    L.gate_row = L.up_row = row_bytes(type, n_embd);
    FfnWeights w;  // what a file of these shapes holds: down input-major, no down_t
    w.down.type = type;
    L.down_row = row_bytes(hybrid_device_down_type(w, n_embd), n_embd);
    L.cpu_down_row = cpu_down_row_bytes(w, n_embd, cpu::NeuronMajorType::exact, L.p);
  }
  return m;
}

uint64_t parse_byte_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string num = s.substr(0, i), unit = s.substr(i);
  double v = 0;
  try {
    size_t used = 0;
    v = num.empty() ? -1 : std::stod(num, &used);
    if (used != num.size()) v = -1;
  } catch (const std::exception&) {
    v = -1;
  }
  double mult = -1;
  static const std::pair<const char*, double> units[] = {
      {"", 1}, {"B", 1}, {"K", 1024.0}, {"KiB", 1024.0}, {"KB", 1e3}, {"M", 1048576.0}, {"MiB", 1048576.0},
      {"MB", 1e6}, {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9}, {"T", 1099511627776.0},
      {"TiB", 1099511627776.0}, {"TB", 1e12}};
  for (const auto& [u, f] : units)
    if (unit == u) mult = f;
  EMBER_CHECK(v >= 0 && mult > 0 && v * mult < 1.8e19,
              "cannot read '{}' as a size: use a number with an optional unit B, K/KiB, M/MiB, G/GiB, T/TiB (1024-based) or "
              "KB, MB, GB, TB (1000-based), e.g. 4GiB",
              s);
  return static_cast<uint64_t>(std::llround(v * mult));
}

// ---- plan files ---------------------------------------------------------------------------

void write_plan(const Plan& plan, const PlanModel& m, const PlanOptions& opts, const std::string& path) {
  using gguf::Value;
  gguf::Writer w;
  w.set("general.architecture", Value::str("ember-plan"));
  w.set("ember.plan.model", Value::str(m.name));
  w.set("ember.plan.key", Value::str(plan.key));
  w.set("ember.plan.method", Value::str(plan_method_name(plan.method)));
  w.set("ember.plan.status", Value::str(plan.status));
  w.set("ember.plan.gap", Value::f64(plan.gap));
  w.set("ember.plan.solve_seconds", Value::f64(plan.solve_seconds));
  w.set("ember.plan.objective", Value::f64(plan.objective));
  w.set("ember.plan.seconds_per_token", Value::f64(plan.seconds_per_token));
  w.set("ember.plan.vram_budget", Value::u64(plan.vram_budget));
  w.set("ember.plan.gpu_bytes", Value::u64(plan.gpu_bytes));
  w.set("ember.plan.n_layer", Value::u64(plan.layers.size()));
  w.set("ember.plan.n_ff", Value::u64(static_cast<uint64_t>(m.n_ff)));
  w.set("ember.plan.n_ctx", Value::u64(static_cast<uint64_t>(m.n_ctx)));
  w.set("ember.plan.n_seq", Value::u64(static_cast<uint64_t>(m.n_seq)));
  w.set("ember.plan.group_size", Value::u64(static_cast<uint64_t>(opts.group_size)));
  w.set("ember.plan.min_gpu_neurons", Value::u64(static_cast<uint64_t>(opts.min_gpu_neurons)));
  w.set("ember.plan.max_batch", Value::u64(static_cast<uint64_t>(opts.max_batch)));
  w.set("ember.plan.predicted", Value::u64(m.predicted ? 1 : 0));
  w.set("ember.plan.output_gpu", Value::u64(plan.output_gpu ? 1 : 0));
  std::vector<int32_t> attn, counts;
  std::vector<Value> layer_bytes;
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    const auto& P = plan.layers[l];
    attn.push_back(P.attn_gpu ? 1 : 0);
    layer_bytes.push_back(
        Value::u64(gpu_layer_bytes(m.layers[l], P.attn_gpu, static_cast<int64_t>(P.gpu_neurons.size()))));
    counts.push_back(static_cast<int32_t>(P.gpu_neurons.size()));
    if (P.gpu_neurons.empty()) continue;  // GGUF has no empty tensors: no tensor means no neurons
    std::vector<uint8_t> data(P.gpu_neurons.size() * sizeof(int32_t));
    std::memcpy(data.data(), P.gpu_neurons.data(), data.size());
    w.add_tensor(fmt::format("blk.{}.gpu_neurons", l), DType::I32, {static_cast<int64_t>(P.gpu_neurons.size())},
                 std::move(data));
  }
  w.set("ember.plan.gpu_neuron_counts", Value::ints(counts));
  w.set("ember.plan.attn_gpu", Value::ints(attn));
  w.set("ember.plan.layer_gpu_bytes", Value::array(gguf::ValueType::U64, std::move(layer_bytes)));
  w.write(path);
}

Plan read_plan(const std::string& path, const PlanModel& m, PlanOptions* opts_out) {
  gguf::Reader r(path);
  EMBER_CHECK(r.opt_string("general.architecture").value_or("") == "ember-plan",
              "{} is not a plan file (general.architecture is not 'ember-plan'); make one with `ember plan`", path);
  Plan plan;
  plan.method = parse_plan_method(r.get_string("ember.plan.method"));
  plan.key = r.opt_string("ember.plan.key").value_or("");
  plan.status = r.opt_string("ember.plan.status").value_or("");
  plan.gap = r.opt_float("ember.plan.gap").value_or(0);
  plan.solve_seconds = r.opt_float("ember.plan.solve_seconds").value_or(0);
  plan.vram_budget = static_cast<uint64_t>(r.get_int("ember.plan.vram_budget"));
  const int64_t nl = r.get_int("ember.plan.n_layer"), nf = r.get_int("ember.plan.n_ff");
  EMBER_CHECK(nl == static_cast<int64_t>(m.layers.size()) && nf == m.n_ff,
              "plan {} is for {} layers x {} neurons, the model has {} x {}; make a plan for this model", path, nl, nf,
              m.layers.size(), m.n_ff);
  const int64_t n_ctx = r.get_int("ember.plan.n_ctx");
  EMBER_CHECK(n_ctx == m.n_ctx, "plan {} was made for a context of {} tokens, the session uses {}; make a plan with -c {}",
              path, n_ctx, m.n_ctx, m.n_ctx);
  const int64_t n_seq = r.opt_int("ember.plan.n_seq").value_or(1);
  EMBER_CHECK(n_seq == m.n_seq, "plan {} was made for {} sequence(s) at once, the session runs {} (their KV caches are "
              "on the device); make a plan with --parallel {}", path, n_seq, m.n_seq, m.n_seq);
  const bool predicted = r.opt_int("ember.plan.predicted").value_or(0) != 0;
  EMBER_CHECK(predicted == m.predicted, "plan {} was made for an executor {} predictors, this session runs {} them; make "
              "a plan for this session (its memory and costs differ)", path, predicted ? "with" : "without",
              m.predicted ? "with" : "without");
  PlanOptions opts;
  opts.group_size = r.get_int("ember.plan.group_size");
  opts.min_gpu_neurons = r.get_int("ember.plan.min_gpu_neurons");
  opts.max_batch = r.get_int("ember.plan.max_batch");
  EMBER_CHECK(opts.group_size >= 1 && opts.min_gpu_neurons >= 0 && opts.max_batch >= 1 && opts.max_batch <= 4096,
              "plan {}: bad options (group size {}, min neurons {}, batch {})", path, opts.group_size,
              opts.min_gpu_neurons, opts.max_batch);
  const auto attn = r.get_int_array("ember.plan.attn_gpu");
  const auto counts = r.get_int_array("ember.plan.gpu_neuron_counts");
  EMBER_CHECK(static_cast<int64_t>(attn.size()) == nl && static_cast<int64_t>(counts.size()) == nl,
              "plan {}: ember.plan.attn_gpu / gpu_neuron_counts have {} / {} entries, expected {}", path, attn.size(),
              counts.size(), nl);
  plan.layers.resize(static_cast<size_t>(nl));
  plan.output_gpu = r.opt_int("ember.plan.output_gpu").value_or(0) != 0;
  for (int64_t l = 0; l < nl; ++l) {
    const std::string name = fmt::format("blk.{}.gpu_neurons", l);
    const gguf::TensorInfo* t = r.find_tensor(name);
    const int64_t count = counts[static_cast<size_t>(l)];
    auto& P = plan.layers[static_cast<size_t>(l)];
    P.attn_gpu = attn[static_cast<size_t>(l)] != 0;
    if (count == 0) {
      EMBER_CHECK(!t, "plan {}: layer {} has a neuron list but a count of 0", path, l);
      continue;
    }
    EMBER_CHECK(count > 0 && count <= m.n_ff, "plan {}: layer {} has {} GPU neurons (n_ff is {})", path, l, count, m.n_ff);
    EMBER_CHECK(t && t->type == DType::I32 && t->n_dims == 1 && t->ne[0] == count,
                "plan {}: tensor {} is missing or not a list of {} I32 neuron ids", path, name, count);
    P.gpu_neurons.resize(static_cast<size_t>(count));
    std::memcpy(P.gpu_neurons.data(), r.view(*t).data, P.gpu_neurons.size() * sizeof(int32_t));
  }
  validate_plan(m, opts, plan, plan.vram_budget);
  plan.gpu_bytes = gpu_bytes(m, opts, plan);
  const uint64_t stored = static_cast<uint64_t>(r.get_int("ember.plan.gpu_bytes"));
  EMBER_CHECK(stored == plan.gpu_bytes,
              "plan {} says it needs {} bytes of GPU memory, but this model's weights give {}; it was made for other "
              "weights: make a new plan",
              path, stored, plan.gpu_bytes);
  plan.objective = r.opt_float("ember.plan.objective").value_or(0);
  plan.seconds_per_token = r.opt_float("ember.plan.seconds_per_token").value_or(0);
  if (opts_out) *opts_out = opts;
  return plan;
}

}  // namespace ember
