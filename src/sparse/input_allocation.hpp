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
// block (TEAL's allocation as TEAL runs it, input_allocation_block.cpp): the same greedy steps,
// each to the site whose step adds the least error to the layer's own output, measured by running
// the layer (attention and FFN, masked as input mode's prompt path masks them) on calibration
// tokens whose layer inputs come from the dense model. The energy of an input is not the error it
// makes downstream (a site's matrix, the attention's softmax, the FFN's gating all shape it); the
// layer's output is where the sites' errors meet in one unit. Needs the model run, so only
// `ember sparsify` (which stores the result in the model) makes it.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.hpp"

#include "model/model.hpp"
#include "sparse/input_sparse.hpp"
#include "sparse/profile.hpp"

namespace ember {

enum class InputAllocation { greedy, uniform, block };
InputAllocation parse_input_allocation(const std::string& s);  // "greedy" | "uniform" | "block"
const char* input_allocation_name(InputAllocation a);

struct InputSparsityPlan {
  InputThresholds thresholds;                               // per layer and site
  std::vector<std::array<float, kInputSites>> sparsity;     // the fractions they drop on the corpus
  std::vector<std::array<float, kInputSites>> error;        // E at them (relative squared error)
  double weighted_sparsity = 0;  // over the model's layer weights (what decode skips)
  // block allocation: per layer, the squared error of the layer's output on the calibration
  // tokens relative to the squared size of what the dense layer adds to its input (empty otherwise).
  std::vector<double> block_error;
};

// Needs a profile with input tables (Profile::input_quantiles). `target` in [0, 0.95]. greedy and
// uniform (block runs the model: allocate_input_sparsity_by_block).
InputSparsityPlan allocate_input_sparsity(const Profile& p, const Model& model, double target,
                                          InputAllocation how = InputAllocation::greedy);

// The plan of per-layer, per-site quantile indices (k: the profile's quantile at k / 1000, 0:
// every entry kept): thresholds, the shares they drop, the profile's errors at them, the weighted
// sparsity. What every allocation ends with.
InputSparsityPlan input_plan_from_indices(const Profile& p, const Model& model,
                                          const std::vector<std::array<int64_t, kInputSites>>& idx);

struct BlockAllocationOptions {
  int64_t tokens = 256;  // calibration tokens each layer runs, in sequences of `chunk` spread over the text
  int64_t chunk = 128;
  double step = 0.02;    // the layer's share of weights skipped that one greedy step adds
  int32_t bos = -1;      // >= 0: each sequence starts with this token (models that expect a BOS, as Gemma)
  // Spend the share only on sites whose skipped inputs save decode time (input_copy_pays, with
  // the session's copy type): where a layer has such sites, the others keep every input. Faster
  // decode for more error (docs/agreement.md): off by default.
  bool paying_sites_only = false;
  cpu::NeuronMajorType copy_type = cpu::NeuronMajorType::exact;
  // Each step tries every open site at the current indices (TEAL's greedy), not only the one
  // whose cost was lowest when last tried until one tried now stays lowest (the costs grow as
  // the layer gets sparser, so a stale cost is a bound: close to the same plan, several times
  // fewer layer runs).
  bool every_candidate = false;
  // Every candidate runs the whole layer, not just the stages from its site on (the same plan,
  // slower: the reference the staged runs are tested against).
  bool whole_layers = false;
};
// The block allocation (above) on `tokens` (calibration text, tokenized); progress(layer, message)
// after each layer.
InputSparsityPlan allocate_input_sparsity_by_block(
    const Profile& p, const Model& model, double target, ThreadPool& pool, const std::vector<int32_t>& tokens,
    const BlockAllocationOptions& o = {}, const std::function<void(int64_t, const std::string&)>& progress = {});

}  // namespace ember
