// `ember prepare`: writes a sparse-ready model (docs/sparse_formats.md, "Sparse-ready model") in
// PowerInfer's layout, so that PowerInfer and Ember both run it:
//   * every layer's neurons reordered hot first by the profile's counts (reorder.hpp): rows of
//     ffn_gate / ffn_up (and ffn_up.bias), rows of the predictor's fc2; where the profile has
//     clustered orders (sparse/cofire.hpp), in those: hot first band by band, neurons that fire
//     together neighbours within a band;
//   * the down projection stored neuron-major as blk.N.ffn_down_t.weight (ne = [n_embd, n_ff]),
//     in place of ffn_down (PowerInfer loads no ffn_down from a PWRI file); OPT's ffn_down.bias
//     becomes ffn_down_t.bias as PowerInfer's converter names it;
//   * the predictor (blk.N.fc1 / fc2, from --predictor or the model's own) and
//     powerinfer.sparse_threshold embedded;
//   * with a target sparsity and a profile that has gate quantiles, the calibrated per-layer
//     thresholds ember.sparse.thresholds and ember.sparse.target;
//   * with --bundle, each layer's gate, up and down_t rows bundled by neuron into
//     blk.N.ffn_bundle.weight (Ember's layout, not PowerInfer's; model/loader.hpp binds it);
//   * each neuron's firing frequency in the profile, in the new order, as ember.sparse.neuron_freq
//     (F32 array [n_layer * n_ff]: what a memory budget keeps resident first);
//   * the permutations as ember.sparse.permutation (I32 array [n_layer * n_ff]: entry
//     il * n_ff + i is the original index of layer il's neuron i), so that per-neuron data of the
//     original model (a profile, a plan) can be mapped onto the prepared one;
//   * PWRI magic. The file is written tensor by tensor from the mapped inputs (a 7B model never
//     needs twice its size in memory).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/dtype.hpp"

namespace ember {

struct PrepareOptions {
  std::string model, profile, predictor, output;  // predictor: optional
  float sparsity = -1.0f;     // < 0: no thresholds; else the target for ember.sparse.thresholds
  // Type of ffn_down_t: "same" (down's type when n_embd is a multiple of its block size, else
  // F16), or a type name (f32, f16, q8_0, q4_0, ...).
  std::string down_type = "same";
  int n_threads = 0;          // 0: all hardware threads
  // Each layer's gate, up and neuron-major down rows bundled by neuron into one tensor,
  // blk.N.ffn_bundle.weight (ne = [3 n_embd, n_ff]): a neuron's rows are one read from the file
  // (a model larger than its memory budget). Ember's layout; PowerInfer does not read it.
  bool bundle = false;
  // Lay the neurons out in the profile's clustered orders where it has them (false: strictly
  // hot first).
  bool cluster = true;
};

struct PrepareSummary {
  int64_t n_layer = 0, n_ff = 0;
  DType down_t_type = DType::F32;
  bool down_t_from_down = false;   // converted from ffn_down (false: the model's own down_t, permuted)
  bool bundle = false;             // the FFN rows bundled by neuron (blk.N.ffn_bundle)
  bool clustered = false;          // in the profile's clustered orders
  int64_t predictor_rank = 0;      // 0: no predictor in the output
  std::vector<float> thresholds;   // empty unless --sparsity
  double hot_share = 0.0;          // fraction of all profile counts in each layer's first 10% of neurons (mean)
  uint64_t bytes = 0;              // of the written file
};

// (layers written, n_layer)
using PrepareProgress = std::function<void(int64_t done, int64_t total)>;

PrepareSummary prepare_sparse_model(const PrepareOptions& opts, const PrepareProgress& progress = {});

// The threshold for target sparsity s from a layer's 1001 quantiles of |act(gate)|: quantile
// 1000 s, linearly interpolated (docs/sparse_formats.md).
float threshold_from_quantiles(const float* quantiles, float s);

}  // namespace ember
