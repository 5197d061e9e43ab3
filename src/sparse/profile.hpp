// Activation profiling (`ember profile`): run a model over a corpus with the dense FFN and
// record, per layer and neuron, how often the neuron fires (|firing value| > t: |act(gate)|, or
// for an FFN without a gate |act(up + bias)|, model/ffn.hpp), and the distribution of the
// firing values' magnitudes over all (token, neuron) pairs of each layer, from which the
// profile's 1001 quantiles come (docs/sparse_formats.md).
//
// Quantiles come from a histogram over the float bit pattern of |act(gate)|: bins of 2^-10
// relative width (1024 per octave) from 2^-24 to 2^16, exact counts, linear interpolation inside
// a bin; so each quantile is exact to 0.1 % relative (values below 2^-24 count as 0). No
// sampling: every (token, neuron) pair of every layer is counted.
//
// Firing threshold: `threshold` for all layers when given (>= 0; ReLU models: 0, exact). When
// not given (threshold < 0), each layer's threshold is its quantile at `sparsity`, so that the
// counts mean something for SwiGLU/GeGLU models where act(gate) is never exactly 0; this needs
// the quantiles first, so the corpus is run twice (pass 1: histograms, pass 2: counts).
//
// The pass that counts can also record predictor training samples (sparse/ffn_samples.hpp), firing
// as counted, so that profiling and sampling take one run over the corpus; and, for a dense
// model, which neurons fired for an even spread of its tokens (sparse/cofire.hpp), from which
// each layer's clustered order comes: neurons that fire together, neighbours in the file that
// `ember prepare` writes.
//
// A mixture-of-experts layer counts each expert's routings (the tokens that chose it) and the
// firing of the neurons inside the experts that ran: neuron j of expert e is the layer's neuron
// e * n_ff_exp + j, so a layer has n_expert x n_ff_exp of them; its quantiles are over the (token,
// chosen expert, neuron) triples, its FFN input recorded once per token, its down input (the
// neuron values) per chosen expert.
//
// Pass 1 also records the magnitudes of every matrix's input at the four input sites of each
// layer (sparse/input_site.hpp: the inputs of q/k/v, o, gate/up and down), from which the
// profile's input tables come: 1001 quantiles of |x| and, beside each, the fraction of the
// input's energy (sum of x^2) at or below it (what input sparsity, sparse/input_allocation.hpp,
// allocates from).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.hpp"
#include "model/ffn.hpp"
#include "model/workspace.hpp"
#include "sparse/cofire.hpp"
#include "sparse/ffn_samples.hpp"
#include "sparse/input_site.hpp"

namespace ember {
namespace gguf {
class Reader;
}

// Counts of |x| in bins of the float bit pattern (see above).
class AbsHistogram {
 public:
  static constexpr int kMantBits = 10;
  static constexpr int kMinExp = -24, kMaxExp = 16;  // [2^kMinExp, 2^kMaxExp)
  static constexpr int64_t kBins = int64_t(kMaxExp - kMinExp) << kMantBits;

  AbsHistogram() : counts_(static_cast<size_t>(kBins) + 2, 0) {}
  void add(const float* x, int64_t n);
  uint64_t total() const { return total_; }
  // n equally spaced quantiles: entry k is the value below which a fraction k / (n - 1) of the
  // counted values lie (linear inside a bin; the first and last: the extreme bins' edges).
  std::vector<float> quantiles(int64_t n) const;
  // Beside each of those n quantiles: the fraction of the counted values' energy (sum of x^2,
  // each bin at its middle) held by the values at or below it (0 when there is none).
  std::vector<float> energy_fractions(int64_t n) const;
  void merge(const AbsHistogram& o);

 private:
  // counts_[0]: below 2^kMinExp (taken as 0); counts_[1 + b]: bin b; last: at or above 2^kMaxExp
  std::vector<uint64_t> counts_;
  uint64_t total_ = 0;
};

// The FFN executor of the profiler: the dense FFN, plus the statistics; and its projection
// executor (the dense projections, recording their inputs).
class ProfileFfn final : public FfnExecutor, public ProjectionExecutor {
 public:
  explicit ProfileFfn(const Model& model);
  void run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
           float* out, Workspace& ws) override;
  std::string refusal(const Model&) const override { return {}; }  // every gating (model/ffn.hpp)
  bool takes_experts() const override { return true; }
  void run_moe(ThreadPool& pool, int64_t layer, const MoeWeights& moe, cpu::Activation act, const float* x, int64_t n,
               float* out, Workspace& ws) override;
  void qkv(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* xn, int64_t n, Workspace& ws) override;
  void out(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* attn, int64_t n, float* o,
           Workspace& ws) override;

  // Pass settings: record histograms; count firings against per-layer thresholds (empty: don't).
  void set_record_histograms(bool on) { record_hist_ = on; }
  void set_count_thresholds(std::vector<float> t);
  // Records predictor training samples in the pass that counts (null: none), firing as counted.
  void set_sample_recorder(FfnSampleRecorder* rec) { samples_ = rec; }
  // Records which neurons fired (dense layers) in the pass that counts (null: not).
  void set_firing_record(FiringRecord* rec) { firing_ = rec; }

  const AbsHistogram& histogram(int64_t layer) const { return hist_[static_cast<size_t>(layer)]; }
  const AbsHistogram& input_histogram(int64_t layer, int site) const {
    return inputs_[static_cast<size_t>(layer)][static_cast<size_t>(site)];
  }
  const std::vector<uint64_t>& counts(int64_t layer) const { return counts_[static_cast<size_t>(layer)]; }
  // Tokens routed to each expert (empty for a dense layer), counted in the pass that counts.
  const std::vector<uint64_t>& expert_counts(int64_t layer) const { return experts_[static_cast<size_t>(layer)]; }
  uint64_t tokens_counted() const { return tokens_counted_; }
  uint64_t tokens_recorded() const { return tokens_recorded_; }  // tokens of layer 0 in the histograms

 private:
  // The dense FFN's steps over n rows, recording the firing values, their counts (into the
  // layer's neurons from `first` on) and the neuron values; the FFN input is the caller's.
  void steps(ThreadPool& pool, size_t layer, int64_t first, const FfnWeights& w, cpu::Activation act, const float* x,
             int64_t n, float* out, Workspace& ws, FiringRecord* firing);

  std::vector<AbsHistogram> hist_;
  std::vector<std::array<AbsHistogram, kInputSites>> inputs_;
  std::vector<std::vector<uint64_t>> counts_, experts_;
  std::vector<float> thresholds_;
  bool record_hist_ = true;
  FfnSampleRecorder* samples_ = nullptr;
  FiringRecord* firing_ = nullptr;
  uint64_t tokens_counted_ = 0;  // tokens of layer 0 counted
  uint64_t tokens_recorded_ = 0;
};

struct ProfileOptions {
  int64_t n_ctx = 512;       // corpus chunk length; each chunk runs from position 0
  int64_t max_tokens = 0;    // 0: the whole corpus (whole chunks)
  float threshold = -1.0f;   // < 0: per-layer quantile at `sparsity` (ReLU models: use 0)
  float sparsity = 0.5f;
  // Per-layer mode: the first pass only (the firing and input quantiles, what input sparsity
  // reads), no firing counts (they stay 0): half the time.
  bool quantiles_only = false;
  // Tokens whose firing the clustered orders come from (a dense model's counting pass; 0: no
  // orders).
  int64_t cluster_tokens = kCofireTokens;
};

// Quantiles of the firing values' magnitudes per layer in a profile.
constexpr int64_t kQuantiles = 1001;

// The neurons a profile counts in a layer: n_ff, or for a mixture n_expert x n_ff_exp.
int64_t profile_neurons(const Model& model, int64_t layer);

struct Profile {
  std::string model_name;
  uint64_t n_tokens = 0;
  int64_t n_layer = 0, n_ff = 0;    // n_ff: the neurons of each layer (profile_neurons)
  int64_t n_expert = 0, n_expert_used = 0;  // a mixture's experts and those a token runs; 0: dense
  float threshold = 0.0f;           // the one given, or (per-layer mode) the mean of thresholds
  std::vector<float> thresholds;    // per layer, the threshold the counts used
  float sparsity = -1.0f;           // per-layer mode: the sparsity the thresholds are at; else -1
  std::vector<std::vector<float>> counts;     // [layer][n_ff]
  std::vector<std::vector<float>> quantiles;  // [layer][1001]
  // Input tables (empty in profiles from before them): per layer, site by site, 1001 quantiles of
  // |x| and the energy fractions beside them ([layer][site * 1001 + k]).
  std::vector<std::vector<float>> input_quantiles, input_energy;
  bool has_input_tables() const { return !input_quantiles.empty(); }
  std::vector<std::vector<float>> expert_counts;  // [layer][n_expert]: tokens routed to each expert
  // Per layer, the neurons hot first with those that fire together neighbours (sparse/cofire.hpp;
  // empty where the profile has none: a mixture, or a profile made before them).
  std::vector<std::vector<int32_t>> cluster_orders;
  // The neurons a token runs in a layer: n_ff, or n_expert_used experts' neurons.
  double neurons_per_token() const {
    return n_expert > 0 ? static_cast<double>(n_ff) / static_cast<double>(n_expert) * static_cast<double>(n_expert_used)
                        : static_cast<double>(n_ff);
  }
};

// A mixture's routing shares from a profile of `model` (read from `path`, for messages):
// [layer][expert] = the tokens routed to the expert / the profile's tokens, in [0, 1]. Throws
// naming the layer where the profile has no routing counts or counts other experts.
std::vector<std::vector<float>> profile_routing_shares(const Profile& p, const Model& model, const std::string& path);

void write_profile(const Profile& p, const std::string& path);
Profile read_profile(const std::string& path);
// Layer `layer`'s clustered order from a profile open in r (read from `path`, for messages),
// checked: I32, each of the n_ff neurons once.
std::vector<int32_t> read_cluster_order(const gguf::Reader& r, const std::string& path, int64_t layer, int64_t n_ff);

// The power-law summary of one layer: the fraction of neurons (hottest first) that covers
// `coverage` of all firings; and the layer's sparsity (fraction of token-neurons not firing).
double hot_fraction(const std::vector<float>& counts, double coverage);
double layer_sparsity(const Profile& p, int64_t layer);

// An SVG plot of the cumulative firing curves (x: fraction of neurons, hottest first; y:
// fraction of firings covered), one line per layer.
std::string profile_svg(const Profile& p);

}  // namespace ember
