#include "device/cpu/cpu_device.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/huge_pages.hpp"
#include "device/arena_load.hpp"
#include "model/blocks.hpp"
#include "model/ffn.hpp"
#include "model/moe.hpp"
#include "ops/cpu/activation.hpp"
#include "ops/cpu/matmul.hpp"
#include "sparse/predictor.hpp"

namespace ember {

DeviceCaps cpu_standin_caps() {
  return {.name = "cpu-standin",
          .attention = true,
          .parallel_residual = true,
          .gatings = {FfnGating::par, FfnGating::sym, FfnGating::none},
          .up_bias = true,
          .experts = true,
          .weight_types = {}};
}

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
  layout_ = load_layout(caps(), model, d);
  const PlanModel& pm = *d.pm;
  const Plan& plan = *d.plan;
  model_ = &model;
  arena_ = AlignedBuffer<uint8_t>(layout_.arena);
  n_embd_ = pm.n_embd;
  max_batch_ = d.opts->max_batch;
  // The arena written by the shared loader, in the CPU's layout (the same kernels).
  struct Writer final : ArenaWriter {
    uint8_t* base;
    explicit Writer(uint8_t* b) : base(b) {}
    bool file_layout() const override { return false; }
    void rows(const TensorView& src, const int32_t* ids, int64_t n, uint64_t offset) override {
      const size_t rb = src.row_size();
      for (int64_t i = 0; i < n; ++i) std::memcpy(base + offset + i * rb, src.row(ids ? ids[i] : i), rb);
    }
    void bytes(const void* src, size_t n, uint64_t offset) override { std::memcpy(base + offset, src, n); }
    uint8_t* at(uint64_t offset) override { return base + offset; }
  } writer(arena_.data());
  ArenaViews views = load_arena(model, d, layout_, writer, "CPU stand-in");
  shares_ = std::move(views.shares);
  fc1_ = std::move(views.fc1);
  fc2_ = std::move(views.fc2);
  attn_ = std::move(views.attn);
  out_ = views.out;
  int64_t max_rank = 0;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (!layout_.pred[l].on) continue;
    max_rank = std::max(max_rank, fc1_[l].rows());
    pred_mm_bytes_ = std::max(pred_mm_bytes_, predictor_mm_scratch_bytes(fc1_[l], fc2_[l], max_batch_));
  }
  if (max_rank > 0) {
    pred_scratch_.resize(predictor_scratch_floats(max_rank, pm.n_ff, max_batch_));
    pred_mm_ = AlignedBuffer<uint8_t>(std::max<size_t>(pred_mm_bytes_, 64));
    pred_list_.resize(static_cast<size_t>(pm.n_ff));
    mask_ = AlignedBuffer<uint8_t>(static_cast<size_t>(max_batch_ * pm.n_ff));
    allowed_ = AlignedBuffer<uint8_t>(static_cast<size_t>(max_batch_ * pm.n_ff));
  }
  // A KV cache for the attention layers.
  kv_slot_.assign(model.layers.size(), -1);
  int64_t n_attn = 0;
  for (size_t l = 0; l < model.layers.size(); ++l)
    if (layout_.attn[l].on) kv_slot_[l] = n_attn++;
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
  // A mixture's experts: the loader's copies, in a MoeWeights of the layer's shape (the host routes).
  moe_.assign(model.layers.size(), {});
  expert_ids_.assign(model.layers.size(), {});
  size_t most = 0;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& ids = plan.layers[l].gpu_experts;
    if (ids.empty()) continue;
    const MoeWeights& from = model.layers[l].moe;
    MoeWeights& to = moe_[l];
    to.router = from.router;  // its shape only: the host routes
    to.n_used = from.n_used;
    to.norm_weights = from.norm_weights;
    to.experts.assign(from.experts.size(), {});
    for (size_t i = 0; i < ids.size(); ++i) to.experts[static_cast<size_t>(ids[i])] = views.experts[l][i];
    expert_ids_[l] = ids;
    most = std::max(most, ids.size());
  }
  if (most > 0) {
    ex_ws_.init(model, max_batch_, pm.n_ctx, n_threads_);
    expert_list_.resize(most);
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
  // The merge, then the block's end (post-norm, residual) on the device's hidden state. A
  // mixture's block output is the host's whole (its experts here ran for the host: experts_begin).
  if (model_->layers[static_cast<size_t>(layer)].moe.valid()) {
    EMBER_CHECK(cpu_out, "device {}: layer {} is a mixture, whose output the host computes", name(), layer);
    std::memcpy(ws_.o.data(), cpu_out, sizeof(float) * static_cast<size_t>(n * n_embd_));
  } else {
    ffn_merge_partials(cpu_out, dev, model_->layers[static_cast<size_t>(layer)].ffn, ws_.o.data(), n);
  }
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

void CpuDevice::experts_begin(int64_t layer, const float* x, int64_t n, const int32_t* ids) {
  const size_t l = static_cast<size_t>(layer);
  EMBER_CHECK(layer >= 0 && l < expert_ids_.size() && !expert_ids_[l].empty(), "device {}: layer {} has no experts here",
              name(), layer);
  EMBER_CHECK(n >= 1 && n <= max_batch_, "device {}: experts on {} tokens (1 to {})", name(), n, max_batch_);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  const MoeWeights& moe = moe_[l];
  const size_t xb = sizeof(float) * static_cast<size_t>(n * n_embd_), ib = sizeof(int32_t) * static_cast<size_t>(n * moe.n_used);
  std::memcpy(arena_.data() + layout_.ex_x, x, xb);  // (the slots' rows are gathered here, from the tokens')
  std::copy(ids, ids + n * moe.n_used, ex_ws_.moe_ids.begin());
  counters_.bytes_in += xb + ib;
  job_layer_ = layer, job_n_ = n, job_ = {};
  job_experts_ = true;
  pending_ = true;
  done_ = false;
  lock.unlock();
  cv_.notify_all();
}

const float* CpuDevice::experts_end() {
  std::unique_lock<std::mutex> lock(mu_);
  EMBER_CHECK(job_experts_, "device {}: experts_end without experts_begin", name());
  ++counters_.host_waits;
  cv_.wait(lock, [&] { return done_; });
  job_experts_ = false;
  return reinterpret_cast<const float*>(arena_.data() + layout_.ex_out);
}

void CpuDevice::compute_experts() {
  const size_t l = static_cast<size_t>(job_layer_);
  const MoeWeights& moe = moe_[l];
  const int64_t n = job_n_, k = moe.n_used;
  std::fill(ex_ws_.moe_weights.begin(), ex_ws_.moe_weights.begin() + n * k, 0.0f);  // the host weighs
  moe_group_slots(moe, n, ex_ws_);
  int64_t count = 0;  // its experts that some token chose, ascending
  for (int32_t e : expert_ids_[l])
    if (ex_ws_.moe_first[static_cast<size_t>(e) + 1] > ex_ws_.moe_first[static_cast<size_t>(e)])
      expert_list_[static_cast<size_t>(count++)] = e;
  auto* out = reinterpret_cast<float*>(arena_.data() + layout_.ex_out);
  moe_expert_rows(*pool_, moe, model_->hp.act, reinterpret_cast<const float*>(arena_.data() + layout_.ex_x), n,
                  expert_list_.data(), count, ex_ws_, out);
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
  if (job_experts_) return compute_experts();
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
