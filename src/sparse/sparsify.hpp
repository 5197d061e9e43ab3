// `ember sparsify`: the model file as it is, plus input sparsity's thresholds for a target
// (sparse/input_sparse.hpp, input_allocation.hpp) as ember.input_sparsity.thresholds (f32
// [4 n_layer], layer by layer in site order), .target and .allocation. Every tensor and key is
// copied unchanged, so every tool that reads the model still does; `--sparse-mode input` then
// needs no profile.
#pragma once
#include <cstdint>
#include <string>

#include "sparse/input_allocation.hpp"
#include "sparse/profile.hpp"

namespace ember {

struct SparsifyOptions {
  std::string model, profile, output;
  double sparsity = 0.4;
  InputAllocation allocation = InputAllocation::greedy;  // block needs the plan made first (the overload taking one)
};

struct SparsifySummary {
  InputSparsityPlan plan;
  uint64_t bytes = 0;  // of the written file
};

SparsifySummary sparsify_model(const SparsifyOptions& o);
// The same from a profile in memory (o.profile only names it in the file's metadata).
SparsifySummary sparsify_model(const SparsifyOptions& o, const Profile& profile);
// The same with the allocation made (o.allocation names it; the block allocation is made this way).
SparsifySummary sparsify_model(const SparsifyOptions& o, InputSparsityPlan plan);

}  // namespace ember
