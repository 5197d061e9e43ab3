#include "engine/device.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/huge_pages.hpp"
#include "model/blocks.hpp"
#include "model/ffn.hpp"
#include "ops/cpu/activation.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_ops.hpp"
#include "sparse/predictor.hpp"

namespace ember {

// ---- capabilities -----------------------------------------------------------------------------

DeviceCaps cpu_standin_caps() {
  return {.name = "cpu-standin",
          .attention = true,
          .parallel_residual = true,
          .gatings = {FfnGating::par, FfnGating::sym, FfnGating::none},
          .up_bias = true,
          .weight_types = {}};
}

DeviceCaps cuda_caps() {
  // ops/cuda/cuda_ops.cu: act(gate) * up over F32, F16, Q8_0, Q4_0 and Q4_1 rows;
  // ops/cuda/cuda_blocks.cu: the attention block (RMSNorm or LayerNorm, biases, q/k norms, RoPE,
  // sliding windows, post-norms, an F16 or F32 cache) with heads of up to 256 values.
  return {.name = "cuda",
          .attention = true,
          .parallel_residual = false,
          .max_head_dim = 256,
          .gatings = {FfnGating::par},
          .up_bias = false,
          .weight_types = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1}};
}

std::string device_refusal(const DeviceCaps& caps, const Model& model, const Plan& plan) {
  if (plan.layers.size() != model.layers.size())
    return fmt::format("the plan has {} layers, the model {}", plan.layers.size(), model.layers.size());
  auto known_types = [&] {
    std::string known;
    for (DType k : caps.weight_types) known += (known.empty() ? "" : ", ") + std::string(dtype_name(k));
    return known;
  };
  auto reads = [&](DType t) {
    return caps.weight_types.empty() ||
           std::find(caps.weight_types.begin(), caps.weight_types.end(), t) != caps.weight_types.end();
  };
  if (plan.output_gpu) {
    if (!caps.attention)
      return fmt::format("the plan puts the output head on the {} device, which holds no hidden state; plan without "
                         "it", caps.name);
    const TensorView& w = model.output_in_file();
    if (!reads(w.type))
      return fmt::format("the output matrix {} is {}; the {} device reads {}", w.name, dtype_name(w.type), caps.name,
                         known_types());
  }
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (plan.layers[l].attn_gpu) {
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
        if (!reads(t->type))
          return fmt::format("layer {}'s attention matrix {} is {}; the {} device reads {}", l, t->name,
                             dtype_name(t->type), caps.name, known_types());
    }
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
    if (!reads(down))
      return fmt::format("layer {}'s neuron-major down rows are {}; the {} device reads {}", l, dtype_name(down),
                         caps.name, known_types());
  }
  return {};
}

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

DeviceArenaLayout device_arena_layout(const Model& model, const PlanModel& m, const PlanOptions& opts,
                                      const Plan& plan, DType kv_type) {
  EMBER_CHECK(plan.layers.size() == m.layers.size() && m.layers.size() == model.layers.size(),
              "device: plan has {} layers, the model {}", plan.layers.size(), model.layers.size());
  DeviceArenaLayout a;
  uint64_t off = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t at = off;
    off += gpu_pad(bytes);
    return at;
  };
  a.layers.resize(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const PlanLayer& L = m.layers[l];
    auto& s = a.layers[l];
    s.n = static_cast<int64_t>(plan.layers[l].gpu_neurons.size());
    if (s.n == 0) continue;
    const uint64_t k = static_cast<uint64_t>(s.n);
    s.gate = take(k * L.gate_row);
    s.up = take(k * L.up_row);
    s.down = take(k * L.down_row);
    if (L.bias_row) s.up_b = take(k * L.bias_row);
    s.rows = take(k * sizeof(int32_t));
  }
  if (gpu_needs_ffn_scratch(m, plan)) {  // gpu_ffn_scratch_bytes, in its order
    const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
    a.x = take(b * m.n_embd * f);
    a.out = take(b * m.n_embd * f);
    a.act = take(b * m.n_ff * f);
    a.h = take(b * m.n_ff * f);
    a.active = take(m.n_ff * sizeof(int32_t));
    a.pos = take((m.n_ff + 2) * sizeof(int32_t));  // positions, then the counters (CUDA)
    a.partial = take(static_cast<uint64_t>(cuda::kAxpyChunks) * m.n_embd * f);
    a.xq = take(gpu_q8_bytes(m.n_embd, opts.max_batch));
    a.counts = take(gpu_ffn_counts_bytes(m));
    if (m.predicted) {
      a.px = take(b * m.n_embd * f);
      a.hid = take(b * static_cast<uint64_t>(m.predictor_rank) * f);
      a.mask = take(b * static_cast<uint64_t>(m.n_ff));  // the prediction per token
      a.cand = take((m.n_ff + 2) * sizeof(int32_t));  // the share rows, then cuda::compact's totals
      a.pxq = take(gpu_q8_bytes(m.n_embd, opts.max_batch));
      a.hidq = take(gpu_q8_bytes(m.predictor_rank, opts.max_batch));
    }
  }
  a.ffn_total = off;
  // The layout and the solvers' accounting are two spellings of one sum: they must agree.
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
  if (gpu_needs_attn_scratch(plan)) {  // gpu_attn_scratch_bytes, in its order
    const uint64_t start = off, b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
    a.x_hidden = take(b * m.n_embd * f);
    a.xn = take(b * m.n_embd * f);
    a.o = take(b * m.n_embd * f);
    a.q = take(b * m.q_dim * f);
    a.k = take(b * m.kv_dim * f);
    a.v = take(b * m.kv_dim * f);
    a.att = take(b * m.q_dim * f);
    a.scores = take(b * m.n_head * m.n_ctx * f);
    const uint64_t rope = static_cast<uint64_t>(m.q_dim / m.n_head / 2) * sizeof(double);
    a.rope = take(rope);
    a.rope_local = take(rope);
    a.aq = take(gpu_q8_bytes(std::max(m.n_embd, m.q_dim), opts.max_batch));
    a.attn_partial =
        take(static_cast<uint64_t>(cuda::attention_partial_floats(opts.max_batch, m.n_head, m.q_dim / m.n_head,
                                                                  m.n_ctx)) * f);
    a.positions = take(b * sizeof(int32_t));
    a.attn_scratch = off - start;
    EMBER_CHECK(a.attn_scratch == gpu_attn_scratch_bytes(m, opts), "device: attention scratch layout ({} bytes) "
                "disagrees with the plan's accounting ({} bytes)", a.attn_scratch, gpu_attn_scratch_bytes(m, opts));
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

// ---- CpuDevice ----------------------------------------------------------------------------------

CpuDevice::CpuDevice(int n_threads, uint64_t vram) : n_threads_(n_threads), vram_(vram) {
  EMBER_CHECK(n_threads >= 1 && n_threads <= 1024, "device threads must be in [1, 1024], got {}", n_threads);
  pool_ = std::make_unique<ThreadPool>(n_threads);
  thread_ = std::thread([this] { driver(); });
}

CpuDevice::~CpuDevice() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CpuDevice::load(const Model& model, const DeviceLoad& d) {
  EMBER_CHECK(d.pm && d.opts && d.plan, "device: load needs the plan, its model and options");
  const std::string why = device_refusal(caps(), model, *d.plan);
  EMBER_CHECK(why.empty(), "device {}: {}", name(), why);
  check_down_rows(model, d);
  const PlanModel& pm = *d.pm;
  const Plan& plan = *d.plan;
  model_ = &model;
  layout_ = device_arena_layout(model, pm, *d.opts, plan, d.kv_type);
  arena_ = AlignedBuffer<uint8_t>(layout_.arena);
  n_embd_ = pm.n_embd;
  max_batch_ = d.opts->max_batch;
  uint8_t* base = arena_.data();
  shares_.assign(model.layers.size(), {});
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& s = layout_.layers[l];
    if (s.n == 0) continue;
    const FfnWeights& w = model.layers[l].ffn;
    const auto& ids = plan.layers[l].gpu_neurons;
    FfnWeights& sh = shares_[l];
    sh = share_weights(w, d.down_rows[l], base, s);
    EMBER_CHECK((!sh.gate.valid() || sh.gate.row_size() == pm.layers[l].gate_row) &&
                    sh.up.row_size() == pm.layers[l].up_row && sh.down_t.row_size() == pm.layers[l].down_row,
                "device: layer {} row sizes differ from the plan's model (was the plan made for other weights?)", l);
    auto* rows = reinterpret_cast<int32_t*>(base + s.rows);
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t j = ids[static_cast<size_t>(i)];
      if (sh.gate.valid()) std::memcpy(base + s.gate + i * sh.gate.row_size(), w.gate.row(j), sh.gate.row_size());
      std::memcpy(base + s.up + i * sh.up.row_size(), w.up.row(j), sh.up.row_size());
      std::memcpy(base + s.down + i * sh.down_t.row_size(), d.down_rows[l].row(i), sh.down_t.row_size());
      if (w.up_b.valid())
        reinterpret_cast<float*>(base + s.up_b)[i] = reinterpret_cast<const float*>(w.up_b.data)[j];
      rows[i] = static_cast<int32_t>(i);
    }
  }
  // Predictors: fc1 as it is, fc2's rows in predictor_row_order.
  fc1_.assign(model.layers.size(), {});
  fc2_.assign(model.layers.size(), {});
  int64_t max_rank = 0;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& P = layout_.pred[l];
    if (!P.on) continue;
    const FfnWeights& w = model.layers[l].ffn;
    const std::vector<int32_t> order = predictor_row_order(plan, l, pm.n_ff);
    fc1_[l] = matrix_view(w.fc1.type, base + P.fc1, w.fc1.rows(), w.fc1.cols());
    fc2_[l] = matrix_view(w.fc2.type, base + P.fc2, w.fc2.rows(), w.fc2.cols());
    for (int64_t r = 0; r < w.fc1.rows(); ++r)
      std::memcpy(const_cast<uint8_t*>(fc1_[l].row(r)), w.fc1.row(r), w.fc1.row_size());
    for (int64_t r = 0; r < w.fc2.rows(); ++r)
      std::memcpy(const_cast<uint8_t*>(fc2_[l].row(r)), w.fc2.row(order[static_cast<size_t>(r)]), w.fc2.row_size());
    max_rank = std::max(max_rank, w.fc1.rows());
    pred_mm_bytes_ = std::max(pred_mm_bytes_, predictor_mm_scratch_bytes(w.fc1, w.fc2, max_batch_));
  }
  if (max_rank > 0) {
    pred_scratch_.resize(predictor_scratch_floats(max_rank, pm.n_ff, max_batch_));
    pred_mm_ = AlignedBuffer<uint8_t>(std::max<size_t>(pred_mm_bytes_, 64));
    pred_list_.resize(static_cast<size_t>(pm.n_ff));
    mask_ = AlignedBuffer<uint8_t>(static_cast<size_t>(max_batch_ * pm.n_ff));
    allowed_ = AlignedBuffer<uint8_t>(static_cast<size_t>(max_batch_ * pm.n_ff));
  }
  // A tensor copied into the arena at `off` and its view there (an empty view stays empty);
  // contiguous: attention matrices and the output head are never bundled.
  auto placed = [&](const TensorView& from, uint64_t off) {
    TensorView v = from;
    if (!from.valid()) return v;
    std::memcpy(base + off, from.data, from.nbytes);
    v.stride = 0;
    v.data = base + off;
    return v;
  };
  // Attention layers: their tensors copied into the arena, a KV cache for them.
  attn_.assign(model.layers.size(), {});
  kv_slot_.assign(model.layers.size(), -1);
  int64_t n_attn = 0;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& at = layout_.attn[l];
    if (!at.on) continue;
    kv_slot_[l] = n_attn++;
    const LayerWeights& W = model.layers[l];
    LayerWeights& C = attn_[l];
    auto src = W.attention_tensors();
    auto dst = C.attention_tensors();
    auto fsrc = W.ffn_block_tensors();
    auto fdst = C.ffn_block_tensors();
    size_t k = 0;
    for (size_t i = 0; i < src.size(); ++i) *dst[i] = placed(*src[i], at.tensors[k++]);
    for (size_t i = 0; i < fsrc.size(); ++i) *fdst[i] = placed(*fsrc[i], at.tensors[k++]);
  }
  // The output head: its tensors copied into the arena (the CPU's layout: the same kernels).
  out_ = {};
  if (plan.output_gpu) {
    out_.norm = placed(model.output_norm, layout_.out_norm);
    out_.norm_b = placed(model.output_norm_b, layout_.out_norm_b);
    out_.output = placed(model.output, layout_.out_w);
  }
  n_batch_ = std::max<int64_t>(1, d.n_batch);
  kvs_.clear();
  kvs_.resize(n_attn > 0 ? static_cast<size_t>(pm.n_seq) : 0);
  uint64_t kv_bytes = 0;
  for (KvCache& kv : kvs_) {
    kv.init(n_attn, pm.n_ctx, pm.kv_dim, d.kv_type);
    kv_bytes += kv.bytes();
  }
  EMBER_CHECK(kv_bytes == layout_.kv, "device: KV caches of {} bytes, the layout counts {}", kv_bytes, layout_.kv);
  if (gpu_needs_attn_scratch(plan)) {  // a hidden state here
    ws_.init(model, n_batch_, pm.n_ctx, n_threads_);
    io_.resize(static_cast<size_t>(n_batch_ * n_embd_));
  }
  // Kernel scratch (CPU kernels only: quantized activations, axpy rows); not device memory.
  mm_bytes_ = 0;
  for (size_t l = 0; l < model.layers.size(); ++l)
    if (layout_.layers[l].n > 0)
      mm_bytes_ = std::max({mm_bytes_, cpu::gather_matmul_scratch_bytes(model.layers[l].ffn.up.type, n_embd_, max_batch_),
                            model.layers[l].ffn.gated()
                                ? cpu::gather_matmul_scratch_bytes(model.layers[l].ffn.gate.type, n_embd_, max_batch_)
                                : size_t{0}});
  mm_bytes_ = (mm_bytes_ + 63) / 64 * 64;
  kernel_scratch_ = AlignedBuffer<uint8_t>(
      mm_bytes_ + cpu::sparse_axpy_scratch_floats(n_embd_, max_batch_, n_threads_, cpu::AxpySplit::columns) * sizeof(float));
}

DeviceMemory CpuDevice::memory() const {
  const uint64_t size = vram_ ? vram_ : available_memory_bytes();
  DeviceMemory m;
  m.total = size;
  m.free = size > layout_.total ? size - layout_.total : 0;  // what it holds is taken
  return m;
}

const LayerWeights& CpuDevice::attn_layer(int64_t layer) const {
  EMBER_CHECK(layer >= 0 && static_cast<size_t>(layer) < attn_.size() && kv_slot_[static_cast<size_t>(layer)] >= 0,
              "device {}: layer {}'s attention is not here", name(), layer);
  return attn_[static_cast<size_t>(layer)];
}

void CpuDevice::put_hidden(const float* x, int64_t n, std::span<const AttnSpan> spans) {
  (void)spans;  // the stand-in's attention takes them from its own call
  EMBER_CHECK(n >= 1 && n <= n_batch_ && !kv_slot_.empty(), "device {}: hidden state of {} tokens (1 to {})", name(), n,
              n_batch_);
  std::memcpy(ws_.x.data(), x, sizeof(float) * static_cast<size_t>(n * n_embd_));
  ++crossings_.hidden_in;
  crossings_.bytes += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
  counters_.bytes_in += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
}

void CpuDevice::get_hidden(float* x, int64_t n) {
  std::memcpy(x, ws_.x.data(), sizeof(float) * static_cast<size_t>(n * n_embd_));
  ++crossings_.hidden_out;
  crossings_.bytes += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
  counters_.bytes_out += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
}

void CpuDevice::attention(int64_t layer, std::span<const AttnSpan> spans, int64_t n) {
  const LayerWeights& L = attn_layer(layer);
  check_attn_spans(spans, n, n_batch_, static_cast<int64_t>(kvs_.size()), name());
  {
    std::lock_guard<std::mutex> lock(mu_);
    EMBER_CHECK(done_, "device {}: attention while an FFN share is running", name());
  }
  // The CPU's own multi-sequence block, each sequence on its cache here.
  seq_spans_.clear();
  for (const AttnSpan& s : spans) seq_spans_.push_back({&kvs_[static_cast<size_t>(s.seq)], s.first, s.n, s.pos0, s.seq});
  attention_block(*model_, L, layer, *pool_, seq_spans_, kv_slot_[static_cast<size_t>(layer)], ws_, ws_.x.data(), n);
}

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

void CpuDevice::ffn_block_begin(int64_t layer, int64_t n, const ShareRule& rule, bool host_input) {
  const LayerWeights& L = attn_layer(layer);
  EMBER_CHECK(!block_job_, "device {}: ffn_block_begin of layer {} before the previous ffn_block_end", name(), layer);
  ffn_block_input(*model_, L, ws_, ws_.x.data(), io_.data(), n);
  const size_t l = static_cast<size_t>(layer);
  block_job_ = layout_.layers[l].n > 0 || (rule.predict && layout_.pred[l].on);
  if (block_job_) ffn_begin(layer, io_.data(), n, rule);
  if (host_input) {
    crossings_.bytes += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
    counters_.bytes_out += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
  }
}

const float* CpuDevice::ffn_host_input() { return io_.data(); }

void CpuDevice::ffn_block_end(int64_t layer, const float* cpu_out, int64_t n) {
  const LayerWeights& L = attn_layer(layer);
  const float* dev = nullptr;
  if (block_job_) {
    dev = ffn_end();
    block_job_ = false;
    if (layout_.layers[static_cast<size_t>(layer)].n == 0) dev = nullptr;  // a predictor alone
  }
  if (cpu_out) {
    crossings_.bytes += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
    counters_.bytes_in += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
  }
  // The merge, then the block's end (post-norm, residual) on the device's hidden state.
  ffn_merge_partials(cpu_out, dev, model_->layers[static_cast<size_t>(layer)].ffn, ws_.o.data(), n);
  ffn_block_output(*model_, L, ws_.o.data(), ws_.x.data(), n);
}

void CpuDevice::output(int64_t n, float* logits) {
  EMBER_CHECK(out_.output.valid(), "device {}: the output head is not here", name());
  EMBER_CHECK(n >= 1 && n <= n_batch_, "device {}: the output head on {} rows (1 to {})", name(), n, n_batch_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    EMBER_CHECK(done_, "device {}: the output head while an FFN share is running", name());
  }
  output_block(*model_, out_, *pool_, ws_, ws_.x.data(), n, logits);
  crossings_.bytes += sizeof(float) * static_cast<uint64_t>(n * model_->hp.n_vocab);
  counters_.bytes_out += sizeof(float) * static_cast<uint64_t>(n * model_->hp.n_vocab);
}

void CpuDevice::ffn_begin(int64_t layer, const float* x, int64_t n, const ShareRule& rule) {
  const size_t l = static_cast<size_t>(layer);
  EMBER_CHECK(layer >= 0 && l < shares_.size() && (layout_.layers[l].n > 0 || (rule.predict && layout_.pred[l].on)),
              "device: layer {} has no share on {}", layer, name());
  EMBER_CHECK(!rule.predict || layout_.pred[l].on, "device {}: layer {}'s predictor is not here", name(), layer);
  EMBER_CHECK(n >= 1 && n <= max_batch_, "device: batch of {} tokens (1 to {})", n, max_batch_);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  // The "upload": the layer input (and the predictor's, where it differs) into the device's buffers.
  const size_t bytes = sizeof(float) * static_cast<size_t>(n * n_embd_);
  std::memcpy(arena_.data() + layout_.x, x, bytes);
  if (x != io_.data()) counters_.bytes_in += bytes;  // (the FFN block's input is here already)
  job_px_ = reinterpret_cast<const float*>(arena_.data() + layout_.x);
  if (rule.predict && rule.predictor_input == ShareRule::Input::host) {
    std::memcpy(arena_.data() + layout_.px, rule.predictor_x, bytes);
    job_px_ = reinterpret_cast<const float*>(arena_.data() + layout_.px);
  } else if (rule.predict && rule.predictor_input == ShareRule::Input::hidden) {
    EMBER_CHECK(kv_slot_[l] >= 0 && rule.hidden_row0 >= 0 && rule.hidden_row0 + n <= n_batch_,
                "device {}: the predictor of layer {} reads a hidden state this device does not hold", name(), layer);
    job_px_ = ws_.x.data() + rule.hidden_row0 * n_embd_;
  }
  job_layer_ = layer, job_n_ = n, job_ = rule;
  pending_ = true;
  done_ = false;
  predicted_ = !rule.predict;
  lock.unlock();
  cv_.notify_all();
}

const float* CpuDevice::ffn_end() {
  std::unique_lock<std::mutex> lock(mu_);
  ++counters_.host_waits;
  cv_.wait(lock, [&] { return done_; });
  if (!block_job_) counters_.bytes_out += sizeof(float) * static_cast<uint64_t>(job_n_ * n_embd_);
  return reinterpret_cast<const float*>(arena_.data() + layout_.out);
}

PredictedMask CpuDevice::ffn_predicted() {
  std::unique_lock<std::mutex> lock(mu_);
  EMBER_CHECK(job_.predict, "device {}: ffn_predicted without a predicted ffn_begin", name());
  ++counters_.host_waits;
  cv_.wait(lock, [&] { return predicted_; });
  const int64_t n_cpu = fc2_[static_cast<size_t>(job_layer_)].rows() - layout_.layers[static_cast<size_t>(job_layer_)].n;
  return {mask_.data(), n_cpu};
}

void CpuDevice::driver() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return pending_ || stop_; });
      if (stop_) return;
      pending_ = false;
    }
    compute();
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = predicted_ = true;
    }
    cv_.notify_all();
  }
}

void CpuDevice::compute() {
  const size_t l = static_cast<size_t>(job_layer_);
  const auto& s = layout_.layers[l];
  uint8_t* base = arena_.data();
  const int32_t* rows = reinterpret_cast<const int32_t*>(base + s.rows);
  int64_t n_rows = s.n;
  const uint8_t* allowed = nullptr;
  if (job_.predict) {
    // The whole layer's prediction over fc2 in predictor_row_order: positions below s.n are the
    // share's rows (ascending, as ffn_share_partial wants them), the rest the CPU's neurons; per
    // token, from the scores predict_active leaves (token-major).
    const int64_t np = predict_active(*pool_, fc1_[l], fc2_[l], job_.predictor_threshold, job_px_, job_n_,
                                      pred_scratch_.data(), pred_mm_.data(), pred_list_.data());
    const int64_t n_ff = fc2_[l].rows(), n_cpu = n_ff - s.n;
    const float* score = pred_scratch_.data();
    for (int64_t t = 0; t < job_n_; ++t)
      for (int64_t c = 0; c < n_cpu; ++c)
        mask_[static_cast<size_t>(t * n_cpu + c)] = score[t * n_ff + s.n + c] >= job_.predictor_threshold;
    n_rows = 0;
    while (n_rows < np && pred_list_[static_cast<size_t>(n_rows)] < s.n) ++n_rows;
    rows = pred_list_.data();
    if (job_n_ > 1) {  // a batch: each row serves the tokens whose prediction names it
      for (int64_t t = 0; t < job_n_; ++t)
        for (int64_t i = 0; i < n_rows; ++i)
          allowed_[static_cast<size_t>(t * n_rows + i)] =
              score[t * n_ff + pred_list_[static_cast<size_t>(i)]] >= job_.predictor_threshold;
      allowed = allowed_.data();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      predicted_ = true;
    }
    cv_.notify_all();
  }
  auto* out = reinterpret_cast<float*>(base + layout_.out);
  if (s.n == 0) {
    std::memset(out, 0, sizeof(float) * static_cast<size_t>(job_n_ * n_embd_));
    return;
  }
  FfnShareScratch sc;
  sc.act = reinterpret_cast<float*>(base + layout_.act);
  sc.h = reinterpret_cast<float*>(base + layout_.h);
  sc.active = reinterpret_cast<int32_t*>(base + layout_.active);
  sc.mm = kernel_scratch_.data();
  sc.axpy = reinterpret_cast<float*>(kernel_scratch_.data() + mm_bytes_);
  fired_ += ffn_share_partial(*pool_, shares_[l], rows, n_rows, job_.act, job_.threshold,
                              reinterpret_cast<const float*>(base + layout_.x), job_n_, out, sc, allowed);
}

}  // namespace ember
