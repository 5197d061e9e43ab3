#include "sparse/profile.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"
#include "model/moe.hpp"
#include "model/blocks.hpp"
#include "ops/cpu/activation.hpp"
#include "ops/cpu/matmul.hpp"
#include "sparse/reorder.hpp"
#include "sparse/threshold.hpp"

namespace ember {

namespace {
constexpr uint32_t kLowBits = static_cast<uint32_t>(127 + AbsHistogram::kMinExp) << 23;
constexpr uint32_t kHighBits = static_cast<uint32_t>(127 + AbsHistogram::kMaxExp) << 23;
constexpr int kShift = 23 - AbsHistogram::kMantBits;

float bin_lower(int64_t b) { return std::bit_cast<float>(kLowBits + (static_cast<uint32_t>(b) << kShift)); }
}  // namespace

void AbsHistogram::add(const float* x, int64_t n) {
  uint64_t* c = counts_.data();
  const size_t last = counts_.size() - 1;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu;
    if (bits < kLowBits)
      ++c[0];
    else if (bits >= kHighBits)  // also inf and NaN
      ++c[last];
    else
      ++c[1 + ((bits - kLowBits) >> kShift)];
  }
  total_ += static_cast<uint64_t>(n);
}

void AbsHistogram::merge(const AbsHistogram& o) {
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += o.counts_[i];
  total_ += o.total_;
}

namespace {

// The value at each of n equally spaced ranks (linear inside a bin) and the energy of the values
// up to it (the bins before, and the same fraction of its own).
void walk_quantiles(const std::vector<uint64_t>& counts, uint64_t total, int64_t n, std::vector<float>* q,
                    std::vector<float>* energy) {
  EMBER_CHECK(n >= 2, "need at least 2 quantiles, got {}", n);
  if (q) q->assign(static_cast<size_t>(n), 0.0f);
  if (energy) energy->assign(static_cast<size_t>(n), 0.0f);
  if (total == 0) return;
  const size_t last = counts.size() - 1;
  const auto bin_energy = [&](size_t b) {  // count x the bin's middle squared
    if (b == 0) return 0.0;
    const double lo = b == last ? std::ldexp(1.0, AbsHistogram::kMaxExp) : bin_lower(static_cast<int64_t>(b) - 1);
    const double hi = b == last ? lo : bin_lower(static_cast<int64_t>(b));
    return static_cast<double>(counts[b]) * 0.25 * (lo + hi) * (lo + hi);
  };
  double e_total = 0;
  for (size_t b = 0; b < counts.size(); ++b) e_total += bin_energy(b);
  size_t bin = 0;
  uint64_t cum = 0;  // counts of the bins before `bin`
  double e_cum = 0;  // their energy
  for (int64_t k = 0; k < n; ++k) {
    const double r = static_cast<double>(k) / static_cast<double>(n - 1) * static_cast<double>(total);
    while (bin < last && (counts[bin] == 0 || static_cast<double>(cum + counts[bin]) < r))
      e_cum += bin_energy(bin), cum += counts[bin++];
    const double f = counts[bin] ? std::clamp((r - static_cast<double>(cum)) / counts[bin], 0.0, 1.0) : 1.0;
    double v;
    if (bin == 0)
      v = 0.0;  // below 2^kMinExp: zero for every purpose here
    else if (bin == last)
      v = std::ldexp(1.0, AbsHistogram::kMaxExp);
    else {
      const double lo = bin_lower(static_cast<int64_t>(bin) - 1), hi = bin_lower(static_cast<int64_t>(bin));
      v = lo + f * (hi - lo);
    }
    if (q) (*q)[static_cast<size_t>(k)] = static_cast<float>(v);
    if (energy && e_total > 0)
      (*energy)[static_cast<size_t>(k)] = static_cast<float>(std::min(1.0, (e_cum + f * bin_energy(bin)) / e_total));
  }
  for (std::vector<float>* t : {q, energy})
    if (t)
      for (size_t k = 1; k < t->size(); ++k) (*t)[k] = std::max((*t)[k], (*t)[k - 1]);
}

}  // namespace

std::vector<float> AbsHistogram::quantiles(int64_t n) const {
  std::vector<float> q;
  walk_quantiles(counts_, total_, n, &q, nullptr);
  return q;
}

std::vector<float> AbsHistogram::energy_fractions(int64_t n) const {
  std::vector<float> e;
  walk_quantiles(counts_, total_, n, nullptr, &e);
  return e;
}

int64_t profile_neurons(const Model& model, int64_t layer) {
  const LayerWeights& L = model.layers[static_cast<size_t>(layer)];
  return L.moe.valid() ? L.moe.n_expert() * L.moe.experts[0].n_ff() : model.hp.n_ff;
}

ProfileFfn::ProfileFfn(const Model& model)
    : hist_(static_cast<size_t>(model.hp.n_layer)),
      inputs_(static_cast<size_t>(model.hp.n_layer)),
      counts_(static_cast<size_t>(model.hp.n_layer)),
      experts_(static_cast<size_t>(model.hp.n_layer)) {
  for (int64_t l = 0; l < model.hp.n_layer; ++l) {
    counts_[static_cast<size_t>(l)].assign(static_cast<size_t>(profile_neurons(model, l)), 0);
    experts_[static_cast<size_t>(l)].assign(static_cast<size_t>(model.layers[static_cast<size_t>(l)].moe.n_expert()), 0);
  }
}

void ProfileFfn::set_count_thresholds(std::vector<float> t) {
  EMBER_CHECK(t.empty() || t.size() == counts_.size(), "{} thresholds for {} layers", t.size(), counts_.size());
  thresholds_ = std::move(t);
}

void ProfileFfn::steps(ThreadPool& pool, size_t l, int64_t first, const FfnWeights& w, cpu::Activation act,
                       const float* x, int64_t n, float* out, Workspace& ws, FiringRecord* firing) {
  // The dense FFN in its steps (model/ffn.hpp), the firing values recorded on the way.
  const int64_t n_ff = w.n_ff();
  const float* a = ffn_firing_all(pool, w, act, x, n, ws);
  if (record_hist_) hist_[l].add(a, n * n_ff);
  if (!thresholds_.empty()) {
    const float t = thresholds_[l];
    uint64_t* c = counts_[l].data() + first;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n_ff; ++j) c[j] += ffn_fires(a[i * n_ff + j], t);
    if (firing) firing->record(static_cast<int64_t>(l), a, n, t);
  }
  const float* h = ffn_values_all(pool, w, act, x, n, ws);
  if (record_hist_) inputs_[l][static_cast<int>(InputSite::ffn_hidden)].add(h, n * n_ff);
  if (samples_ && !thresholds_.empty()) samples_->record(static_cast<int64_t>(l), x, a, h, n, thresholds_[l]);
  ffn_down_all(pool, w, h, n, out, ws);
}

void ProfileFfn::run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                     int64_t n, float* out, Workspace& ws) {
  const size_t l = static_cast<size_t>(layer);
  if (record_hist_) {
    inputs_[l][static_cast<int>(InputSite::ffn_in)].add(x, n * w.n_embd());
    if (layer == 0) tokens_recorded_ += static_cast<uint64_t>(n);
  }
  if (!thresholds_.empty() && layer == 0) tokens_counted_ += static_cast<uint64_t>(n);
  steps(pool, l, 0, w, act, x, n, out, ws, firing_);
}

void ProfileFfn::run_moe(ThreadPool& pool, int64_t layer, const MoeWeights& moe, cpu::Activation act, const float* x,
                         int64_t n, float* out, Workspace& ws) {
  EMBER_CHECK(!samples_, "predictor training samples come from dense FFNs; layer {} is a mixture of experts (its "
              "router already chooses what runs)", layer);
  const size_t l = static_cast<size_t>(layer);
  if (record_hist_) {
    inputs_[l][static_cast<int>(InputSite::ffn_in)].add(x, n * moe.router.cols());
    if (layer == 0) tokens_recorded_ += static_cast<uint64_t>(n);
  }
  const bool counting = !thresholds_.empty();
  if (counting && layer == 0) tokens_counted_ += static_cast<uint64_t>(n);
  moe_ffn_each(pool, moe, x, n, out, ws, [&](int64_t e, const float* rows, int64_t m, float* o) {
    const FfnWeights& w = moe.experts[static_cast<size_t>(e)];
    if (counting) experts_[l][static_cast<size_t>(e)] += static_cast<uint64_t>(m);
    steps(pool, l, e * w.n_ff(), w, act, rows, m, o, ws, nullptr);
  });
}

void ProfileFfn::qkv(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* xn, int64_t n, Workspace& ws) {
  if (record_hist_) inputs_[static_cast<size_t>(layer)][static_cast<int>(InputSite::attn_in)].add(xn, n * L.wq.cols());
  dense_qkv(pool, L, xn, n, ws);
}

void ProfileFfn::out(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* attn, int64_t n, float* o,
                     Workspace& ws) {
  if (record_hist_) inputs_[static_cast<size_t>(layer)][static_cast<int>(InputSite::attn_out)].add(attn, n * L.wo.cols());
  dense_out(pool, L, attn, n, o, ws);
}

std::vector<std::vector<float>> profile_routing_shares(const Profile& pr, const Model& model, const std::string& path) {
  EMBER_CHECK(pr.n_layer == model.hp.n_layer && !pr.expert_counts.empty() && pr.n_tokens > 0,
              "profile {} has {} layers{}; the model has {} layers of experts: profile this model with `ember profile`",
              path, pr.n_layer, pr.expert_counts.empty() ? " and no routing counts" : "", model.hp.n_layer);
  std::vector<std::vector<float>> p(model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& c = pr.expert_counts[l];
    EMBER_CHECK(static_cast<int64_t>(c.size()) == model.layers[l].moe.n_expert(), "profile {}: layer {} counts {} "
                "experts, the model has {}", path, l, c.size(), model.layers[l].moe.n_expert());
    for (float v : c) {
      EMBER_CHECK(std::isfinite(v) && v >= 0 && v <= static_cast<double>(pr.n_tokens),
                  "profile {}: layer {}'s routing count {} is not in [0, n_tokens = {}]", path, l, v, pr.n_tokens);
      p[l].push_back(static_cast<float>(v / static_cast<double>(pr.n_tokens)));
    }
  }
  return p;
}

void write_profile(const Profile& p, const std::string& path) {
  gguf::Writer w;
  using gguf::Value;
  w.set("general.architecture", Value::str("ember-profile"));
  w.set("ember.profile.model", Value::str(p.model_name));
  w.set("ember.profile.n_tokens", Value::u64(p.n_tokens));
  w.set("ember.profile.n_layer", Value::u64(static_cast<uint64_t>(p.n_layer)));
  w.set("ember.profile.n_ff", Value::u64(static_cast<uint64_t>(p.n_ff)));
  w.set("ember.profile.threshold", Value::f32(p.threshold));
  w.set("ember.profile.thresholds", Value::floats(p.thresholds));
  if (p.sparsity >= 0.0f) w.set("ember.profile.sparsity", Value::f32(p.sparsity));
  if (p.n_expert > 0) {
    w.set("ember.profile.n_expert", Value::u64(static_cast<uint64_t>(p.n_expert)));
    w.set("ember.profile.n_expert_used", Value::u64(static_cast<uint64_t>(p.n_expert_used)));
  }
  auto bytes = [](const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(float));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  for (int64_t l = 0; l < p.n_layer; ++l) {
    w.add_tensor(fmt::format("blk.{}.ffn_act_count", l), DType::F32, {p.n_ff}, bytes(p.counts[l]));
    w.add_tensor(fmt::format("blk.{}.ffn_gate_quantiles", l), DType::F32, {kQuantiles}, bytes(p.quantiles[l]));
    if (p.n_expert > 0)
      w.add_tensor(fmt::format("blk.{}.ffn_expert_count", l), DType::F32, {p.n_expert}, bytes(p.expert_counts[l]));
    if (!p.cluster_orders.empty()) {
      const std::vector<int32_t>& o = p.cluster_orders[static_cast<size_t>(l)];
      std::vector<uint8_t> b(o.size() * sizeof(int32_t));
      std::memcpy(b.data(), o.data(), b.size());
      w.add_tensor(fmt::format("blk.{}.ffn_cluster_order", l), DType::I32, {p.n_ff}, std::move(b));
    }
    if (p.has_input_tables()) {
      w.add_tensor(fmt::format("blk.{}.input_quantiles", l), DType::F32, {kQuantiles, kInputSites},
                   bytes(p.input_quantiles[l]));
      w.add_tensor(fmt::format("blk.{}.input_energy", l), DType::F32, {kQuantiles, kInputSites},
                   bytes(p.input_energy[l]));
    }
  }
  w.write(path);
}

std::vector<int32_t> read_cluster_order(const gguf::Reader& r, const std::string& path, int64_t layer, int64_t n_ff) {
  const std::string name = fmt::format("blk.{}.ffn_cluster_order", layer);
  const gguf::TensorInfo* ti = r.find_tensor(name);
  EMBER_CHECK(ti, "'{}' has no tensor {} (layer 0 has one)", path, name);
  const TensorView v = r.view(*ti);
  EMBER_CHECK(v.type == DType::I32 && v.n_elements() == n_ff, "'{}': {} must be I32 with {} entries", path, name, n_ff);
  const int32_t* o = reinterpret_cast<const int32_t*>(v.data);
  std::vector<int32_t> order(o, o + n_ff);
  EMBER_CHECK(is_permutation(order, n_ff), "'{}': {} is not an order of the layer's {} neurons (each once)", path, name,
              n_ff);
  return order;
}

Profile read_profile(const std::string& path) {
  gguf::Reader r(path);
  EMBER_CHECK(r.opt_string("general.architecture").value_or("") == "ember-profile",
              "'{}' is not a profile file (write one with `ember profile`)", path);
  Profile p;
  p.model_name = r.opt_string("ember.profile.model").value_or("");
  p.n_tokens = static_cast<uint64_t>(r.get_int("ember.profile.n_tokens"));
  p.n_layer = r.get_int("ember.profile.n_layer");
  p.n_ff = r.get_int("ember.profile.n_ff");
  EMBER_CHECK(p.n_layer >= 1 && p.n_layer <= 100000 && p.n_ff >= 1 && p.n_ff <= (int64_t(1) << 24),
              "'{}': bad shape n_layer {} n_ff {}", path, p.n_layer, p.n_ff);
  p.threshold = static_cast<float>(r.get_float("ember.profile.threshold"));
  if (r.has("ember.profile.thresholds")) p.thresholds = r.get_float_array("ember.profile.thresholds");
  if (p.thresholds.empty()) p.thresholds.assign(static_cast<size_t>(p.n_layer), p.threshold);
  p.sparsity = static_cast<float>(r.opt_float("ember.profile.sparsity").value_or(-1.0));
  if (r.has("ember.profile.n_expert")) {
    p.n_expert = r.get_int("ember.profile.n_expert");
    p.n_expert_used = r.get_int("ember.profile.n_expert_used");
    EMBER_CHECK(p.n_expert >= 1 && p.n_expert <= 65536 && p.n_ff % p.n_expert == 0 && p.n_expert_used >= 1 &&
                    p.n_expert_used <= p.n_expert,
                "'{}': bad experts: {} of {} used, {} neurons a layer", path, p.n_expert_used, p.n_expert, p.n_ff);
  }
  auto read = [&](const std::string& name, int64_t n) {
    const gguf::TensorInfo* ti = r.find_tensor(name);
    EMBER_CHECK(ti, "'{}' has no tensor {}", path, name);
    TensorView v = r.view(*ti);
    EMBER_CHECK(v.type == DType::F32 && v.n_elements() == n, "'{}': {} must be F32 with {} entries", path, name, n);
    const float* f = reinterpret_cast<const float*>(v.data);
    return std::vector<float>(f, f + n);
  };
  for (int64_t l = 0; l < p.n_layer; ++l) {
    p.counts.push_back(read(fmt::format("blk.{}.ffn_act_count", l), p.n_ff));
    p.quantiles.push_back(read(fmt::format("blk.{}.ffn_gate_quantiles", l), kQuantiles));
    if (p.n_expert > 0) p.expert_counts.push_back(read(fmt::format("blk.{}.ffn_expert_count", l), p.n_expert));
  }
  if (r.find_tensor("blk.0.ffn_cluster_order")) {  // the clustered orders (absent from older profiles)
    for (int64_t l = 0; l < p.n_layer; ++l) p.cluster_orders.push_back(read_cluster_order(r, path, l, p.n_ff));
  }
  if (r.find_tensor("blk.0.input_quantiles")) {  // the input tables (absent from profiles made before them)
    for (int64_t l = 0; l < p.n_layer; ++l) {
      p.input_quantiles.push_back(read(fmt::format("blk.{}.input_quantiles", l), kQuantiles * kInputSites));
      p.input_energy.push_back(read(fmt::format("blk.{}.input_energy", l), kQuantiles * kInputSites));
      for (const std::vector<float>* t : {&p.input_quantiles.back(), &p.input_energy.back()})
        for (int s = 0; s < kInputSites; ++s)
          for (int64_t k = 0; k < kQuantiles; ++k) {
            const float v = (*t)[static_cast<size_t>(s * kQuantiles + k)];
            EMBER_CHECK(std::isfinite(v) && v >= 0.0f && (k == 0 || v >= (*t)[static_cast<size_t>(s * kQuantiles + k - 1)]),
                        "'{}': layer {}'s input tables ({}) are not non-decreasing finite values >= 0", path, l,
                        input_site_name(s));
          }
    }
  }
  return p;
}

double hot_fraction(const std::vector<float>& counts, double coverage) {
  std::vector<double> c(counts.begin(), counts.end());
  std::sort(c.begin(), c.end(), std::greater<>());
  double total = 0;
  for (double v : c) total += v;
  if (total <= 0) return 0.0;
  double acc = 0;
  for (size_t k = 0; k < c.size(); ++k) {
    acc += c[k];
    if (acc >= coverage * total * (1 - 1e-12)) return static_cast<double>(k + 1) / static_cast<double>(c.size());
  }
  return 1.0;
}

double layer_sparsity(const Profile& p, int64_t layer) {
  if (p.n_tokens == 0) return 0.0;
  double fired = 0;
  for (float v : p.counts[static_cast<size_t>(layer)]) fired += v;
  return 1.0 - fired / (static_cast<double>(p.n_tokens) * p.neurons_per_token());
}

std::string profile_svg(const Profile& p) {
  const int W = 720, H = 480, ml = 60, mr = 130, mt = 40, mb = 50;
  const int pw = W - ml - mr, ph = H - mt - mb;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H);
  s += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"14\">{}: cumulative share of firings, neurons hottest first "
                   "({} tokens)</text>\n",
                   ml, p.model_name, p.n_tokens);
  auto X = [&](double f) { return ml + f * pw; };
  auto Y = [&](double f) { return mt + (1 - f) * ph; };
  for (int i = 0; i <= 10; ++i) {  // grid and ticks
    const double f = i / 10.0;
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#eee\"/>\n", X(f), mt, X(f), mt + ph);
    s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#eee\"/>\n", ml, Y(f), ml + pw, Y(f));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.1f}</text>\n", X(f), mt + ph + 16, f);
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.1f}</text>\n", ml - 6, Y(f) + 4, f);
  }
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", ml, mt, pw, ph);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">fraction of neurons (hottest first)</text>\n",
                   ml + pw / 2, H - 10);
  s += fmt::format("<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">fraction of "
                   "firings covered</text>\n",
                   mt + ph / 2, mt + ph / 2);
  s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#999\" "
                   "stroke-dasharray=\"4 4\"/>\n",
                   X(0), Y(0), X(1), Y(1));
  for (int64_t l = 0; l < p.n_layer; ++l) {
    std::vector<double> c(p.counts[l].begin(), p.counts[l].end());
    std::sort(c.begin(), c.end(), std::greater<>());
    double total = 0;
    for (double v : c) total += v;
    if (total <= 0) continue;
    const int hue = static_cast<int>(270.0 * l / std::max<int64_t>(p.n_layer - 1, 1));
    std::string pts = fmt::format("{:.1f},{:.1f}", X(0), Y(0));
    const size_t n = c.size(), step = std::max<size_t>(1, n / 300);
    double acc = 0;
    for (size_t k = 0; k < n; ++k) {
      acc += c[k];
      if ((k + 1) % step == 0 || k + 1 == n)
        pts += fmt::format(" {:.1f},{:.1f}", X(static_cast<double>(k + 1) / n), Y(acc / total));
    }
    s += fmt::format("<polyline fill=\"none\" stroke=\"hsl({},70%,45%)\" stroke-width=\"1.2\" points=\"{}\"/>\n", hue,
                     pts);
    const int64_t every = std::max<int64_t>(1, (p.n_layer + 15) / 16);
    if (l % every == 0 || l == p.n_layer - 1) {
      const double ly = mt + 10 + 14.0 * static_cast<double>(l / every + (l == p.n_layer - 1 && l % every ? 1 : 0));
      s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"hsl({},70%,45%)\" "
                       "stroke-width=\"2\"/><text x=\"{}\" y=\"{:.1f}\">layer {}</text>\n",
                       ml + pw + 10, ly, ml + pw + 30, ly, hue, ml + pw + 36, ly + 4, l);
    }
  }
  s += "</svg>\n";
  return s;
}

}  // namespace ember
