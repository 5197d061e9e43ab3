// Where a model-wide input sparsity goes (sparse/input_sparse.hpp): per layer and input site, the
// fraction of input entries dropped, and the thresholds that drop them.
//
// The profile (`ember profile`, docs/sparse_formats.md) holds per layer and site 1001 quantiles of
// |x| over a calibration corpus, and beside each quantile the fraction of the input's energy
// (sum of x^2) held by the entries at or below it. Dropping the entries below the quantile at s
// makes a relative squared error of E(s) in that input, and so, for a matrix without preferred
// directions, of the same size in its product: E is the measured cost of sparsity s at a site.
//
// greedy (TEAL's block-wise allocation, with the profile's energies as the error): every layer
// gets the target share of its weights skipped; within a layer, steps of 1/200 go one at a time
// to the site whose next step adds the least error per weight skipped (a site drops at most
// 95 % of its inputs). Sites that cost little (inputs with many tiny entries) take more.
// uniform: every site of every layer at the target.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "sparse/input_sparse.hpp"
#include "sparse/profile.hpp"

namespace ember {

enum class InputAllocation { greedy, uniform };
InputAllocation parse_input_allocation(const std::string& s);  // "greedy" | "uniform"

struct InputSparsityPlan {
  InputThresholds thresholds;                               // per layer and site
  std::vector<std::array<float, kInputSites>> sparsity;     // the fractions they drop on the corpus
  std::vector<std::array<float, kInputSites>> error;        // E at them (relative squared error)
  double weighted_sparsity = 0;  // over the model's layer weights (what decode skips)
};

// Needs a profile with input tables (Profile::input_quantiles). `target` in [0, 0.95].
InputSparsityPlan allocate_input_sparsity(const Profile& p, const Model& model, double target,
                                          InputAllocation how = InputAllocation::greedy);

}  // namespace ember
