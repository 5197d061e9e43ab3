#include "sparse/input_allocation.hpp"

#include <algorithm>
#include <cmath>

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "sparse/input_allocation_steps.hpp"

namespace ember {

namespace {
constexpr EnumName<InputAllocation> kAllocations[] = {
    {InputAllocation::greedy, "greedy"}, {InputAllocation::uniform, "uniform"}, {InputAllocation::block, "block"}};
}  // namespace

InputAllocation parse_input_allocation(const std::string& s) {
  return parse_enum(kAllocations, s, "input-sparsity allocation");
}
const char* input_allocation_name(InputAllocation a) { return enum_name(kAllocations, a); }

void check_allocation_inputs(const Profile& p, const Model& model, double target) {
  EMBER_CHECK(p.has_input_tables(), "the profile of '{}' has no input tables (made before input sparsity existed): "
              "run `ember profile` again", p.model_name);
  EMBER_CHECK(p.n_layer == model.hp.n_layer, "the profile is of a model with {} layers, this one has {} (a profile of "
              "another model?)", p.n_layer, model.hp.n_layer);
  EMBER_CHECK(target >= 0.0 && target <= kMaxQuantileIndex / 1000.0, "input sparsity must be in [0, {}], got {}",
              kMaxQuantileIndex / 1000.0, target);
}

InputSparsityPlan input_plan_from_indices(const Profile& p, const Model& model,
                                          const std::vector<std::array<int64_t, kInputSites>>& idx) {
  EMBER_CHECK(static_cast<int64_t>(idx.size()) == p.n_layer && p.n_layer == model.hp.n_layer,
              "input sparsity: quantile indices for {} layers, profile of {}, model of {}", idx.size(), p.n_layer,
              model.hp.n_layer);
  const int64_t nq = kQuantiles;
  InputSparsityPlan plan;
  double skipped = 0, total = 0;
  for (int64_t l = 0; l < p.n_layer; ++l) {
    const std::vector<float>& q = p.input_quantiles[static_cast<size_t>(l)];
    const std::vector<float>& e = p.input_energy[static_cast<size_t>(l)];
    const std::array<double, kInputSites> w = input_site_weights(model.layers[static_cast<size_t>(l)]);
    std::array<float, kInputSites> t{}, sp{}, err{};
    for (int s = 0; s < kInputSites; ++s) {
      const int64_t k = idx[static_cast<size_t>(l)][static_cast<size_t>(s)];
      EMBER_CHECK(k >= 0 && k <= kMaxQuantileIndex, "input sparsity: quantile index {} out of [0, {}]", k,
                  kMaxQuantileIndex);
      const size_t at = static_cast<size_t>(s * nq + k);
      t[s] = k == 0 ? -1.0f : q[at];  // sparsity 0 keeps every entry
      sp[s] = static_cast<float>(k) / 1000.0f;
      err[s] = e[at];
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

InputSparsityPlan allocate_input_sparsity(const Profile& p, const Model& model, double target, InputAllocation how) {
  check_allocation_inputs(p, model, target);
  EMBER_CHECK(how != InputAllocation::block, "the block allocation runs the model on calibration text: `ember "
              "sparsify --allocation block` makes it and stores it in the model");
  const int64_t nq = kQuantiles;
  std::vector<std::array<int64_t, kInputSites>> idx(static_cast<size_t>(p.n_layer));
  for (int64_t l = 0; l < p.n_layer; ++l) {
    std::array<int64_t, kInputSites>& k = idx[static_cast<size_t>(l)];
    if (how == InputAllocation::uniform) {
      k.fill(static_cast<int64_t>(std::lround(target * 1000.0)));
      continue;
    }
    // Steps to the site with the least error per weight skipped, until the layer's share is met.
    const std::vector<float>& e = p.input_energy[static_cast<size_t>(l)];
    const auto E = [&](int s, int64_t j) { return static_cast<double>(e[static_cast<size_t>(s * nq + j)]); };
    const std::array<double, kInputSites> w = input_site_weights(model.layers[static_cast<size_t>(l)]);
    double w_layer = 0;
    for (double v : w) w_layer += v;
    double have = 0;
    const double want = target * w_layer * 1000.0;  // in weight x quantile-index units
    while (have + 1e-9 * w_layer < want) {
      int best = -1;
      double best_cost = 0;
      for (int s = 0; s < kInputSites; ++s) {
        if (w[s] <= 0 || k[s] + kEnergyStep > kMaxQuantileIndex) continue;
        const double cost = (E(s, k[s] + kEnergyStep) - E(s, k[s])) / (w[s] * kEnergyStep);
        if (best < 0 || cost < best_cost) best = s, best_cost = cost;
      }
      if (best < 0) break;  // every site at its cap
      k[best] += kEnergyStep;
      have += w[best] * kEnergyStep;
    }
  }
  return input_plan_from_indices(p, model, idx);
}

}  // namespace ember
