#include "sparse/ffn_sparse.hpp"

#include <cmath>
#include <cstring>

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "ops/cpu/activation.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/nm4/nm4.hpp"
#include "ops/cpu/r16/r16.hpp"
#include "ops/cpu/vec.hpp"
#include "sparse/predictor.hpp"

namespace ember {

namespace {
constexpr EnumName<FfnMode> kFfnModes[] = {{FfnMode::dense, "dense"},
                                          {FfnMode::oracle, "oracle"},
                                          {FfnMode::threshold, "threshold"},
                                          {FfnMode::predictor, "predictor"},
                                          {FfnMode::input, "input"}};
}  // namespace

FfnMode parse_ffn_mode(const std::string& s) { return parse_enum(kFfnModes, s, "sparse mode"); }

cpu::NeuronMajorType default_copy_type(FfnMode mode) {
  return mode == FfnMode::input ? cpu::NeuronMajorType::compact : cpu::NeuronMajorType::exact;
}

const char* ffn_mode_name(FfnMode m) {
  switch (m) {
    case FfnMode::oracle: return "oracle";
    case FfnMode::threshold: return "threshold";
    case FfnMode::predictor: return "predictor";
    case FfnMode::input: return "input";
    default: return "dense";
  }
}

double FfnSparsityStats::sparsity() const {
  uint64_t n = 0, a = 0;
  for (size_t l = 0; l < neurons.size(); ++l) n += neurons[l], a += active[l];
  return n == 0 ? 0.0 : 1.0 - static_cast<double>(a) / static_cast<double>(n);
}

double FfnSparsityStats::layer_sparsity(size_t l) const {
  return neurons[l] == 0 ? 0.0 : 1.0 - static_cast<double>(active[l]) / static_cast<double>(neurons[l]);
}

SparseFfn::SparseFfn(const Model& model, ThreadPool& pool, const SparseFfnOptions& opts, int64_t max_batch)
    : model_(model), opts_(opts) {
  EMBER_CHECK(ffn_mode_gathers_rows(opts.mode),
              "SparseFfn: mode {} is not a neuron-sparse FFN mode", ffn_mode_name(opts.mode));
  EMBER_CHECK(std::isfinite(opts.threshold) && opts.threshold >= 0.0f, "sparse threshold must be >= 0, got {}",
              opts.threshold);
  const Hparams& hp = model.hp;
  if (opts.mode == FfnMode::threshold) {
    EMBER_CHECK(!opts.layer_thresholds.empty(),
                "sparse mode threshold needs per-layer thresholds: give --sparse-profile FILE --sparsity S (a profile "
                "from `ember profile`) or use a model prepared with `ember prepare --sparsity`");
    EMBER_CHECK(static_cast<int64_t>(opts.layer_thresholds.size()) == hp.n_layer,
                "{} per-layer thresholds for a model of {} layers (profile or thresholds of another model?)",
                opts.layer_thresholds.size(), hp.n_layer);
    for (float t : opts.layer_thresholds)
      EMBER_CHECK(std::isfinite(t) && t >= 0.0f, "per-layer threshold {} is not a finite value >= 0", t);
  }
  EMBER_CHECK(opts.mode != FfnMode::predictor || has_predictors(model),
              "sparse mode predictor needs a predictor for every layer: pass --predictor FILE (made by "
              "`ember train-predictor`) or a sparse-ready model with fc1/fc2 tensors");
  Timer timer;
  down_nm_.reserve(model.layers.size());
  for (const LayerWeights& L : model.layers) {
    if (L.ffn.down_t.valid()) {  // the file's own neuron-major down (PowerInfer's layout): no copy
      down_nm_.emplace_back();
      down_nm_.back().view = L.ffn.down_t;
      continue;
    }
    EMBER_CHECK(model.resident_weight_budget == 0,
                "{} is larger than its memory budget and has no neuron-major down (ffn_down_t), whose copy would "
                "take {:.1f} MiB more a layer: write it into the file once with `ember prepare` (or `ember "
                "sparsify`), or give a larger --mem-budget",
                model.file->path(), L.ffn.down.nbytes / 1048576.0);
    const DType t = cpu::neuron_major_dtype(L.ffn.down.type, opts.down_type, hp.n_embd, /*shared_scales=*/true);
    down_nm_.push_back(cpu::make_neuron_major(pool, L.ffn.down, t));
  }
  active_.resize(static_cast<size_t>(hp.n_ff));
  if (model.resident_weight_budget > 0) {
    map_reads_ = std::make_unique<MapReads>(*model.file);
    map_ids_.resize(static_cast<size_t>(hp.n_ff));
  }
  const int64_t batch = std::min(max_batch, kDenseBatch - 1);
  axpy_scratch_.resize(cpu::sparse_axpy_scratch_floats(hp.n_embd, batch, pool.size(), opts.split));
  stats_.neurons.assign(model.layers.size(), 0);
  stats_.active.assign(model.layers.size(), 0);
  stats_.predicted.assign(model.layers.size(), 0);
  if (opts.mode == FfnMode::predictor) {
    predicted_.resize(static_cast<size_t>(hp.n_ff));
    // Mirrored predictors run at half rank (one buffer for all layers' fc2 halves).
    std::vector<int64_t> half(model.layers.size());
    std::vector<size_t> at(model.layers.size() + 1, 0);  // each layer's place in pred_halves_ (64-byte aligned)
    for (size_t l = 0; l < model.layers.size(); ++l) {
      const FfnWeights& f = model.layers[l].ffn;
      half[l] = opts.mirrored_predictors ? mirrored_half(f.fc1, f.fc2) : 0;
      at[l + 1] = at[l] + (half[l] > 0 ? (half_columns_bytes(f.fc2, half[l]) + 63) / 64 * 64 : 0);
    }
    pred_halves_ = AlignedBuffer<uint8_t>(at.back());
    pred_.resize(model.layers.size());
    size_t n_mirrored = 0;
    for (size_t l = 0; l < model.layers.size(); ++l) {
      const FfnWeights& f = model.layers[l].ffn;
      if (half[l] == 0) {
        pred_[l] = {f.fc1, f.fc2, false};
        continue;
      }
      pred_[l] = {first_rows(f.fc1, half[l]), copy_half_columns(f.fc2, half[l], pred_halves_.data() + at[l]), true};
      repack_for_decode(pred_[l].fc2);
      ++n_mirrored;
    }
    if (n_mirrored > 0)
      log_info("predictor: {} of {} layers mirrored (hidden units in pairs of opposite sign): run at half rank, {:.2f} "
               "MiB fewer bytes per token", n_mirrored, model.layers.size(), predictor_bytes(model) / 1048576.0 -
               predictor_run_bytes() / 1048576.0);
    int64_t max_rank = 1;
    size_t mm = 64;
    for (const LayerPredictorRun& P : pred_) {
      max_rank = std::max(max_rank, P.fc1.rows());
      mm = std::max(mm, predictor_mm_scratch_bytes(P.fc1, P.fc2, batch));
    }
    pred_scratch_.resize(predictor_scratch_floats(max_rank, hp.n_ff, batch));
    pred_mm_scratch_.resize(mm);
  }
  fused_threads_ = pool.size();
  const size_t per_thread = static_cast<size_t>(2 * hp.n_ff) * static_cast<size_t>(fused_threads_);
  fused_ids_.resize(per_thread);
  fused_vals_.resize(per_thread);
  partial_stride_ = static_cast<size_t>((hp.n_embd + 15) / 16 * 16);
  fused_partials_.resize(partial_stride_ * static_cast<size_t>(std::max(fused_threads_ - 1, 1)));
  thread_counts_.resize(3 * static_cast<size_t>(fused_threads_));
  if (opts.mode == FfnMode::predictor) {
    size_t hq = 64;
    for (const LayerPredictorRun& P : pred_) hq = std::max(hq, cpu::matmul_scratch_bytes(P.fc2.type, P.fc2.cols(), 1));
    hq_stride_ = (hq + 63) / 64 * 64;
    fused_hq_.resize(hq_stride_ * static_cast<size_t>(fused_threads_));
  }
  log_info("sparse FFN: mode {}, threshold {}, neuron-major down copies ({} from {}) {:.1f} MiB extra, built in {:.2f} s",
           ffn_mode_name(opts.mode),
           opts.mode == FfnMode::threshold ? std::string("per layer") : fmt::format("{}", opts.threshold),
           down_nm_.empty() ? "-" : std::string(dtype_name(down_nm_[0].view.type)),
           model.layers.empty() || !model.layers[0].ffn.down.valid() ? "ffn_down_t"
                                                                       : std::string(dtype_name(model.layers[0].ffn.down.type)),
           neuron_major_bytes() / 1048576.0, timer.seconds());
}

size_t SparseFfn::predictor_run_bytes() const {
  size_t b = 0;
  for (const LayerPredictorRun& P : pred_) b += P.fc1.nbytes + P.fc2.nbytes;
  return b;
}

size_t SparseFfn::neuron_major_bytes() const {
  size_t b = 0;
  for (const auto& m : down_nm_) b += m.bytes.size();  // copies only; a file's down_t is mapped
  return b;
}

size_t SparseFfn::bytes() const {
  return neuron_major_bytes() + (active_.size() + predicted_.size() + fused_ids_.size()) * sizeof(int32_t) +
         (axpy_scratch_.size() + pred_scratch_.size() + fused_vals_.size() + fused_partials_.size()) * sizeof(float) +
         pred_mm_scratch_.size() + fused_hq_.size() + pred_halves_.size();
}

double SparseFfn::weight_bytes_per_token() const {
  const int64_t n_ff = model_.hp.n_ff;
  double total = static_cast<double>(model_.weight_bytes_per_token()), seen = 0;
  for (size_t l = 0; l < model_.layers.size(); ++l) {
    const FfnWeights& w = model_.layers[l].ffn;
    const double tokens = static_cast<double>(stats_.neurons[l]) / static_cast<double>(n_ff);
    if (tokens <= 0) continue;
    seen += tokens;
    const double gate_rows =
        opts_.mode == FfnMode::predictor ? static_cast<double>(stats_.predicted[l]) : static_cast<double>(stats_.neurons[l]);
    const size_t down_bytes = w.down.valid() ? w.down.nbytes : w.down_t.nbytes;
    total -= static_cast<double>(w.gate.nbytes + w.up.nbytes + down_bytes);
    if (opts_.mode == FfnMode::predictor) total += static_cast<double>(pred_[l].fc1.nbytes + pred_[l].fc2.nbytes);
    // A shared-scale copy's tables: counted whole (read whenever a block of 32 neurons has one
    // firing, which is nearly all blocks at the sparsities it is chosen for).
    const TensorView& nm = down_nm_[l].view;
    if (cpu::is_nm4(nm.type)) total += static_cast<double>(cpu::nm4_table_bytes(nm.type, nm.rows(), nm.cols()));
    total += (gate_rows * static_cast<double>(w.gate.valid() ? w.gate.row_size() : 0) +
              static_cast<double>(stats_.active[l]) * static_cast<double>(w.up.row_size() + down_nm_[l].view.row_size())) /
             tokens;
  }
  return seen > 0 ? total : 0.0;
}

void SparseFfn::reset_stats() {
  std::fill(stats_.neurons.begin(), stats_.neurons.end(), 0);
  std::fill(stats_.active.begin(), stats_.active.end(), 0);
  std::fill(stats_.predicted.begin(), stats_.predicted.end(), 0);
  stats_.dense_tokens = 0;
}

void SparseFfn::run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                    int64_t n, float* out, Workspace& ws) {
  void* mm = ws.mm_scratch.data();
  const float thr = opts_.mode == FfnMode::threshold ? opts_.layer_thresholds[static_cast<size_t>(layer)]
                                                     : opts_.threshold;
  const int64_t n_ff = w.n_ff();
  if (map_reads_ && n >= kDenseBatch) map_reads_->all({&w.gate, &w.up, &w.down, &down_nm_[layer].view});
  if (n >= kDenseBatch && opts_.mode == FfnMode::predictor) return run_predicted_dense(pool, layer, w, act, x, n, out, ws);
  if (n >= kDenseBatch) {
    if (thr == 0.0f) {  // exact: dropping act(gate) == 0 changes nothing
      dense_ffn(pool, w, act, x, n, out, ws);
      stats_.dense_tokens += static_cast<uint64_t>(n);
      return;
    }
    // Thresholded (threshold mode on a SwiGLU/GeGLU model): the dense kernels, the silent
    // neurons' firing values zeroed.
    float* a = ffn_firing_all(pool, w, act, x, n, ws);
    uint64_t n_active = 0;
    for (int64_t i = 0; i < n * n_ff; ++i) {
      if (std::fabs(a[i]) > thr)
        ++n_active;
      else
        a[i] = 0.0f;
    }
    stats_.neurons[layer] += static_cast<uint64_t>(n * n_ff);
    stats_.active[layer] += n_active;
    ffn_down_all(pool, w, ffn_values_all(pool, w, act, x, n, ws), n, out, ws);
    stats_.dense_tokens += static_cast<uint64_t>(n);
    return;
  }
  if (n == 1 && fused_ && run_decode_fused(pool, layer, w, act, x, out, ws)) return;
  if (opts_.mode == FfnMode::predictor) return run_predicted(pool, layer, w, act, x, n, out, ws);
  // a = [n][n_ff]: the firing values (model/ffn.hpp), zero where inactive.
  float* a = ws.gate.data();
  if (map_reads_) map_reads_->all({&w.firing_matrix()});
  cpu::matmul(pool, w.firing_matrix(), x, n, a, mm);
  ffn_firing_values(w, act, a, n, n_ff, n_ff, nullptr);

  // The active set: neurons active for at least one token of the batch (their values moved to
  // the front of each row of a).
  uint64_t n_active_tokens = 0;
  const int64_t na = ffn_keep_firing(a, n, n_ff, nullptr, thr, active_.data(), n_active_tokens);
  stats_.neurons[layer] += static_cast<uint64_t>(n * n_ff);
  stats_.active[layer] += n_active_tokens;
  up_down(pool, layer, w, act, x, n, a, n_ff, na, out, ws);
}

void SparseFfn::repack_for_decode(TensorView& fc2) {
  // fc2's rows are short (a block or two), so the row-by-row kernel spends its time on each
  // row's horizontal sum; repacked 16 rows at a time they cost a quarter of it. Decode computes
  // it in blocks of kNeuronBlock rows, batches whole (both multiples of 16).
  const DType r16 = cpu::r16_type(fc2.type);
  if (!cpu::r16_pays(fc2.type) || fc2.rows() % cpu::kR16Rows != 0 ||
      fc2.cols() % info(fc2.type).block_size != 0)
    return;
  std::vector<uint8_t> plain(fc2.data, fc2.data + fc2.nbytes);
  cpu::repack_r16(fc2.type, plain.data(), fc2.rows(), fc2.cols(), const_cast<uint8_t*>(fc2.data));
  fc2.type = r16;
}

const float* SparseFfn::predictor_input(const float* x, const Workspace& ws) const {
  if (!model_.predictor_on_residual) return x;
  EMBER_CHECK(ws.ffn_residual, "predictor: this model's predictor reads the residual stream, which the forward pass "
              "did not provide");
  return ws.ffn_residual;
}

void SparseFfn::run_predicted(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act,
                              const float* x, int64_t n, float* out, Workspace& ws) {
  const float pthr = predictor_threshold(model_, layer);
  const LayerPredictorRun& P = pred_[static_cast<size_t>(layer)];
  const int64_t np = predict_active(pool, P.fc1, P.fc2, pthr, predictor_input(x, ws), n, pred_scratch_.data(),
                                    pred_mm_scratch_.data(), predicted_.data(), P.linear);
  // The firing values of the predicted rows only (model/ffn.hpp), each token's kept only where
  // its own prediction names the neuron (the union is what is gathered): a batch computes
  // what its tokens would decode one by one.
  float* g = ws.gate.data();
  const bool whole = map_reads_ && read_whole_bundles(layer, w, down_nm_[layer].view);
  if (whole)
    map_reads_->rows({&w.gate, &w.up, &down_nm_[layer].view}, predicted_.data(), np,
                     model_.hot_neurons_of(static_cast<size_t>(layer)));
  else if (map_reads_)
    map_reads_->rows({&w.firing_matrix()}, predicted_.data(), np, model_.hot_neurons_of(static_cast<size_t>(layer)));
  cpu::gather_matmul(pool, w.firing_matrix(), x, n, predicted_.data(), np, g, np, ws.mm_scratch.data());
  ffn_firing_values(w, act, g, n, np, np, predicted_.data());
  if (n > 1) {
    const float* score = pred_scratch_.data();  // predict_active's scores, [n][n_ff]
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < np; ++i)
        if (score[t * P.fc2.rows() + predicted_[static_cast<size_t>(i)]] < pthr) g[t * np + i] = 0.0f;
  }
  // Keep the predicted neurons that fire for some token.
  uint64_t n_active_tokens = 0;
  const int64_t na = ffn_keep_firing(g, n, np, predicted_.data(), opts_.threshold, active_.data(), n_active_tokens);
  stats_.neurons[layer] += static_cast<uint64_t>(n * down_nm_[layer].view.rows());
  stats_.active[layer] += n_active_tokens;
  stats_.predicted[layer] += static_cast<uint64_t>(n * np);
  up_down(pool, layer, w, act, x, n, g, np, na, out, ws, !whole);
}

void SparseFfn::run_predicted_dense(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act,
                                    const float* x, int64_t n, float* out, Workspace& ws) {
  // A long batch: the dense kernels (nearly every neuron is predicted for some token), each
  // token's firing values zeroed where its own prediction does not name the neuron, as decode
  // would compute it; the predictor runs in slices of the batch its scratch holds.
  const int64_t n_ff = w.n_ff(), n_embd = w.n_embd();
  const float pthr = predictor_threshold(model_, layer);
  const LayerPredictorRun& P = pred_[static_cast<size_t>(layer)];
  float* a = ffn_firing_all(pool, w, act, x, n, ws);
  const float* px = predictor_input(x, ws);
  uint64_t n_active = 0, n_predicted = 0;
  for (int64_t t0 = 0; t0 < n; t0 += kDenseBatch - 1) {
    const int64_t nc = std::min(kDenseBatch - 1, n - t0);
    predict_active(pool, P.fc1, P.fc2, pthr, px + t0 * n_embd, nc, pred_scratch_.data(), pred_mm_scratch_.data(),
                   predicted_.data(), P.linear);
    const float* score = pred_scratch_.data();
    for (int64_t t = 0; t < nc; ++t) {
      float* at = a + (t0 + t) * n_ff;
      for (int64_t j = 0; j < n_ff; ++j) {
        const bool predicted = score[t * n_ff + j] >= pthr;
        n_predicted += predicted;
        if (predicted && std::fabs(at[j]) > opts_.threshold) ++n_active;
        else at[j] = 0.0f;
      }
    }
  }
  stats_.neurons[layer] += static_cast<uint64_t>(n * n_ff);
  stats_.active[layer] += n_active;
  stats_.predicted[layer] += n_predicted;
  stats_.dense_tokens += static_cast<uint64_t>(n);
  ffn_down_all(pool, w, ffn_values_all(pool, w, act, x, n, ws), n, out, ws);
}

std::string SparseFfn::refusal(const Model&) const {
  // Every gating and bias runs through the rule of model/ffn.hpp; the predictor's presence and
  // the thresholds are checked when the executor is made.
  return {};
}

bool SparseFfn::read_whole_bundles(int64_t layer, const FfnWeights& w, const TensorView& down_nm) const {
  const size_t l = static_cast<size_t>(layer);
  return opts_.mode == FfnMode::predictor && w.rows_bundled() && down_nm.data == w.down_t.data &&
         2 * stats_.active[l] >= stats_.predicted[l];
}

bool SparseFfn::run_decode_fused(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act,
                                 const float* x, float* out, Workspace& ws) {
  // The par rule of model/ffn.hpp (h = act(gate) * up, no up bias) computed inline by the fused
  // kernels; every other gating takes the separate steps. The gate may be repacked
  // (ops/cpu/r16/r16.hpp) while up stays gatherable: one quantization of x serves both as long as
  // they come from the same file type.
  if (w.gating != FfnGating::par || w.up_b.valid() || !w.gate.valid() ||
      cpu::r16_base(w.gate.type) != cpu::r16_base(w.up.type) ||
      pool.size() > fused_threads_ || (map_reads_ && opts_.mode != FfnMode::predictor) ||
      (opts_.mode == FfnMode::predictor && pred_[static_cast<size_t>(layer)].fc1.rows() > w.gate.rows()))
    return false;
  const bool predicted = opts_.mode == FfnMode::predictor;
  const LayerPredictorRun* P = predicted ? &pred_[static_cast<size_t>(layer)] : nullptr;
  const float thr = opts_.mode == FfnMode::threshold ? opts_.layer_thresholds[static_cast<size_t>(layer)]
                                                     : opts_.threshold;
  const TensorView& down_nm = down_nm_[layer].view;
  const int64_t n_ff = down_nm.rows(), n_embd = down_nm.cols();
  const int64_t n_blocks = (n_ff + kNeuronBlock - 1) / kNeuronBlock;
  float pthr = 0.0f;
  int64_t rank = 0;
  if (predicted) {
    pthr = predictor_threshold(model_, layer);
    rank = P->fc1.rows();
    cpu::quantize_activations(P->fc1.type, predictor_input(x, ws), 1, P->fc1.cols(), pred_mm_scratch_.data());
  }
  void* xq = ws.mm_scratch.data();
  cpu::quantize_activations(w.gate.type, x, 1, n_embd, xq);
  float* gate_all = ws.gate.data();  // oracle / threshold: act(gate) of every neuron
  float* hidden = pred_scratch_.data();
  float* score = hidden + (rank + 15) / 16 * 16;
  const auto list_of = [&](int t) { return fused_ids_.data() + static_cast<size_t>(2 * n_ff) * static_cast<size_t>(t); };
  const bool whole = map_reads_ && read_whole_bundles(layer, w, down_nm);
  pool.run([&](int ith, int nth) {
    int32_t* own = list_of(ith);  // step 1's finds
    float* val = fused_vals_.data() + static_cast<size_t>(2 * n_ff) * static_cast<size_t>(ith);
    float* hval = val + n_ff;
    // Step 1: the predicted neurons (after the predictor's hidden layer, split by rows, and a
    // barrier), or act(gate) of every neuron and the firing ones, by blocks of kNeuronBlock.
    int64_t n_own = 0;
    if (predicted) {
      int64_t h0, h1;
      split_range(rank, ith, nth, h0, h1);
      if (h1 > h0) cpu::matmul_rows(P->fc1, pred_mm_scratch_.data(), 1, h0, h1, hidden + h0, rank);
      pool.barrier();
      // Every thread quantizes the whole hidden row (rank values) for itself: cheaper than
      // another wait.
      for (int64_t i = 0; i < rank; ++i) hval[i] = P->linear ? hidden[i] : std::max(hidden[i], 0.0f);
      void* hq = fused_hq_.data() + hq_stride_ * static_cast<size_t>(ith);
      cpu::quantize_activations(P->fc2.type, hval, 1, rank, hq);
      // A contiguous range of blocks per thread (one stream the prefetchers follow): step 2
      // deals the candidates out anyway.
      int64_t b0, b1;
      split_range(n_blocks, ith, nth, b0, b1);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * kNeuronBlock, r1 = std::min(n_ff, r0 + kNeuronBlock);
        cpu::matmul_rows(P->fc2, hq, 1, r0, r1, score + r0, n_ff);
        for (int64_t j = r0; j < r1; ++j) {  // branch-free: a quarter or so pass, at random
          own[n_own] = static_cast<int32_t>(j);
          n_own += score[j] >= pthr ? 1 : 0;
        }
      }
    } else {
      size_t x_stride = 0;
      const void* xp = cpu::prepare_activations(w.gate.type, xq, 1, n_embd, &x_stride);
      for (int64_t b = ith; b < n_blocks; b += nth) {
        const int64_t r0 = b * kNeuronBlock, r1 = std::min(n_ff, r0 + kNeuronBlock);
        cpu::matmul_rows_prepared(w.gate, xp, x_stride, 1, r0, r1, gate_all + r0, n_ff);
        cpu::activation_inplace(act, gate_all + r0, r1 - r0);
        for (int64_t j = r0; j < r1; ++j) {
          own[n_own] = static_cast<int32_t>(j);
          n_own += std::fabs(gate_all[j]) > thr ? 1 : 0;
        }
      }
    }
    // Step 2. Predictor mode: the candidates of all threads, dealt out round robin in chunks of
    // kDealChunk after a barrier, so that the gate gathers are balanced by count (the share is
    // a like mix of hot and cold neurons, which fire about as often as their neighbours in the
    // hot-first order). Otherwise the firing neurons of the thread's own blocks: their counts
    // are already even, and a barrier would cost more than it saves.
    int32_t* share = own;
    int64_t ns = n_own;
    if (predicted) {
      thread_counts_[3 * ith] = static_cast<uint64_t>(n_own);
      pool.barrier();
      share = own + n_ff;
      ns = 0;
      int64_t chunk = 0, in_chunk = 0, last_block = -1;
      for (int t = 0; t < nth; ++t) {
        const int32_t* list = list_of(t);
        const int64_t n = static_cast<int64_t>(thread_counts_[3 * t]);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t block = list[i] / cpu::kNm4Block;
          if (in_chunk >= kDealChunk && block != last_block) ++chunk, in_chunk = 0;
          last_block = block;
          ++in_chunk;
          share[ns] = list[i];
          ns += chunk % nth == ith ? 1 : 0;
        }
      }
    }
    // Rows left in the file's map are read before a kernel faults on them, many at once: every
    // candidate's gate row here, the firing ones' up and down rows below.
    // Each thread's list: its candidates at list_of(t) (count in thread_counts_[3 t]), its firing
    // share at list_of(t) + n_ff (count in thread_counts_[3 t + 2]).
    const auto read_rows = [&](std::initializer_list<const TensorView*> ws, int64_t at, int count_at) {
      if (ith == 0) {
        int64_t nc = 0;
        for (int t = 0; t < nth; ++t) {
          const int64_t n = static_cast<int64_t>(thread_counts_[3 * t + count_at]);
          std::copy(list_of(t) + at, list_of(t) + at + n, map_ids_.data() + nc);
          nc += n;
        }
        map_reads_->rows(ws, map_ids_.data(), nc, model_.hot_neurons_of(static_cast<size_t>(layer)));
      }
      pool.barrier();
    };
    if (map_reads_) {
      if (whole) read_rows({&w.gate, &w.up, &down_nm}, 0, 0);
      else read_rows({&w.gate}, 0, 0);
    }
    int64_t nf = 0;  // the firing neurons of the share, moved to its front, act(gate) in val
    if (predicted) {
      cpu::gather_matmul_rows(w.gate, xq, 1, share, ns, val, ns);
      cpu::activation_inplace(act, val, ns);
      for (int64_t c = 0; c < ns; ++c) {  // in place (nf <= c), branch-free
        share[nf] = share[c], val[nf] = val[c];
        nf += std::fabs(val[c]) > thr ? 1 : 0;
      }
    } else {
      for (int64_t c = 0; c < ns; ++c) val[c] = gate_all[share[c]];
      nf = ns;
    }
    // H = up * act(gate), then the down rows: thread 0 into out, the others into their partial
    // sums.
    if (map_reads_ && !whole) {
      thread_counts_[3 * ith + 2] = static_cast<uint64_t>(nf);
      pool.barrier();
      read_rows({&w.up, &down_nm}, n_ff, 2);
    }
    float* part = ith == 0 ? out : fused_partials_.data() + static_cast<size_t>(ith - 1) * partial_stride_;
    std::memset(part, 0, sizeof(float) * static_cast<size_t>(n_embd));
    cpu::sparse_up_down_rows(w.up, xq, down_nm, share, nf, val, hval, part,
                             axpy_scratch_.data() + static_cast<size_t>(ith) * partial_stride_);
    thread_counts_[3 * ith + 1] = static_cast<uint64_t>(predicted ? ns : 0);
    thread_counts_[3 * ith + 2] = static_cast<uint64_t>(nf);
  });
  // The partial sums in thread order (deterministic for a thread count).
  const int nth = pool.size();
  uint64_t n_pred = 0, na = 0;
  for (int th = 0; th < nth; ++th) n_pred += thread_counts_[3 * th + 1], na += thread_counts_[3 * th + 2];
  for (int th = 1; th < nth; ++th)
    cpu::add_f32(fused_partials_.data() + static_cast<size_t>(th - 1) * partial_stride_, out, n_embd);
  stats_.neurons[layer] += static_cast<uint64_t>(n_ff);
  stats_.active[layer] += na;
  if (predicted) stats_.predicted[layer] += n_pred;
  ffn_add_down_bias(w, out, 1);
  return true;
}

void SparseFfn::up_down(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                        int64_t n, const float* g, int64_t g_stride, int64_t na, float* out, Workspace& ws,
                        bool read_rows) {
  const TensorView& down_nm = down_nm_[layer].view;
  const int64_t n_embd = down_nm.cols();
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * n_embd));
  if (na > 0) {
    if (map_reads_ && read_rows)
      map_reads_->rows({&w.up, &down_nm}, active_.data(), na, model_.hot_neurons_of(static_cast<size_t>(layer)));
    // The active neurons' values (model/ffn.hpp): up gathered for them where the rule needs it.
    float* h = ws.up.data();
    if (ffn_needs_up(w)) cpu::gather_matmul(pool, w.up, x, n, active_.data(), na, h, na, ws.mm_scratch.data());
    ffn_neuron_values(w, act, g, g_stride, h, na, n, na, active_.data());
    cpu::sparse_axpy(pool, down_nm, active_.data(), na, h, n, na, out, n_embd, axpy_scratch_.data(), opts_.split);
  }
  ffn_add_down_bias(w, out, n);
}

}  // namespace ember
