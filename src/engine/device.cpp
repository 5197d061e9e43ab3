#include "engine/device.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "model/blocks.hpp"
#include "model/ffn.hpp"
#include "ops/cpu/activation.hpp"
#include "ops/cpu/matmul.hpp"

namespace ember {

// ---- capabilities -----------------------------------------------------------------------------

DeviceCaps cpu_standin_caps() {
  return {.name = "cpu-standin",
          .attention = true,
          .gatings = {FfnGating::par, FfnGating::sym, FfnGating::none},
          .up_bias = true,
          .weight_types = {}};
}

DeviceCaps cuda_caps() {
  // ops/cuda/cuda_ops.cu: act(gate) * up over F32, F16, Q8_0 and Q4_0 rows; no attention yet.
  return {.name = "cuda",
          .attention = false,
          .gatings = {FfnGating::par},
          .up_bias = false,
          .weight_types = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}};
}

std::string device_refusal(const DeviceCaps& caps, const Model& model, const Plan& plan,
                           const std::vector<TensorView>& down_nm) {
  if (plan.layers.size() != model.layers.size())
    return fmt::format("the plan has {} layers, the model {}", plan.layers.size(), model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (plan.layers[l].attn_gpu && !caps.attention)
      return fmt::format("the plan puts layer {}'s attention on the {} device, which runs FFN shares only; plan "
                         "without attention on the GPU", l, caps.name);
    if (plan.layers[l].gpu_neurons.empty()) continue;
    const FfnWeights& w = model.layers[l].ffn;
    if (std::find(caps.gatings.begin(), caps.gatings.end(), w.gating) == caps.gatings.end())
      return fmt::format("layer {} has a {} FFN, which the {} device does not run", l, ffn_gating_name(w.gating),
                         caps.name);
    if (w.up_b.valid() && !caps.up_bias)
      return fmt::format("layer {}'s FFN has an up bias, which the {} device does not run", l, caps.name);
    if (!caps.weight_types.empty()) {
      const TensorView* parts[] = {&w.gate, &w.up, &down_nm[l]};
      for (const TensorView* t : parts) {
        if (!t->valid()) continue;
        if (std::find(caps.weight_types.begin(), caps.weight_types.end(), t->type) == caps.weight_types.end()) {
          std::string known;
          for (DType k : caps.weight_types) known += (known.empty() ? "" : ", ") + std::string(dtype_name(k));
          return fmt::format("layer {} has {} FFN rows; the {} device reads {}", l, dtype_name(t->type), caps.name,
                             known);
        }
      }
    }
  }
  return {};
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
  if (off > 0) {  // the scratch, when any layer has a share (gpu_ffn_scratch_bytes)
    const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
    a.x = take(b * m.n_embd * f);
    a.out = take(b * m.n_embd * f);
    a.act = take(b * m.n_ff * f);
    a.h = take(b * m.n_ff * f);
    a.active = take(m.n_ff * sizeof(int32_t));
    a.pos = take((m.n_ff + 2) * sizeof(int32_t));  // positions, then the counters (CUDA)
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
    for (const TensorView* t : W.attention_tensors()) at.tensors.push_back(t->valid() ? take(t->nbytes) : 0);
    for (const TensorView* t : W.ffn_block_tensors()) at.tensors.push_back(t->valid() ? take(t->nbytes) : 0);
    a.attn_weights += off - start;
  }
  EMBER_CHECK(a.attn_weights == planned, "device: attention arena layout ({} bytes) disagrees with the plan's "
              "accounting ({} bytes)", a.attn_weights, planned);
  a.arena = off;
  a.kv = KvCache::bytes_for(n_attn, m.n_ctx, m.kv_dim, kv_type);
  uint64_t planned_kv = 0;
  for (size_t l = 0; l < m.layers.size(); ++l)
    if (plan.layers[l].attn_gpu) planned_kv += m.layers[l].kv_bytes;
  EMBER_CHECK(a.kv == planned_kv, "device: a KV cache of {} bytes ({}) for its {} attention layers, the plan counts {} "
              "(was the plan made for another KV type or context?)", a.kv, dtype_name(kv_type), n_attn, planned_kv);
  a.total = a.arena + a.kv;
  return a;
}

FfnWeights share_weights(const FfnWeights& w, const TensorView& down_nm, const uint8_t* base,
                         const DeviceArenaLayout::Share& s) {
  auto rows = [&](const TensorView& like, uint64_t offset) {
    return like.valid() ? matrix_view(like.type, base + offset, s.n, like.cols()) : TensorView{};
  };
  FfnWeights f;
  f.gating = w.gating;
  f.gate = rows(w.gate, s.gate);
  f.up = rows(w.up, s.up);
  f.down_t = rows(down_nm, s.down);
  if (w.up_b.valid()) f.up_b = matrix_view(DType::F32, base + s.up_b, 1, s.n);
  return f;
}

// ---- the FFN share ------------------------------------------------------------------------------

uint64_t ffn_share_partial(ThreadPool& pool, const FfnWeights& w, const int32_t* rows, int64_t n_rows,
                           cpu::Activation act, float threshold, const float* x, int64_t n, float* out,
                           const FfnShareScratch& s) {
  const int64_t n_embd = w.n_embd();
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * n_embd));
  if (n_rows == 0) return 0;
  float* a = s.act;  // [n][n_rows], then the firing ones moved to the front of each row
  cpu::gather_matmul(pool, w.firing_matrix(), x, n, rows, n_rows, a, n_rows, s.mm);
  ffn_firing_values(w, act, a, n, n_rows, n_rows, rows);
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

CpuDevice::CpuDevice(int n_threads) : n_threads_(n_threads) {
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
  EMBER_CHECK(d.down_nm.size() == model.layers.size(), "device: {} neuron-major down matrices for {} layers",
              d.down_nm.size(), model.layers.size());
  const std::string why = device_refusal(caps(), model, *d.plan, d.down_nm);
  EMBER_CHECK(why.empty(), "device {}: {}", name(), why);
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
    sh = share_weights(w, d.down_nm[l], base, s);
    EMBER_CHECK((!sh.gate.valid() || sh.gate.row_size() == pm.layers[l].gate_row) &&
                    sh.up.row_size() == pm.layers[l].up_row && sh.down_t.row_size() == pm.layers[l].down_row,
                "device: layer {} row sizes differ from the plan's model (was the plan made for other weights?)", l);
    auto* rows = reinterpret_cast<int32_t*>(base + s.rows);
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t j = ids[static_cast<size_t>(i)];
      if (sh.gate.valid()) std::memcpy(base + s.gate + i * sh.gate.row_size(), w.gate.row(j), sh.gate.row_size());
      std::memcpy(base + s.up + i * sh.up.row_size(), w.up.row(j), sh.up.row_size());
      std::memcpy(base + s.down + i * sh.down_t.row_size(), d.down_nm[l].row(j), sh.down_t.row_size());
      if (w.up_b.valid())
        reinterpret_cast<float*>(base + s.up_b)[i] = reinterpret_cast<const float*>(w.up_b.data)[j];
      rows[i] = static_cast<int32_t>(i);
    }
  }
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
    auto copy = [&](const TensorView* from, TensorView* to) {
      TensorView& v = *to;
      const uint64_t at_off = at.tensors[k++];
      if (!from->valid()) return;
      v = *from;
      v.stride = 0;
      std::memcpy(base + at_off, from->data, from->nbytes);  // contiguous: attention matrices are never bundled
      v.data = base + at_off;
    };
    for (size_t i = 0; i < src.size(); ++i) copy(src[i], dst[i]);
    for (size_t i = 0; i < fsrc.size(); ++i) copy(fsrc[i], fdst[i]);
  }
  n_batch_ = std::max<int64_t>(1, d.n_batch);
  if (n_attn > 0) {
    kv_.init(n_attn, pm.n_ctx, pm.kv_dim, d.kv_type);
    EMBER_CHECK(kv_.bytes() == layout_.kv, "device: KV cache of {} bytes, the layout counts {}", kv_.bytes(),
                layout_.kv);
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

const LayerWeights& CpuDevice::attn_layer(int64_t layer) const {
  EMBER_CHECK(layer >= 0 && static_cast<size_t>(layer) < attn_.size() && kv_slot_[static_cast<size_t>(layer)] >= 0,
              "device {}: layer {}'s attention is not here", name(), layer);
  return attn_[static_cast<size_t>(layer)];
}

void CpuDevice::put_hidden(const float* x, int64_t n) {
  EMBER_CHECK(n >= 1 && n <= n_batch_ && !kv_slot_.empty(), "device {}: hidden state of {} tokens (1 to {})", name(), n,
              n_batch_);
  std::memcpy(ws_.x.data(), x, sizeof(float) * static_cast<size_t>(n * n_embd_));
  ++crossings_.hidden_in;
  crossings_.bytes += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
}

void CpuDevice::get_hidden(float* x, int64_t n) {
  std::memcpy(x, ws_.x.data(), sizeof(float) * static_cast<size_t>(n * n_embd_));
  ++crossings_.hidden_out;
  crossings_.bytes += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
}

void CpuDevice::attention(int64_t layer, int64_t n, int64_t pos0) {
  const LayerWeights& L = attn_layer(layer);
  EMBER_CHECK(n >= 1 && n <= n_batch_, "device {}: attention over {} tokens (1 to {})", name(), n, n_batch_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    EMBER_CHECK(done_, "device {}: attention while an FFN share is running", name());
  }
  attention_block(*model_, L, layer, *pool_, kv_, kv_slot_[static_cast<size_t>(layer)], ws_, ws_.x.data(), n, pos0);
}

const float* CpuDevice::ffn_input(int64_t layer, int64_t n) {
  const LayerWeights& L = attn_layer(layer);
  ffn_block_input(*model_, L, ws_, ws_.x.data(), io_.data(), n);
  crossings_.bytes += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
  return io_.data();
}

void CpuDevice::ffn_finish(int64_t layer, const float* out, int64_t n) {
  const LayerWeights& L = attn_layer(layer);
  // The merged output "uploaded" into the device's buffer, then the block's end there.
  std::memcpy(ws_.o.data(), out, sizeof(float) * static_cast<size_t>(n * n_embd_));
  crossings_.bytes += sizeof(float) * static_cast<uint64_t>(n * n_embd_);
  ffn_block_output(*model_, L, ws_.o.data(), ws_.x.data(), n);
}

void CpuDevice::ffn_begin(int64_t layer, const float* x, int64_t n, cpu::Activation act, float threshold) {
  EMBER_CHECK(layer >= 0 && static_cast<size_t>(layer) < shares_.size() && layout_.layers[layer].n > 0,
              "device: layer {} has no share on {}", layer, name());
  EMBER_CHECK(n >= 1 && n <= max_batch_, "device: batch of {} tokens (1 to {})", n, max_batch_);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  // The "upload": the layer input into the device's own buffer.
  std::memcpy(arena_.data() + layout_.x, x, sizeof(float) * static_cast<size_t>(n * n_embd_));
  job_layer_ = layer, job_n_ = n, job_act_ = act, job_threshold_ = threshold;
  pending_ = true;
  done_ = false;
  lock.unlock();
  cv_.notify_all();
}

const float* CpuDevice::ffn_end() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return reinterpret_cast<const float*>(arena_.data() + layout_.out);
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
      done_ = true;
    }
    cv_.notify_all();
  }
}

void CpuDevice::compute() {
  const auto& s = layout_.layers[static_cast<size_t>(job_layer_)];
  uint8_t* base = arena_.data();
  FfnShareScratch sc;
  sc.act = reinterpret_cast<float*>(base + layout_.act);
  sc.h = reinterpret_cast<float*>(base + layout_.h);
  sc.active = reinterpret_cast<int32_t*>(base + layout_.active);
  sc.mm = kernel_scratch_.data();
  sc.axpy = reinterpret_cast<float*>(kernel_scratch_.data() + mm_bytes_);
  fired_ += ffn_share_partial(*pool_, shares_[static_cast<size_t>(job_layer_)],
                              reinterpret_cast<const int32_t*>(base + s.rows), s.n, job_act_, job_threshold_,
                              reinterpret_cast<const float*>(base + layout_.x), job_n_,
                              reinterpret_cast<float*>(base + layout_.out), sc);
}

}  // namespace ember
