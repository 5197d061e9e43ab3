#include "sparse/input_sparse.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "model/blocks.hpp"
#include "ops/cpu/nm4.hpp"

namespace ember {

static_assert(std::is_same_v<InputThresholds::value_type, decltype(Model::input_thresholds)::value_type>,
              "Model::input_thresholds holds one threshold per input site");

const char* input_site_name(int site) {
  static const char* names[kInputSites] = {"attn_in", "attn_out", "ffn_in", "ffn_hidden"};
  EMBER_CHECK(site >= 0 && site < kInputSites, "no input site {}", site);
  return names[site];
}

InputSiteMatrices input_site_matrices(const LayerWeights& L) {
  InputSiteMatrices m;
  m.site[0] = {&L.wq, &L.wk, &L.wv};
  m.site[1] = {&L.wo};
  m.site[2] = {&L.ffn.firing_matrix()};
  if (ffn_needs_up(L.ffn)) m.site[2].push_back(&L.ffn.up);
  m.site[3] = {L.ffn.down.valid() ? &L.ffn.down : &L.ffn.down_t};
  return m;
}

std::array<double, kInputSites> input_site_weights(const LayerWeights& L) {
  const InputSiteMatrices m = input_site_matrices(L);
  std::array<double, kInputSites> w{};
  for (int s = 0; s < kInputSites; ++s)
    for (const TensorView* t : m.site[s]) w[s] += static_cast<double>(t->n_elements());
  return w;
}

int64_t select_inputs(const float* x, int64_t n, float threshold, int32_t* ids, float* vals) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {  // branch-free: about half pass, at random
    ids[k] = static_cast<int32_t>(i);
    vals[k] = x[i];
    k += std::fabs(x[i]) > threshold ? 1 : 0;
  }
  return k;
}

double InputSparsityStats::sparsity(int site) const {
  uint64_t s = 0, k = 0;
  for (size_t l = 0; l < seen.size(); ++l) s += seen[l][site], k += kept[l][site];
  return s == 0 ? 0.0 : 1.0 - static_cast<double>(k) / static_cast<double>(s);
}

double InputSparsityStats::sparsity() const {
  double w = 0, d = 0;
  for (int s = 0; s < kInputSites; ++s) w += site_weights[s], d += site_weights[s] * sparsity(s);
  return w > 0 ? d / w : 0.0;
}

namespace {

// The input-channel-major copy of W (ne[0] = n_in, ne[1] = n_out): one row of n_out per input.
cpu::NeuronMajorMatrix channel_major_copy(ThreadPool& pool, const TensorView& W, cpu::NeuronMajorType choice) {
  const DType t = cpu::neuron_major_dtype(W.type, choice, W.rows(), /*shared_scales=*/true);
  return cpu::make_neuron_major(pool, W, t);
}

}  // namespace

InputSparseExecutor::InputSparseExecutor(const Model& model, ThreadPool& pool, InputThresholds thresholds,
                                         cpu::NeuronMajorType copy_type, int64_t max_batch)
    : model_(model), thr_(std::move(thresholds)) {
  const Hparams& hp = model.hp;
  EMBER_CHECK(static_cast<int64_t>(thr_.size()) == hp.n_layer,
              "input sparsity: thresholds for {} layers, the model has {} (a profile of another model?)", thr_.size(),
              hp.n_layer);
  for (const auto& t : thr_)
    for (float v : t) EMBER_CHECK(std::isfinite(v), "input sparsity: threshold {} is not finite", v);
  const std::string why = refusal(model);
  EMBER_CHECK(why.empty(), "{}", why);
  Timer timer;
  int64_t widest_in = hp.n_embd, widest_out = hp.n_embd;
  copies_.reserve(model.layers.size());
  for (const LayerWeights& L : model.layers) {
    LayerCopies c;
    c.wq = channel_major_copy(pool, L.wq, copy_type);
    c.wk = channel_major_copy(pool, L.wk, copy_type);
    c.wv = channel_major_copy(pool, L.wv, copy_type);
    c.wo = channel_major_copy(pool, L.wo, copy_type);
    c.fire = channel_major_copy(pool, L.ffn.firing_matrix(), copy_type);
    if (ffn_needs_up(L.ffn)) c.up = channel_major_copy(pool, L.ffn.up, copy_type);
    if (L.ffn.down.valid()) {
      c.down = channel_major_copy(pool, L.ffn.down, copy_type);
      c.down_view = c.down.view;
    } else {
      c.down_view = L.ffn.down_t;  // the file's own neuron-major down: no copy
    }
    widest_in = std::max({widest_in, L.wo.cols(), L.ffn.n_ff()});
    widest_out = std::max({widest_out, L.wq.rows(), L.wk.rows(), L.ffn.n_ff()});
    copies_.push_back(std::move(c));
  }
  ids_.resize(static_cast<size_t>(widest_in));
  vals_.resize(static_cast<size_t>(widest_in));
  axpy_scratch_.resize(cpu::sparse_axpy_scratch_floats(widest_out, 1, pool.size(), cpu::AxpySplit::columns));
  xm_.resize(static_cast<size_t>(max_batch * hp.n_embd));
  stats_.seen.assign(model.layers.size(), {});
  stats_.kept.assign(model.layers.size(), {});
  stats_.site_weights.assign(kInputSites, 0.0);
  for (const LayerWeights& L : model.layers) {
    const auto w = input_site_weights(L);
    for (int s = 0; s < kInputSites; ++s) stats_.site_weights[s] += w[s];
  }
  log_info("input sparsity: input-channel-major copies of {} layers' matrices, {:.1f} MiB, in {:.1f} s",
           model.layers.size(), copy_bytes() / 1048576.0, timer.seconds());
}

std::string InputSparseExecutor::refusal(const Model& model) const {
  std::string why = model_moe_refusal(model, "--sparse-mode input");
  if (!why.empty()) return why;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const InputSiteMatrices m = input_site_matrices(model.layers[l]);
    for (const auto& site : m.site)
      for (const TensorView* t : site)
        if (!t->valid() || t->n_dims != 2)
          return fmt::format("--sparse-mode input: layer {} lacks a 2-D matrix it needs ({})", l,
                             t->valid() ? t->name : std::string("missing"));
  }
  return {};
}

void InputSparseExecutor::sparse_product(ThreadPool& pool, const TensorView& copy, int64_t n_kept, float* y) {
  const int64_t cols = copy.cols();
  std::memset(y, 0, sizeof(float) * static_cast<size_t>(cols));
  if (n_kept > 0)
    cpu::sparse_axpy(pool, copy, ids_.data(), n_kept, vals_.data(), 1, n_kept, y, cols, axpy_scratch_.data(),
                     cpu::AxpySplit::columns);
}

int64_t InputSparseExecutor::keep(int64_t layer, InputSite site, const float* x, int64_t n_in) {
  const int s = static_cast<int>(site);
  const int64_t k = select_inputs(x, n_in, thr_[static_cast<size_t>(layer)][s], ids_.data(), vals_.data());
  stats_.seen[static_cast<size_t>(layer)][s] += static_cast<uint64_t>(n_in);
  stats_.kept[static_cast<size_t>(layer)][s] += static_cast<uint64_t>(k);
  return k;
}

void InputSparseExecutor::mask(float* x, int64_t n, int64_t w, float t) {
  for (int64_t i = 0; i < n * w; ++i)
    if (std::fabs(x[i]) <= t) x[i] = 0.0f;
}

void InputSparseExecutor::qkv(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* xn, int64_t n,
                              Workspace& ws) {
  const size_t l = static_cast<size_t>(layer);
  if (n > 1) {
    mask(xn, n, L.wq.cols(), thr_[l][0]);
    stats_.batch_tokens += static_cast<uint64_t>(n);
    return dense_qkv(pool, L, xn, n, ws);
  }
  const LayerCopies& c = copies_[l];
  const int64_t k = keep(layer, InputSite::attn_in, xn, L.wq.cols());
  sparse_product(pool, c.wq.view, k, ws.q.data());
  sparse_product(pool, c.wk.view, k, ws.k.data());
  sparse_product(pool, c.wv.view, k, ws.v.data());
}

void InputSparseExecutor::out(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* attn, int64_t n,
                              float* o, Workspace& ws) {
  const size_t l = static_cast<size_t>(layer);
  if (n > 1) {
    mask(attn, n, L.wo.cols(), thr_[l][1]);
    return dense_out(pool, L, attn, n, o, ws);
  }
  const int64_t k = keep(layer, InputSite::attn_out, attn, L.wo.cols());
  sparse_product(pool, copies_[l].wo.view, k, o);
}

void InputSparseExecutor::run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act,
                              const float* x, int64_t n, float* out, Workspace& ws) {
  const size_t l = static_cast<size_t>(layer);
  const int64_t n_embd = w.n_embd(), n_ff = w.n_ff();
  if (n > 1) {  // the dense steps of model/ffn.hpp on the masked input and values
    float* xm = xm_.data();
    std::memcpy(xm, x, sizeof(float) * static_cast<size_t>(n * n_embd));
    mask(xm, n, n_embd, thr_[l][2]);
    ffn_firing_all(pool, w, act, xm, n, ws);
    float* h = ffn_values_all(pool, w, act, xm, n, ws);
    mask(h, n, n_ff, thr_[l][3]);
    return ffn_down_all(pool, w, h, n, out, ws);
  }
  const LayerCopies& c = copies_[l];
  const int64_t k = keep(layer, InputSite::ffn_in, x, n_embd);
  float* a = ws.gate.data();
  sparse_product(pool, c.fire.view, k, a);
  ffn_firing_values(w, act, a, 1, n_ff, n_ff, nullptr);
  float* h = ws.up.data();
  if (ffn_needs_up(w)) sparse_product(pool, c.up.view, k, h);
  ffn_neuron_values(w, act, a, n_ff, h, n_ff, 1, n_ff, nullptr);
  const int64_t kh = keep(layer, InputSite::ffn_hidden, h, n_ff);
  sparse_product(pool, c.down_view, kh, out);
  ffn_add_down_bias(w, out, 1);
}

void InputSparseExecutor::reset_stats() {
  for (auto& a : stats_.seen) a.fill(0);
  for (auto& a : stats_.kept) a.fill(0);
  stats_.batch_tokens = 0;
}

size_t InputSparseExecutor::copy_bytes() const {
  size_t b = 0;
  for (const LayerCopies& c : copies_)
    for (const cpu::NeuronMajorMatrix* m : {&c.wq, &c.wk, &c.wv, &c.wo, &c.fire, &c.up, &c.down}) b += m->bytes.size();
  return b;
}

size_t InputSparseExecutor::bytes() const {
  return copy_bytes() + (ids_.size() + vals_.size() + axpy_scratch_.size() + xm_.size()) * sizeof(float);
}

double InputSparseExecutor::weight_bytes_per_token() const {
  double total = static_cast<double>(model_.weight_bytes_per_token()), tokens = 0;
  for (size_t l = 0; l < copies_.size(); ++l) {
    const LayerWeights& L = model_.layers[l];
    const LayerCopies& c = copies_[l];
    const double t = static_cast<double>(stats_.seen[l][0]) / static_cast<double>(L.wq.cols());
    if (t <= 0) continue;
    tokens = std::max(tokens, t);
    const InputSiteMatrices m = input_site_matrices(L);
    const std::array<std::vector<const TensorView*>, kInputSites> read = {
        std::vector<const TensorView*>{&c.wq.view, &c.wk.view, &c.wv.view},
        {&c.wo.view},
        c.up.view.valid() ? std::vector<const TensorView*>{&c.fire.view, &c.up.view}
                          : std::vector<const TensorView*>{&c.fire.view},
        {&c.down_view}};
    for (int s = 0; s < kInputSites; ++s) {
      for (const TensorView* f : m.site[s]) total -= static_cast<double>(f->nbytes);
      const double kept_rows = static_cast<double>(stats_.kept[l][s]) / t;  // per token
      for (const TensorView* v : read[s]) {
        total += kept_rows * static_cast<double>(v->row_size());
        if (cpu::is_nm4(v->type)) total += static_cast<double>(cpu::nm4_table_bytes(v->type, v->rows(), v->cols()));
      }
    }
  }
  return tokens > 0 ? total : 0.0;
}

}  // namespace ember
