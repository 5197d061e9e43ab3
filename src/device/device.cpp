#include "device/device.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/huge_pages.hpp"
#include "model/blocks.hpp"
#include "model/ffn.hpp"
#include "model/moe.hpp"
#include "ops/cpu/activation.hpp"
#include "ops/cpu/matmul.hpp"
#include "sparse/predictor.hpp"

namespace ember {

// ---- capabilities -----------------------------------------------------------------------------

namespace {
// Whether a device reads matrices of type t given the types it lists (empty: every type), and
// those types, for messages.
bool types_read(const std::vector<DType>& types, DType t) {
  return types.empty() || std::find(types.begin(), types.end(), t) != types.end();
}
std::string types_named(const std::vector<DType>& types) {
  std::string known;
  for (DType k : types) known += (known.empty() ? "" : ", ") + std::string(dtype_name(k));
  return known;
}
bool caps_read(const DeviceCaps& caps, DType t) { return types_read(caps.weight_types, t); }
std::string caps_types(const DeviceCaps& caps) { return types_named(caps.weight_types); }
const std::vector<DType>& down_types(const DeviceCaps& caps) {
  return caps.down_row_types.empty() ? caps.weight_types : caps.down_row_types;
}
}  // namespace

std::string device_refusal(const DeviceCaps& caps, const Model& model, const Plan& plan) {
  if (plan.layers.size() != model.layers.size())
    return fmt::format("the plan has {} layers, the model {}", plan.layers.size(), model.layers.size());
  auto known_types = [&] { return caps_types(caps); };
  auto reads = [&](DType t) { return caps_read(caps, t); };
  if (plan.output_gpu)
    if (std::string why = output_refusal(caps, model); !why.empty()) return why;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (plan.layers[l].attn_gpu)
      if (std::string why = attention_refusal(caps, model, l); !why.empty()) return why;
    if (!plan.layers[l].gpu_experts.empty())
      if (std::string why = experts_refusal(caps, model, l); !why.empty()) return why;
    if (plan.layers[l].gpu_neurons.empty()) continue;
    const FfnWeights& w = model.layers[l].ffn;
    if (std::find(caps.gatings.begin(), caps.gatings.end(), w.gating) == caps.gatings.end())
      return fmt::format("layer {} has a {} FFN, which the {} device does not run", l, ffn_gating_name(w.gating),
                         caps.name);
    if (w.up_b.valid() && !caps.up_bias)
      return fmt::format("layer {}'s FFN has an up bias, which the {} device does not run", l, caps.name);
    for (const TensorView* t : {&w.gate, &w.up})
      if (t->valid() && !reads(t->type))
        return fmt::format("layer {} has {} FFN rows; the {} device reads {}", l, dtype_name(t->type), caps.name,
                           known_types());
    const DType down = hybrid_device_down_type(w, model.hp.n_embd);
    if (!types_read(down_types(caps), down))
      return fmt::format("layer {}'s neuron-major down rows are {}; the {} device reads {}", l, dtype_name(down),
                         caps.name, types_named(down_types(caps)));
  }
  return {};
}

std::string attention_refusal(const DeviceCaps& caps, const Model& model, size_t l) {
  if (!caps.attention)
    return fmt::format("the plan puts layer {}'s attention on the {} device, which runs FFN shares only; plan "
                       "without attention on the GPU", l, caps.name);
  if (model.hp.parallel_residual && !caps.parallel_residual)
    return fmt::format("layer {}'s attention feeds a parallel residual ({}), which the {} device's attention "
                       "blocks do not run; plan without attention on the GPU", l, model.hp.arch, caps.name);
  if (caps.max_head_dim > 0 && model.hp.head_dim > caps.max_head_dim)
    return fmt::format("layer {}'s attention heads have {} values; the {} device's hold at most {}", l,
                       model.hp.head_dim, caps.name, caps.max_head_dim);
  const LayerWeights& F = model.file_layer(l);
  for (const TensorView* t : {&F.wq, &F.wk, &F.wv, &F.wo})
    if (!caps_read(caps, t->type))
      return fmt::format("layer {}'s attention matrix {} is {}; the {} device reads {}", l, t->name,
                         dtype_name(t->type), caps.name, caps_types(caps));
  return {};
}

std::string output_refusal(const DeviceCaps& caps, const Model& model) {
  if (!caps.attention)
    return fmt::format("the plan puts the output head on the {} device, which holds no hidden state; plan without "
                       "it", caps.name);
  const TensorView& w = model.output_in_file();
  if (!caps_read(caps, w.type))
    return fmt::format("the output matrix {} is {}; the {} device reads {}", w.name, dtype_name(w.type), caps.name,
                       caps_types(caps));
  return {};
}

std::string experts_refusal(const DeviceCaps& caps, const Model& model, size_t l) {
  const MoeWeights& moe = model.layers[l].moe;
  if (!moe.valid()) return fmt::format("the plan puts experts in layer {}, which has none", l);
  if (!caps.experts)
    return fmt::format("the plan puts experts of layer {} on the {} device, which runs no experts; plan without them "
                       "(their layers' attention may still go there)", l, caps.name);
  if (std::string why = moe_split_refusal(moe); !why.empty()) return fmt::format("layer {}: {}", l, why);
  // Every expert has the first one's gating and types (moe_split_refusal). A device holds them
  // as the file lays them out (Model::file_layer; the CPU's may be repacked), so those types count.
  const FfnWeights& e = model.file_layer(l).moe.experts.front();
  if (std::find(caps.gatings.begin(), caps.gatings.end(), e.gating) == caps.gatings.end())
    return fmt::format("layer {}'s experts are {} FFNs, which the {} device does not run", l, ffn_gating_name(e.gating),
                       caps.name);
  for (const TensorView* t : {&e.gate, &e.up, &e.down})
    if (!caps_read(caps, t->type))
      return fmt::format("layer {}'s experts have {} matrices; the {} device reads {}", l, dtype_name(t->type), caps.name,
                         caps_types(caps));
  return {};
}

void Device::experts_begin(int64_t layer, const float* x, int64_t n, const int32_t* ids) {
  (void)x, (void)n, (void)ids;
  fail("device {} runs no experts (layer {}'s were given to it)", name(), layer);
}

const float* Device::experts_end() { fail("device {} runs no experts", name()); }

// ---- memory -------------------------------------------------------------------------------------

uint64_t device_free_margin(const DeviceMemory& mem) { return std::min<uint64_t>(uint64_t{256} << 20, mem.free / 16); }

uint64_t device_plan_budget(const DeviceMemory& mem, uint64_t requested, const std::string& device) {
  const uint64_t margin = device_free_margin(mem);
  const uint64_t usable = mem.free > margin ? mem.free - margin : 0;
  auto mib = [](uint64_t b) { return static_cast<double>(b) / 1048576.0; };
  if (requested == 0) {
    const uint64_t step = uint64_t{16} << 20;
    const uint64_t b = usable >= step ? usable / step * step : usable;
    EMBER_CHECK(b > 0, "--vram-budget auto: the {} device has {:.1f} MiB free of {:.1f} MiB, nothing to plan with",
                device, mib(mem.free), mib(mem.total));
    return b;
  }
  EMBER_CHECK(requested > mem.reserve, "--vram-budget {:.1f} MiB: the {} device's runtime takes about {:.0f} MiB of it "
              "by itself (its context); give more, or auto", mib(requested), device, mib(mem.reserve));
  const uint64_t b = requested - mem.reserve;
  EMBER_CHECK(b <= usable, "--vram-budget {:.1f} MiB: the {} device has {:.1f} MiB free of {:.1f} MiB (its context "
              "already counted), so at most {:.1f} MiB fits with {:.0f} MiB to spare; give at most that plus the "
              "context's {:.0f} MiB, or --vram-budget auto", mib(requested), device, mib(mem.free), mib(mem.total),
              mib(usable), mib(margin), mib(mem.reserve));
  return b;
}

// ---- the arena ----------------------------------------------------------------------------------

DeviceArenaLayout load_layout(const DeviceCaps& caps, const Model& model, const DeviceLoad& d) {
  EMBER_CHECK(d.pm && d.opts && d.plan, "device {}: load needs the plan, its model and options", caps.name);
  const std::string why = device_refusal(caps, model, *d.plan);
  EMBER_CHECK(why.empty(), "device {}: {}", caps.name, why);
  check_down_rows(model, d);
  const char* keeps = caps.scratch ? caps.scratch->name() : "cpu";
  EMBER_CHECK(d.opts->scratch == caps.scratch, "device {}: the plan's options count the scratch of the {} device, it "
              "keeps the {} device's; plan with its caps (PlanOptions::scratch = DeviceCaps::scratch)", caps.name,
              d.opts->scratch_name(), keeps);
  return device_arena_layout(model, *d.pm, *d.opts, *d.plan, d.kv_type);
}

DeviceArenaLayout device_arena_layout(const Model& model, const PlanModel& m, const PlanOptions& opts,
                                      const Plan& plan, DType kv_type) {
  EMBER_CHECK(plan.layers.size() == m.layers.size() && m.layers.size() == model.layers.size(),
              "device: plan has {} layers, the model {}", plan.layers.size(), model.layers.size());
  DeviceArenaLayout a;
  uint64_t off = 0;
  const ArenaTake take = arena_cursor(off);
  a.layers.resize(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const auto n = static_cast<int64_t>(plan.layers[l].gpu_neurons.size());
    if (n > 0) a.layers[l] = lay_out_ffn_share(m.layers[l], n, take);
  }
  if (gpu_needs_ffn_scratch(m, plan)) static_cast<FfnScratch&>(a) = lay_out_ffn_scratch(m, opts, take);
  a.ffn_total = off;
  // Laid out by the functions the solvers sum (sparse/placement.hpp): a plan made for other
  // options or another model disagrees.
  EMBER_CHECK(a.ffn_total == gpu_ffn_bytes(m, opts, plan), "device: FFN arena layout ({} bytes) disagrees with the "
              "plan's accounting ({} bytes)", a.ffn_total, gpu_ffn_bytes(m, opts, plan));
  a.attn.resize(m.layers.size());
  uint64_t planned = 0;
  int64_t n_attn = 0;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    if (!plan.layers[l].attn_gpu) continue;
    auto& at = a.attn[l];
    at.on = true;
    ++n_attn;
    planned += m.layers[l].attn_bytes;
    const uint64_t start = off;
    const LayerWeights& W = model.layers[l];
    // The file's layout and a repacked one take the same bytes (repacking reorders rows in groups).
    const LayerWeights& F = model.file_layer(l);
    const auto wl = W.attention_tensors(), fl = F.attention_tensors();
    for (size_t i = 0; i < wl.size(); ++i)
      EMBER_CHECK(wl[i]->nbytes == fl[i]->nbytes, "device: layer {}'s attention tensor {} takes {} bytes repacked, {} "
                  "in the file's layout", l, wl[i]->name, wl[i]->nbytes, fl[i]->nbytes);
    for (const TensorView* t : W.attention_tensors()) at.tensors.push_back(t->valid() ? take(t->nbytes) : 0);
    for (const TensorView* t : W.ffn_block_tensors()) at.tensors.push_back(t->valid() ? take(t->nbytes) : 0);
    a.attn_weights += off - start;
  }
  EMBER_CHECK(a.attn_weights == planned, "device: attention arena layout ({} bytes) disagrees with the plan's "
              "accounting ({} bytes)", a.attn_weights, planned);
  if (gpu_needs_attn_scratch(plan)) {
    const uint64_t start = off;
    static_cast<AttnScratch&>(a) = lay_out_attn_scratch(m, opts, take);
    a.attn_scratch = off - start;
  }
  a.pred.resize(m.layers.size());
  uint64_t planned_pred = 0;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    if (!m.predicted || !plan.layer_uses_gpu(l)) continue;
    const FfnWeights& w = model.layers[l].ffn;
    EMBER_CHECK(w.fc1.valid() && w.fc2.valid(), "device: layer {} has no predictor, the plan runs one", l);
    const uint64_t start = off;
    a.pred[l] = {true, take(w.fc1.nbytes), take(w.fc2.nbytes)};
    a.predictors += off - start;
    planned_pred += m.layers[l].predictor_bytes;
  }
  EMBER_CHECK(a.predictors == planned_pred, "device: predictor arena layout ({} bytes) disagrees with the plan's "
              "accounting ({} bytes)", a.predictors, planned_pred);
  if (plan.output_gpu) {
    const uint64_t start = off;
    const TensorView& w = model.output_in_file();
    EMBER_CHECK(w.nbytes == model.output.nbytes, "device: the output matrix takes {} bytes in the file's layout, {} "
                "repacked", w.nbytes, model.output.nbytes);
    a.out_norm = model.output_norm.valid() ? take(model.output_norm.nbytes) : 0;
    a.out_norm_b = model.output_norm_b.valid() ? take(model.output_norm_b.nbytes) : 0;
    a.out_w = take(w.nbytes);
    a.logits = take(static_cast<uint64_t>(opts.max_batch) * static_cast<uint64_t>(m.n_vocab) * sizeof(float));
    a.output = off - start;
    EMBER_CHECK(a.output == gpu_output_bytes(m, opts), "device: output head layout ({} bytes) disagrees with the "
                "plan's accounting ({} bytes)", a.output, gpu_output_bytes(m, opts));
  }
  a.experts.resize(m.layers.size());
  {
    const uint64_t start = off;
    uint64_t planned_ex = 0;
    for (size_t l = 0; l < m.layers.size(); ++l) {
      auto& E = a.experts[l];
      for (int32_t e : plan.layers[l].gpu_experts) {
        const FfnWeights& w = model.layers[l].moe.experts[static_cast<size_t>(e)];
        E.gate.push_back(take(w.gate.nbytes));
        E.up.push_back(take(w.up.nbytes));
        E.down.push_back(take(w.down.nbytes));
        planned_ex += m.layers[l].expert_bytes;
      }
    }
    if (gpu_needs_expert_scratch(plan)) {
      static_cast<ExpertScratch&>(a) = lay_out_expert_scratch(m, opts, take);
      planned_ex += gpu_expert_scratch_bytes(m, opts);
    }
    a.experts_total = off - start;
    EMBER_CHECK(a.experts_total == planned_ex, "device: the experts' arena layout ({} bytes) disagrees with the plan's "
                "accounting ({} bytes; were the experts of unequal sizes?)", a.experts_total, planned_ex);
  }
  a.arena = off;
  a.kv = KvCache::bytes_for(n_attn * m.n_seq, m.n_ctx, m.kv_dim, kv_type);  // a cache per sequence
  uint64_t planned_kv = 0;
  for (size_t l = 0; l < m.layers.size(); ++l)
    if (plan.layers[l].attn_gpu) planned_kv += m.layers[l].kv_bytes;
  EMBER_CHECK(a.kv == planned_kv, "device: a KV cache of {} bytes ({}) for its {} attention layers, the plan counts {} "
              "(was the plan made for another KV type or context?)", a.kv, dtype_name(kv_type), n_attn, planned_kv);
  a.total = a.arena + a.kv;
  return a;
}

std::vector<int32_t> predictor_row_order(const Plan& plan, size_t l, int64_t n_ff) {
  const auto& ids = plan.layers[l].gpu_neurons;
  std::vector<int32_t> order(ids.begin(), ids.end());
  std::vector<char> on(static_cast<size_t>(n_ff), 0);
  for (int32_t j : ids) on[static_cast<size_t>(j)] = 1;
  for (int32_t j = 0; j < n_ff; ++j)
    if (!on[static_cast<size_t>(j)]) order.push_back(j);
  return order;
}

void check_down_rows(const Model& model, const DeviceLoad& d) {
  EMBER_CHECK(d.plan && d.down_rows.size() == model.layers.size() && d.plan->layers.size() == model.layers.size(),
              "device: {} layers of down rows for a model of {} layers", d.down_rows.size(), model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto n = static_cast<int64_t>(d.plan->layers[l].gpu_neurons.size());
    if (n == 0) continue;
    const TensorView& r = d.down_rows[l];
    const DType want = hybrid_device_down_type(model.layers[l].ffn, model.hp.n_embd);
    EMBER_CHECK(r.valid() && r.rows() == n && r.cols() == model.hp.n_embd && r.type == want,
                "device: layer {}'s down rows are {} x {} {}, the plan's share needs {} x {} {}", l, r.rows(), r.cols(),
                dtype_name(r.type), n, model.hp.n_embd, dtype_name(want));
  }
}

FfnWeights share_weights(const FfnWeights& w, const TensorView& down_rows, const uint8_t* base,
                         const DeviceArenaLayout::Share& s) {
  auto rows = [&](const TensorView& like, uint64_t offset) {
    return like.valid() ? matrix_view(like.type, base + offset, s.n, like.cols()) : TensorView{};
  };
  FfnWeights f;
  f.gating = w.gating;
  f.gate = rows(w.gate, s.gate);
  f.up = rows(w.up, s.up);
  f.down_t = rows(down_rows, s.down);
  if (w.up_b.valid()) f.up_b = matrix_view(DType::F32, base + s.up_b, 1, s.n);
  return f;
}

// ---- the FFN share ------------------------------------------------------------------------------

uint64_t ffn_share_partial(ThreadPool& pool, const FfnWeights& w, const int32_t* rows, int64_t n_rows,
                           cpu::Activation act, float threshold, const float* x, int64_t n, float* out,
                           const FfnShareScratch& s, const uint8_t* allowed) {
  const int64_t n_embd = w.n_embd();
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * n_embd));
  if (n_rows == 0) return 0;
  float* a = s.act;  // [n][n_rows], then the firing ones moved to the front of each row
  cpu::gather_matmul(pool, w.firing_matrix(), x, n, rows, n_rows, a, n_rows, s.mm);
  ffn_firing_values(w, act, a, n, n_rows, n_rows, rows);
  if (allowed)
    for (int64_t i = 0; i < n * n_rows; ++i)
      if (!allowed[i]) a[i] = 0.0f;
  uint64_t fired = 0;
  const int64_t na = ffn_keep_firing(a, n, n_rows, rows, threshold, s.active, fired);
  if (na == 0) return fired;
  float* h = s.h;  // [n][na]
  if (ffn_needs_up(w)) cpu::gather_matmul(pool, w.up, x, n, s.active, na, h, na, s.mm);
  ffn_neuron_values(w, act, a, n_rows, h, na, n, na, s.active);
  cpu::sparse_axpy(pool, w.down_t, s.active, na, h, n, na, out, n_embd, s.axpy, cpu::AxpySplit::columns);
  return fired;
}

// ---- the hidden state's spans and the merge ---------------------------------------------------

void check_attn_spans(std::span<const AttnSpan> spans, int64_t n, int64_t max_rows, int64_t n_seq, const char* device) {
  EMBER_CHECK(n >= 1 && n <= max_rows && !spans.empty(), "device {}: attention over {} tokens (1 to {})", device, n,
              max_rows);
  int64_t at = 0;
  for (const AttnSpan& s : spans) {
    EMBER_CHECK(s.seq >= 0 && s.seq < n_seq && s.first == at && s.n >= 1 && s.pos0 >= 0,
                "device {}: attention span (sequence {}, rows {}+{}, position {}) is not the next of {} sequences' "
                "rows in order", device, s.seq, s.first, s.n, s.pos0, n_seq);
    at += s.n;
  }
  EMBER_CHECK(at == n, "device {}: attention spans cover {} of {} rows", device, at, n);
}

void ffn_merge_partials(const float* cpu, const float* dev, const FfnWeights& w, float* o, int64_t n) {
  const int64_t count = n * w.n_embd();
  if (cpu != o) {
    if (cpu) std::memcpy(o, cpu, sizeof(float) * static_cast<size_t>(count));
    else std::fill(o, o + count, 0.0f);
  }
  if (dev)
    for (int64_t i = 0; i < count; ++i) o[i] = o[i] + dev[i];
  ffn_add_down_bias(w, o, n);
}

}  // namespace ember
