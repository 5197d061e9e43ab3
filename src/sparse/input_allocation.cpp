#include "sparse/input_allocation.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace ember {

InputAllocation parse_input_allocation(const std::string& s) {
  if (s == "greedy") return InputAllocation::greedy;
  if (s == "uniform") return InputAllocation::uniform;
  fail("unknown input-sparsity allocation '{}' (expected greedy or uniform)", s);
}

namespace {
constexpr int64_t kStep = 5;      // quantile indices per greedy step (1/200)
constexpr int64_t kMaxIndex = 950;  // a site drops at most 95 % of its inputs
}  // namespace

InputSparsityPlan allocate_input_sparsity(const Profile& p, const Model& model, double target, InputAllocation how) {
  EMBER_CHECK(p.has_input_tables(), "the profile of '{}' has no input tables (made before input sparsity existed): "
              "run `ember profile` again", p.model_name);
  EMBER_CHECK(p.n_layer == model.hp.n_layer, "the profile is of a model with {} layers, this one has {} (a profile of "
              "another model?)", p.n_layer, model.hp.n_layer);
  EMBER_CHECK(target >= 0.0 && target <= kMaxIndex / 1000.0, "input sparsity must be in [0, {}], got {}",
              kMaxIndex / 1000.0, target);
  const int64_t nq = kQuantiles;
  InputSparsityPlan plan;
  double skipped = 0, total = 0;
  for (int64_t l = 0; l < p.n_layer; ++l) {
    const std::vector<float>& q = p.input_quantiles[static_cast<size_t>(l)];
    const std::vector<float>& e = p.input_energy[static_cast<size_t>(l)];
    const auto Q = [&](int s, int64_t k) { return q[static_cast<size_t>(s * nq + k)]; };
    const auto E = [&](int s, int64_t k) { return static_cast<double>(e[static_cast<size_t>(s * nq + k)]); };
    const std::array<double, kInputSites> w = input_site_weights(model.layers[static_cast<size_t>(l)]);
    double w_layer = 0;
    for (double v : w) w_layer += v;
    std::array<int64_t, kInputSites> idx{};
    if (how == InputAllocation::uniform) {
      idx.fill(static_cast<int64_t>(std::lround(target * 1000.0)));
    } else {
      // Steps to the site with the least error per weight skipped, until the layer's share is met.
      double have = 0;
      const double want = target * w_layer * 1000.0;  // in weight x quantile-index units
      while (have + 1e-9 * w_layer < want) {
        int best = -1;
        double best_cost = 0;
        for (int s = 0; s < kInputSites; ++s) {
          if (w[s] <= 0 || idx[s] + kStep > kMaxIndex) continue;
          const double cost = (E(s, idx[s] + kStep) - E(s, idx[s])) / (w[s] * kStep);
          if (best < 0 || cost < best_cost) best = s, best_cost = cost;
        }
        if (best < 0) break;  // every site at its cap
        idx[best] += kStep;
        have += w[best] * kStep;
      }
    }
    std::array<float, kInputSites> t{}, sp{}, err{};
    for (int s = 0; s < kInputSites; ++s) {
      t[s] = idx[s] == 0 ? -1.0f : Q(s, idx[s]);  // sparsity 0 keeps every entry
      sp[s] = static_cast<float>(idx[s]) / 1000.0f;
      err[s] = static_cast<float>(E(s, idx[s]));
      skipped += w[s] * sp[s];
      total += w[s];
    }
    plan.thresholds.push_back(t);
    plan.sparsity.push_back(sp);
    plan.error.push_back(err);
  }
  plan.weighted_sparsity = total > 0 ? skipped / total : 0.0;
  return plan;
}

}  // namespace ember
