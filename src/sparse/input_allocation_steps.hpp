// What the allocations of input sparsity (sparse/input_allocation.hpp) share inside the sparse
// folder: the quantile steps and the checks of their inputs.
#pragma once
#include <cstdint>

#include "model/model.hpp"
#include "sparse/profile.hpp"

namespace ember {

constexpr int64_t kEnergyStep = 5;          // greedy: quantile indices per step (1/200)
constexpr int64_t kMaxQuantileIndex = 950;  // a site drops at most 95 % of its inputs

// The profile has input tables and the model's layer count; target in [0, kMaxQuantileIndex / 1000].
void check_allocation_inputs(const Profile& p, const Model& model, double target);

}  // namespace ember
