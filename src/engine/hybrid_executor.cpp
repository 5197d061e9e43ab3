#include "engine/hybrid_executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "model/blocks.hpp"
#include "model/moe.hpp"
#include "sparse/predictor.hpp"
#include "device/make_device.hpp"

namespace ember {

HybridExecutor::HybridExecutor(const Model& model, ThreadPool& pool, const HybridOptions& opts, int64_t n_ctx, int64_t n_batch,
                     std::unique_ptr<Device> device)
    : model_(model), threshold_(opts.threshold) {
  EMBER_CHECK(std::isfinite(opts.threshold) && opts.threshold >= 0.0f, "hybrid: threshold must be >= 0, got {}",
              opts.threshold);
  Timer timer;
  // The device first: what it can hold decides what the planner may put there.
  device_ = device ? std::move(device) : make_device(opts.device_kind, opts.device_threads, opts.standin_vram);
  plan_for_device(opts, n_ctx);
  split_layers();
  make_cpu_downs(pool, opts);
  load_device(pool, opts, n_batch);
  size_buffers(pool, opts);
  log_placement(timer.seconds());
}

void HybridExecutor::plan_for_device(const HybridOptions& opts, int64_t n_ctx) {
  const Model& model = model_;
  HybridOptions o = opts;
  o.plan.attention = opts.plan.attention && device_->caps().attention;
  // Attention blocks and the output head go to the device where it reads every layer's (their
  // kind, head size and matrices' types); else the FFN shares may still go there.
  if (o.plan.attention && !opts.given && opts.plan_path.empty()) {
    std::string why = output_refusal(device_->caps(), model);
    for (size_t l = 0; l < model.layers.size() && why.empty(); ++l) why = attention_refusal(device_->caps(), model, l);
    if (!why.empty()) {
      log_info("hybrid: no attention or output head on the device: {}", why);
      o.plan.attention = false;
    }
  }
  o.plan.scratch = device_->caps().scratch;
  // A mixture's experts go to the device where it runs them (their gating and types); else its
  // layers' attention may still go there (the host runs the mixture, whole, as the CPU's part).
  o.plan.experts = opts.plan.experts;
  for (size_t l = 0; l < model.layers.size() && o.plan.experts; ++l)
    if (model.layers[l].moe.valid())
      if (const std::string why = experts_refusal(device_->caps(), model, l); !why.empty()) {
        log_info("hybrid: no experts on the device: {}", why);
        o.plan.experts = false;
      }
  // Budgets of the real process: what the device has free now, less its runtime's own share.
  DeviceMemory mem = device_->memory();
  if (opts.vram_reserve >= 0) mem.reserve = static_cast<uint64_t>(opts.vram_reserve);
  const auto mib = [](uint64_t b) { return static_cast<double>(b) / 1048576.0; };
  if (!opts.given && opts.plan_path.empty()) {
    o.vram_budget = device_plan_budget(mem, opts.vram_auto ? 0 : opts.vram_budget, device_->name());
    log_info("hybrid: device {} has {:.1f} MiB free of {:.1f} MiB; {} leaves the plan {:.1f} MiB{}", device_->name(),
             mib(mem.free), mib(mem.total),
             opts.vram_auto ? std::string("--vram-budget auto") : fmt::format("--vram-budget {:.1f} MiB", mib(opts.vram_budget)),
             mib(o.vram_budget), mem.reserve ? fmt::format(" (its runtime takes about {:.0f} MiB)", mib(mem.reserve)) : "");
  }
  plan_ = hybrid_plan(model, o, n_ctx, &pm_, &popts_);
  const uint64_t margin = device_free_margin(mem);
  EMBER_CHECK(plan_.gpu_bytes + margin <= mem.free, "hybrid: the plan puts {:.1f} MiB on the {} device, which has {:.1f} "
              "MiB free ({:.0f} MiB kept spare); plan for a smaller budget or use --vram-budget auto",
              mib(plan_.gpu_bytes), device_->name(), mib(mem.free), mib(margin));
}

void HybridExecutor::split_layers() {
  const Model& model = model_;
  const Hparams& hp = model.hp;
  cpu_rows_.resize(model.layers.size());
  expert_on_.resize(model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (model.layers[l].moe.valid()) {
      expert_on_[l].assign(static_cast<size_t>(model.layers[l].moe.n_expert()), 0);
      for (int32_t e : plan_.layers[l].gpu_experts) expert_on_[l][static_cast<size_t>(e)] = 1;
      continue;
    }
    std::vector<char> on(static_cast<size_t>(hp.n_ff), 0);
    for (int32_t j : plan_.layers[l].gpu_neurons) on[static_cast<size_t>(j)] = 1;
    for (int32_t j = 0; j < hp.n_ff; ++j)
      if (!on[static_cast<size_t>(j)]) cpu_rows_[l].push_back(j);
  }
}

void HybridExecutor::make_cpu_downs(ThreadPool& pool, const HybridOptions& opts) {
  const Model& model = model_;
  const Hparams& hp = model.hp;
  // The CPU's neuron-major down: the file's down_t where it has one, else a copy of the type
  // that takes the least time per token for the neurons the plan leaves it (hybrid_cpu_down_type).
  down_nm_.resize(model.layers.size());
  std::map<std::string, int> copies;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const FfnWeights& w = model.layers[l].ffn;
    if (model.layers[l].moe.valid()) {  // no neurons to split
      down_views_.emplace_back();
      cpu_share_.emplace_back();
      continue;
    }
    if (w.down_t.data) {
      down_views_.push_back(w.down_t);
    } else {
      const DType t = hybrid_cpu_down_type(w, hp.n_embd, opts.down_type, pm_.layers[l].p, cpu_rows_[l]);
      down_nm_[l] = cpu::make_neuron_major(pool, w.down, t);
      down_views_.push_back(down_nm_[l].view);
      ++copies[std::string(dtype_name(t))];
    }
    // The CPU's share reads the layer's own rows; the merge adds down_b once.
    FfnWeights c = w;
    c.down = {};
    c.down_b = {};
    c.down_t = down_views_.back();
    cpu_share_.push_back(c);
  }
  if (!copies.empty()) {
    std::string kinds;
    for (const auto& [t, n] : copies) kinds += fmt::format("{}{} layers {}", kinds.empty() ? "" : ", ", n, t);
    size_t b = 0;
    for (const auto& m : down_nm_) b += m.view.nbytes;
    log_info("hybrid: the CPU's neuron-major down copies: {} ({:.1f} MiB)", kinds, b / 1048576.0);
  }
}

void HybridExecutor::load_device(ThreadPool& pool, const HybridOptions& opts, int64_t n_batch) {
  const Model& model = model_;
  // The device's down: its neurons' rows only, in the share's order and in rows of their own
  // (hybrid_device_down_type), made for the load and dropped after it.
  std::vector<cpu::NeuronMajorMatrix> rows(model.layers.size());
  DeviceLoad what;
  what.pm = &pm_;
  what.opts = &popts_;
  what.plan = &plan_;
  what.kv_type = opts.kv_type;
  what.n_batch = n_batch;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& ids = plan_.layers[l].gpu_neurons;
    if (!ids.empty() && !model.layers[l].moe.valid())
      rows[l] = cpu::neuron_major_rows(pool, down_views_[l], ids.data(), static_cast<int64_t>(ids.size()),
                                       hybrid_device_down_type(model.layers[l].ffn, model.hp.n_embd));
    what.down_rows.push_back(rows[l].view);
  }
  // A GPU that cannot take this model (a weight type its kernels do not read, too little
  // memory) is an error, with the reason; `auto` takes the stand-in only where no GPU exists.
  device_->load(model, what);
}

void HybridExecutor::size_buffers(ThreadPool& pool, const HybridOptions& opts) {
  const Model& model = model_;
  const Hparams& hp = model.hp;
  const size_t b = static_cast<size_t>(popts_.max_batch), nf = static_cast<size_t>(hp.n_ff);
  act_.resize(b * nf);
  h_.resize(b * nf);
  partial_.resize(b * static_cast<size_t>(hp.n_embd));
  active_.resize(nf);
  axpy_.resize(cpu::sparse_axpy_scratch_floats(hp.n_embd, popts_.max_batch, pool.size(), cpu::AxpySplit::columns));
  size_t most_experts = 0;
  int64_t used = 0;
  for (size_t l = 0; l < model.layers.size(); ++l)
    if (!expert_on_[l].empty()) most_experts = std::max(most_experts, expert_on_[l].size()), used = std::max(used, model.layers[l].moe.n_used);
  if (most_experts > 0) {
    expert_rows_.resize(b * static_cast<size_t>(used * hp.n_embd));
    cpu_experts_.resize(most_experts);
    expert_ptrs_.resize(most_experts);
  }
  predict_ = opts.predictor;
  if (predict_) {
    int64_t rank = 0;
    size_t mm = 64;
    for (size_t l = 0; l < model.layers.size(); ++l) {
      if (plan_.layer_uses_gpu(l)) continue;  // its predictor runs on the device
      const FfnWeights& w = model.layers[l].ffn;
      rank = std::max(rank, w.fc1.rows());
      mm = std::max(mm, predictor_mm_scratch_bytes(w.fc1, w.fc2, popts_.max_batch));
    }
    predicted_.resize(nf);
    predicted_pos_.resize(nf);
    allowed_.resize(b * nf);
    if (rank > 0) {
      pred_scratch_.resize(predictor_scratch_floats(rank, hp.n_ff, popts_.max_batch));
      pred_mm_ = AlignedBuffer<uint8_t>(mm);
    }
  }
}

void HybridExecutor::log_placement(double seconds) const {
  int used = 0, attn = 0;
  double cpu_read = 0, gpu_read = 0;
  std::string experts;
  for (size_t l = 0; l < plan_.layers.size(); ++l) {
    used += !plan_.layers[l].gpu_neurons.empty() || !plan_.layers[l].gpu_experts.empty();
    attn += plan_.layers[l].attn_gpu;
    const LayerTraffic t = layer_bytes_per_token(pm_, pm_.layers[l], plan_.layers[l]);
    cpu_read += t.cpu, gpu_read += t.gpu;
    if (pm_.layers[l].moe())
      experts += fmt::format("{}{}", experts.empty() ? "" : " ", plan_.layers[l].gpu_experts.size());
  }
  log_info("hybrid: device {} holds {} {} in {} of {} layers, the attention of {} layers{} ({:.1f} MiB), CPU the "
           "rest; ready in {:.2f} s",
           device_->name(), experts.empty() ? plan_.n_gpu_neurons() : plan_.n_gpu_experts(),
           experts.empty() ? "neurons" : "experts", used, plan_.layers.size(), attn,
           plan_.output_gpu ? " and the output head" : "", device_->stats().bytes / 1048576.0, seconds);
  if (!experts.empty()) log_info("hybrid: experts on the device by layer: {}", experts);
  log_info("hybrid: a token reads {:.2f} MB on the CPU and {:.2f} MB on the device (the plan's cost model)",
           cpu_read / 1e6, gpu_read / 1e6);
}

std::string HybridExecutor::refusal(const Model& model) const {
  return device_refusal(device_->caps(), model, plan_);
}

HybridStats HybridExecutor::stats() const {
  return {device_->stats().fired, cpu_fired_, device_calls_, cpu_predicted_, cpu_ffn_s_, wait_s_, device_block_s_,
          cpu_layer_s_, device_expert_runs_, cpu_expert_runs_};
}

void HybridExecutor::reset_stats() {
  device_->reset_stats();
  cpu_fired_ = 0;
  device_calls_ = 0;
  cpu_predicted_ = 0;
  device_expert_runs_ = cpu_expert_runs_ = 0;
  cpu_ffn_s_ = wait_s_ = device_block_s_ = cpu_layer_s_ = 0;
}

size_t HybridExecutor::cpu_bytes() const {
  size_t b = 0;
  for (const auto& m : down_nm_) b += m.view.nbytes;
  for (const auto& r : cpu_rows_) b += r.size() * sizeof(int32_t);
  return b + (act_.size() + h_.size() + partial_.size() + axpy_.size() + pred_scratch_.size() + expert_rows_.size()) * sizeof(float) +
         (active_.size() + predicted_.size() + predicted_pos_.size()) * sizeof(int32_t) + pred_mm_.size() +
         allowed_.size();
}

ShareRule HybridExecutor::share_rule(size_t l, cpu::Activation act, int64_t t0, const Workspace& ws) const {
  ShareRule r;
  r.act = act;
  r.threshold = threshold_;
  if (!predict_) return r;
  r.predict = true;
  r.predictor_threshold = predictor_threshold(model_, static_cast<int64_t>(l));
  if (!model_.predictor_on_residual) {
    r.predictor_input = ShareRule::Input::ffn_input;
  } else if (plan_.layers[l].attn_gpu) {  // the residual is the device's hidden state
    r.predictor_input = ShareRule::Input::hidden;
    r.hidden_row0 = t0;
  } else {
    EMBER_CHECK(ws.ffn_residual, "hybrid: this model's predictor reads the residual stream, which the forward pass did "
                "not provide");
    r.predictor_input = ShareRule::Input::host;
    r.predictor_x = ws.ffn_residual + t0 * model_.hp.n_embd;
  }
  return r;
}

int64_t HybridExecutor::cpu_rows_for(ThreadPool& pool, size_t l, const float* x, int64_t n, int64_t t0,
                                const Workspace& ws, bool device_predicts, const int32_t** rows,
                                const uint8_t** allowed) {
  const auto& all = cpu_rows_[l];
  *allowed = nullptr;
  if (!predict_) {
    *rows = all.data();
    return static_cast<int64_t>(all.size());
  }
  // The union of the batch's predictions is what is gathered; each row then serves the tokens
  // whose own prediction names it (PredictedMask), as the all-CPU predictor mode computes.
  int64_t k = 0;
  if (device_predicts) {
    const PredictedMask mask = device_->ffn_predicted();
    for (size_t c = 0; c < all.size(); ++c) {
      bool any = false;
      for (int64_t t = 0; t < n && !any; ++t) any = mask.has(t, static_cast<int64_t>(c));
      if (any) predicted_pos_[static_cast<size_t>(k)] = static_cast<int32_t>(c), predicted_[static_cast<size_t>(k++)] = all[c];
    }
    if (n > 1) {
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < k; ++i)
          allowed_[static_cast<size_t>(t * k + i)] = mask.has(t, predicted_pos_[static_cast<size_t>(i)]);
      *allowed = allowed_.data();
    }
  } else {  // the layer's predictor on the CPU; every neuron is the CPU's
    const FfnWeights& w = model_.layers[l].ffn;
    const ShareRule r = share_rule(l, cpu::Activation::relu, t0, ws);
    const float* px = r.predictor_input == ShareRule::Input::host ? r.predictor_x : x;
    k = predict_active(pool, w.fc1, w.fc2, r.predictor_threshold, px, n, pred_scratch_.data(), pred_mm_.data(),
                       predicted_.data());
    if (n > 1) {
      const float* score = pred_scratch_.data();  // [n][n_ff], token-major
      const int64_t n_ff = w.fc2.rows();
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < k; ++i)
          allowed_[static_cast<size_t>(t * k + i)] =
              score[t * n_ff + predicted_[static_cast<size_t>(i)]] >= r.predictor_threshold;
      *allowed = allowed_.data();
    }
  }
  cpu_predicted_ += static_cast<uint64_t>(k * n);
  *rows = predicted_.data();
  return k;
}

void HybridExecutor::run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                    int64_t n, float* out, Workspace& ws) {
  const int64_t n_embd = w.n_embd();
  const size_t l = static_cast<size_t>(layer);
  const bool share = !plan_.layers[l].gpu_neurons.empty();
  const bool device_predicts = predict_ && plan_.layer_uses_gpu(l);  // its predictor is on the device
  const FfnWeights& cpu_w = cpu_share_[l];
  const FfnShareScratch sc{act_.data(), h_.data(), active_.data(), ws.mm_scratch.data(), axpy_.data()};
  for (int64_t t0 = 0; t0 < n; t0 += popts_.max_batch) {
    const int64_t nc = std::min(popts_.max_batch, n - t0);
    const float* xc = x + t0 * n_embd;
    float* oc = out + t0 * n_embd;
    if (share || device_predicts) {
      device_->ffn_begin(layer, xc, nc, share_rule(l, act, t0, ws));
      ++device_calls_;
    }
    // The CPU's neurons meanwhile (those predicted, with predictors), into `out` directly when
    // the device has nothing here.
    const double t_cpu = now_seconds();
    const int32_t* rows = nullptr;
    const uint8_t* allowed = nullptr;
    const int64_t n_rows = cpu_rows_for(pool, l, xc, nc, t0, ws, device_predicts, &rows, &allowed);
    float* cpu_out = share ? partial_.data() : oc;
    cpu_fired_ += ffn_share_partial(pool, cpu_w, rows, n_rows, act, threshold_, xc, nc, cpu_out, sc, allowed);
    const double t_wait = now_seconds();
    cpu_ffn_s_ += t_wait - t_cpu;  // (the wait for a device prediction is in it)
    const float* dev = nullptr;
    if (share || device_predicts) {
      dev = device_->ffn_end();
      wait_s_ += now_seconds() - t_wait;
    }
    // Fixed order: CPU partial, then the device's, then the down bias.
    ffn_merge_partials(cpu_out, share ? dev : nullptr, w, oc, nc);
  }
}

namespace {
// The key of a run's calls on the device (Device::capture_begin): its layers, rows and spans,
// and whether the output head follows; never 0.
uint64_t run_key(int64_t first, int64_t end, int64_t n, std::span<const AttnSpan> spans, bool output) {
  std::string k = fmt::format("{}:{}:{}:{}", first, end, n, output);
  for (const AttnSpan& s : spans) k += fmt::format("|{},{},{}", s.seq, s.first, s.n);
  return std::hash<std::string>{}(k) | 1;
}
}  // namespace

bool HybridExecutor::cpu_takes_part(size_t l) const { return !cpu_rows_[l].empty() || !expert_on_[l].empty(); }

void HybridExecutor::run_moe(ThreadPool& pool, int64_t layer, const MoeWeights& moe, cpu::Activation act,
                             const float* x, int64_t n, float* out, Workspace& ws) {
  const size_t l = static_cast<size_t>(layer);
  const int64_t d = moe.router.cols();
  if (plan_.layers[l].gpu_experts.empty()) {  // the CPU's own mixture, whole
    const double t = now_seconds();
    moe_ffn(pool, moe, act, x, n, out, ws);
    cpu_expert_runs_ += static_cast<uint64_t>(n * moe.n_used);
    cpu_ffn_s_ += now_seconds() - t;
    return;
  }
  for (int64_t t0 = 0; t0 < n; t0 += popts_.max_batch) {
    const int64_t nc = std::min(popts_.max_batch, n - t0);
    moe_chunk(pool, l, moe, act, x + t0 * d, nc, out + t0 * d, ws);
  }
}

void HybridExecutor::moe_chunk(ThreadPool& pool, size_t l, const MoeWeights& moe, cpu::Activation act, const float* x,
                               int64_t n, float* out, Workspace& ws) {
  const int64_t d = moe.router.cols();
  const double t_cpu = now_seconds();
  const int64_t n_active = moe_route_slots(pool, moe, x, n, ws);
  const int32_t* first = ws.moe_first.data();
  const auto& on = expert_on_[l];
  int64_t n_cpu = 0, dev_slots = 0;
  for (int64_t a = 0; a < n_active; ++a) {
    const int32_t e = ws.moe_active[static_cast<size_t>(a)];
    if (on[static_cast<size_t>(e)]) dev_slots += first[e + 1] - first[e];
    else cpu_experts_[static_cast<size_t>(n_cpu++)] = e;
  }
  if (dev_slots > 0) {
    device_->experts_begin(static_cast<int64_t>(l), x, n, ws.moe_ids.data());
    ++device_calls_;
  }
  moe_expert_rows(pool, moe, act, x, n, cpu_experts_.data(), n_cpu, ws, expert_rows_.data());
  const double t_wait = now_seconds();
  cpu_ffn_s_ += t_wait - t_cpu;
  const float* dev = nullptr;
  if (dev_slots > 0) {
    dev = device_->experts_end();
    wait_s_ += now_seconds() - t_wait;
  }
  // Each chosen expert's rows where its side left them, then every token's sum in ascending order.
  int64_t cpu_row = 0, dev_row = 0;
  for (int64_t a = 0; a < n_active; ++a) {
    const int32_t e = ws.moe_active[static_cast<size_t>(a)];
    const int64_t m = first[e + 1] - first[e];
    int64_t& row = on[static_cast<size_t>(e)] ? dev_row : cpu_row;
    expert_ptrs_[static_cast<size_t>(a)] = (on[static_cast<size_t>(e)] ? dev : expert_rows_.data()) + row * d;
    row += m;
  }
  moe_merge_rows(moe, n, ws, expert_ptrs_.data(), n_active, out);
  device_expert_runs_ += static_cast<uint64_t>(dev_row);
  cpu_expert_runs_ += static_cast<uint64_t>(cpu_row);
}

void HybridExecutor::run_layers(const Model& model, ThreadPool& pool, std::span<const SeqSpan> seqs, Workspace& ws,
                           int64_t n) {
  const int64_t d = model.hp.n_embd;
  for (const SeqSpan& s : seqs)
    EMBER_CHECK(s.seq >= 0 && s.seq < pm_.n_seq, "hybrid: sequence {} of a plan for {} sequences", s.seq, pm_.n_seq);
  held_rows_ = 0;
  for (int64_t il = 0; il < model.hp.n_layer;) {
    if (!plan_.layers[static_cast<size_t>(il)].attn_gpu) {
      const double t = now_seconds();
      cpu_layer(model, il, pool, seqs, ws, n);  // its FFN through run() (ws.ffn)
      cpu_layer_s_ += now_seconds() - t;
      ++il;
      continue;
    }
    // A run of layers whose attention is on the device: the hidden state goes there once and
    // comes back once, in chunks of at most max_batch tokens (what the device's buffers hold;
    // a chunk passes every layer of the run before the next starts, which attends over the
    // earlier chunk's keys and values). A layer whose neurons are all on the device runs there
    // whole; one with CPU neurons sends its FFN input to the host once and takes the CPU's
    // partial output back, merged there.
    int64_t end = il;
    bool resident = true;  // nothing of the run for the CPU: one queued sequence, one wait
    for (; end < model.hp.n_layer && plan_.layers[static_cast<size_t>(end)].attn_gpu; ++end)
      resident = resident && !cpu_takes_part(static_cast<size_t>(end));
    // With the output head there too, the last run's hidden state stays for it (output()).
    const bool output_follows = plan_.output_gpu && end == model.hp.n_layer && n <= popts_.max_batch;
    for (int64_t t0 = 0; t0 < n; t0 += popts_.max_batch) {
      const int64_t nc = std::min(popts_.max_batch, n - t0);
      // The sequences' rows in this chunk, renumbered from its first row.
      chunk_spans_.clear();
      for (const SeqSpan& s : seqs) {
        const int64_t a = std::max(s.first, t0), b = std::min(s.first + s.n, t0 + nc);
        if (a < b) chunk_spans_.push_back({s.seq, a - t0, b - a, s.pos0 + (a - s.first)});
      }
      double t = now_seconds();
      // Decode steps (a few rows) of a resident run are captured once and replayed.
      if (resident && nc <= kCaptureRows) device_->capture_begin(run_key(il, end, nc, chunk_spans_, output_follows));
      device_->put_hidden(ws.x.data() + t0 * d, nc, chunk_spans_);
      for (int64_t l = il; l < end; ++l) {
        const size_t li = static_cast<size_t>(l);
        device_->attention(l, chunk_spans_, nc);
        const bool cpu_part = cpu_takes_part(li);
        const ShareRule rule = share_rule(li, model.hp.act, t0, ws);
        device_->ffn_block_begin(l, nc, rule, cpu_part);
        ++device_calls_;
        if (!cpu_part) {
          device_->ffn_block_end(l, nullptr, nc);
          continue;
        }
        const float* xn = device_->ffn_host_input();
        const double t_cpu = now_seconds();
        device_block_s_ += t_cpu - t;
        if (model.layers[li].moe.valid()) {  // the mixture on the host, its device experts there
          run_moe(pool, l, model.layers[li].moe, model.hp.act, xn, nc, ws.o.data(), ws);
          t = now_seconds();
          device_->ffn_block_end(l, ws.o.data(), nc);
          continue;
        }
        const int32_t* rows = nullptr;
        const uint8_t* allowed = nullptr;
        const int64_t n_rows = cpu_rows_for(pool, li, xn, nc, t0, ws, predict_, &rows, &allowed);
        const FfnShareScratch sc{act_.data(), h_.data(), active_.data(), ws.mm_scratch.data(), axpy_.data()};
        cpu_fired_ += ffn_share_partial(pool, cpu_share_[li], rows, n_rows, model.hp.act, threshold_, xn, nc,
                                        ws.o.data(), sc, allowed);
        t = now_seconds();
        cpu_ffn_s_ += t - t_cpu;
        device_->ffn_block_end(l, ws.o.data(), nc);
      }
      device_->get_hidden(ws.x.data() + t0 * d, nc);
      if (output_follows) {
        held_rows_ = nc;  // output() queues the head and waits once for both
      } else {
        device_->sync();
      }
      device_block_s_ += now_seconds() - t;
    }
    il = end;
  }
}

void HybridExecutor::sync_hidden() {
  if (held_rows_ > 0) device_->sync();
  held_rows_ = 0;
}

bool HybridExecutor::output(const Model& model, ThreadPool& pool, Workspace& ws, const int64_t* rows, int64_t n_rows,
                       float* logits) {
  if (!plan_.output_gpu) return false;
  const int64_t d = model.hp.n_embd, nv = model.hp.n_vocab;
  const double t = now_seconds();
  // The rows of the hidden state the device still holds: the head on them, one wait for both.
  bool identity = n_rows == held_rows_;
  for (int64_t i = 0; identity && rows && i < n_rows; ++i) identity = rows[i] == i;
  if (held_rows_ > 0 && identity) {
    device_->output(n_rows, logits);
    device_->sync();
    held_rows_ = 0;
    device_block_s_ += now_seconds() - t;
    return true;
  }
  sync_hidden();  // the hidden state to the host first
  for (int64_t i0 = 0; i0 < n_rows; i0 += popts_.max_batch) {
    const int64_t nc = std::min(popts_.max_batch, n_rows - i0);
    float* staged = ws.o.data();  // free after the last layer (as output_rows uses it)
    for (int64_t i = 0; i < nc; ++i) {
      const int64_t r = rows ? rows[i0 + i] : i0 + i;
      std::memcpy(staged + i * d, ws.x.data() + r * d, sizeof(float) * static_cast<size_t>(d));
    }
    device_->put_hidden(staged, nc, {});
    device_->output(nc, logits + i0 * nv);
    device_->sync();
  }
  device_block_s_ += now_seconds() - t;
  return true;
}

}  // namespace ember
