#include "sparse/ffn_sparse.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "ops/cpu/activation.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/vec.hpp"

namespace ember {

FfnMode parse_ffn_mode(const std::string& s) {
  if (s == "dense") return FfnMode::dense;
  if (s == "oracle") return FfnMode::oracle;
  if (s == "threshold") return FfnMode::threshold;
  fail("unknown sparse mode '{}' (expected dense, oracle or threshold)", s);
}

const char* ffn_mode_name(FfnMode m) {
  switch (m) {
    case FfnMode::oracle: return "oracle";
    case FfnMode::threshold: return "threshold";
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
  EMBER_CHECK(opts.mode != FfnMode::dense, "SparseFfn: mode dense needs no executor");
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
  Timer timer;
  down_nm_.reserve(model.layers.size());
  for (const LayerWeights& L : model.layers) {
    if (L.ffn.down_t.valid()) {  // the file's own neuron-major down (PowerInfer's layout): no copy
      down_nm_.emplace_back();
      down_nm_.back().view = L.ffn.down_t;
      continue;
    }
    const DType t = cpu::neuron_major_dtype(L.ffn.down.type, opts.down_type, hp.n_embd);
    down_nm_.push_back(cpu::make_neuron_major(pool, L.ffn.down, t));
  }
  active_.resize(static_cast<size_t>(hp.n_ff));
  const int64_t batch = std::min(max_batch, kDenseBatch - 1);
  axpy_scratch_.resize(cpu::sparse_axpy_scratch_floats(hp.n_embd, batch, pool.size(), opts.split));
  stats_.neurons.assign(model.layers.size(), 0);
  stats_.active.assign(model.layers.size(), 0);
  log_info("sparse FFN: mode {}, threshold {}, neuron-major down copies ({} from {}) {:.1f} MiB extra, built in {:.2f} s",
           ffn_mode_name(opts.mode),
           opts.mode == FfnMode::threshold ? std::string("per layer") : fmt::format("{}", opts.threshold),
           down_nm_.empty() ? "-" : std::string(dtype_name(down_nm_[0].view.type)),
           model.layers.empty() || !model.layers[0].ffn.down.valid() ? "ffn_down_t"
                                                                       : std::string(dtype_name(model.layers[0].ffn.down.type)),
           neuron_major_bytes() / 1048576.0, timer.seconds());
}

size_t SparseFfn::neuron_major_bytes() const {
  size_t b = 0;
  for (const auto& m : down_nm_) b += m.bytes.size();  // copies only; a file's down_t is mapped
  return b;
}

size_t SparseFfn::bytes() const {
  return neuron_major_bytes() + active_.size() * sizeof(int32_t) + axpy_scratch_.size() * sizeof(float);
}

void SparseFfn::reset_stats() {
  std::fill(stats_.neurons.begin(), stats_.neurons.end(), 0);
  std::fill(stats_.active.begin(), stats_.active.end(), 0);
  stats_.dense_tokens = 0;
}

void SparseFfn::run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                    int64_t n, float* out, Workspace& ws) {
  void* mm = ws.mm_scratch.data();
  const float thr = opts_.mode == FfnMode::threshold ? opts_.layer_thresholds[static_cast<size_t>(layer)]
                                                     : opts_.threshold;
  const TensorView& down_nm = down_nm_[layer].view;
  const int64_t n_ff = down_nm.rows(), n_embd = down_nm.cols();
  if (n >= kDenseBatch) {
    if (thr == 0.0f) {  // exact: dropping act(gate) == 0 changes nothing
      dense_ffn(pool, w, act, x, n, out, ws);
      stats_.dense_tokens += static_cast<uint64_t>(n);
      return;
    }
    if (w.gating == FfnGating::par && w.down.valid() && !w.up_b.valid() && !w.down_b.valid()) {
      // Thresholded (threshold mode on a SwiGLU/GeGLU model): dense kernels, inactive act(gate)
      // zeroed.
      float* g = ws.gate.data();
      float* u = ws.up.data();
      cpu::matmul(pool, w.gate, x, n, g, mm);
      cpu::activation_inplace(act, g, n * n_ff);
      uint64_t n_active = 0;
      for (int64_t i = 0; i < n * n_ff; ++i) {
        if (std::fabs(g[i]) > thr)
          ++n_active;
        else
          g[i] = 0.0f;
      }
      stats_.neurons[layer] += static_cast<uint64_t>(n * n_ff);
      stats_.active[layer] += n_active;
      cpu::matmul(pool, w.up, x, n, u, mm);
      for (int64_t i = 0; i < n * n_ff; ++i) g[i] *= u[i];
      cpu::matmul(pool, w.down, g, n, out, mm);
      stats_.dense_tokens += static_cast<uint64_t>(n);
      return;
    }
    // Other layouts (no gate, biases, only ffn_down_t) take the sparse path below.
  }
  // a = [n][n_ff]: the value that decides firing, zero where inactive: act(gate x), or for an
  // FFN without a gate (OPT) the neuron's whole value act(up x + up_b).
  const bool no_gate = w.gating == FfnGating::none;
  float* a = ws.gate.data();
  cpu::matmul(pool, no_gate ? w.up : w.gate, x, n, a, mm);
  if (no_gate && w.up_b.valid())
    for (int64_t t = 0; t < n; ++t) cpu::add_f32(reinterpret_cast<const float*>(w.up_b.data), a + t * n_ff, n_ff);
  cpu::activation_inplace(act, a, n * n_ff);

  // The active set: neurons active for at least one token of the batch.
  int64_t na = 0;
  uint64_t n_active_tokens = 0;
  for (int64_t j = 0; j < n_ff; ++j) {
    bool any = false;
    for (int64_t t = 0; t < n; ++t) {
      float& v = a[t * n_ff + j];
      if (std::fabs(v) > thr) {
        any = true;
        ++n_active_tokens;
      } else {
        v = 0.0f;
      }
    }
    if (any) active_[static_cast<size_t>(na++)] = static_cast<int32_t>(j);
  }
  stats_.neurons[layer] += static_cast<uint64_t>(n * n_ff);
  stats_.active[layer] += n_active_tokens;

  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * n_embd));
  if (na > 0) {
    float* h = ws.up.data();
    if (no_gate) {
      // H[t][i] = a[t][active i]: the neuron values are already known.
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < na; ++i) h[t * na + i] = a[t * n_ff + active_[i]];
    } else {
      // up for the active rows, then H[t][i] = act(gate)[t][active i] * up[t][i] (Bamboo:
      // * act(up)), in place.
      cpu::gather_matmul(pool, w.up, x, n, active_.data(), na, h, na, mm);
      if (w.gating == FfnGating::sym) cpu::activation_inplace(act, h, n * na);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < na; ++i) h[t * na + i] *= a[t * n_ff + active_[i]];
    }
    cpu::sparse_axpy(pool, down_nm, active_.data(), na, h, n, na, out, n_embd, axpy_scratch_.data(), opts_.split);
  }
  if (w.down_b.valid())
    for (int64_t t = 0; t < n; ++t) cpu::add_f32(reinterpret_cast<const float*>(w.down_b.data), out + t * n_embd, n_embd);
}

}  // namespace ember
