// Training-free activation sparsity for SwiGLU/GeGLU models (CATS, TEAL): per layer, a
// threshold t on |act(gate)| such that a target fraction of (token, neuron) pairs of a
// calibration corpus falls at or below it. Neurons below the threshold are skipped (up and down
// not computed) in FfnMode::threshold. The quantiles come from a profile file
// (`ember profile`, docs/sparse_formats.md): t = ffn_gate_quantiles[1000 s], interpolated.
#pragma once
#include <string>
#include <vector>

#include "gguf/reader.hpp"

namespace ember {

// The value at fraction `s` in [0, 1] of `n` equally spaced quantiles (q[k] at k / (n - 1)),
// linearly interpolated.
float quantile_at(const float* q, int64_t n, double s);

// Per-layer thresholds for target sparsity `s` from a profile file (open or by path). Errors
// name a file that is not a profile, or has no quantiles.
std::vector<float> calibrate_thresholds(const gguf::Reader& profile, double sparsity);
std::vector<float> calibrate_thresholds(const std::string& profile_path, double sparsity);

}  // namespace ember
