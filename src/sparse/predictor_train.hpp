// Training activation predictors in C++ (`ember train-predictor`).
//
// 1. collect_ffn_samples runs the model densely over token sequences and keeps, per layer, a
//    subsample of tokens: the FFN input x (after ffn_norm) and the neurons that fired
//    (|act(gate)| > threshold) with their activation mass |act(gate) * up| (the coefficient the
//    neuron's down column gets: what dropping it would cost).
// 2. train_layer_predictor fits score = fc2 relu(fc1 x) per rank with Adam on a weighted binary
//    cross-entropy (a firing neuron weighs pos_weight * mass / mean mass, so recall of mass is
//    what is optimized; a silent one weighs 1). 10% of the tokens are held out: the first half
//    picks the score threshold that reaches the recall target (of activation mass), the second
//    half measures recall, precision and predicted sparsity. The weights kept are the start's or
//    an epoch's, whichever predicts the fewest neurons at the recall target on the calibration
//    half (the start, a linear fit of the gate's pre-activations, is often the best already);
//    training stops after `patience` epochs without a better one.
// 3. The rank: doubling from min_rank, each rank is trained and costed as the bytes one token
//    reads in this layer, predictor plus the gate rows of the predicted neurons and the up/down
//    rows of the ones that fire: cost = predictor bytes + predicted fraction * ffn_bytes / 3 +
//    active fraction * 2 ffn_bytes / 3. Doubling stops when the cost rises (or at max_rank); the
//    cheapest rank wins, then one bisection step between it and its better neighbour. Sparser,
//    more skewed layers get smaller predictors because a small one already predicts them well.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.hpp"
#include "model/model.hpp"
#include "sparse/ffn_samples.hpp"
#include "tensor/dtype.hpp"

namespace ember {

struct SampleOptions {
  int64_t max_tokens = 4000;  // tokens kept per layer (every layer keeps the same tokens)
  int64_t n_ctx = 512;        // tokens per forward sequence (the KV cache is reset between them)
  int64_t batch = 64;         // tokens per forward pass
  float threshold = 0.0f;     // firing: |act(gate)| > threshold
  std::vector<float> layer_thresholds;  // per layer (a profile's); replaces threshold when not empty
  uint64_t seed = 1;
};

using TrainProgress = std::function<void(const std::string& message)>;

// Runs `tokens` through the model densely, cut into sequences of opts.n_ctx tokens; keeps an
// evenly spread subsample of at most opts.max_tokens tokens. Returns one LayerSamples per layer.
std::vector<LayerSamples> collect_ffn_samples(const Model& model, ThreadPool& pool, const std::vector<int32_t>& tokens,
                                              const SampleOptions& opts, const TrainProgress& progress = {});

struct PredictorTrainOptions {
  double recall = 0.99;         // target recall of activation mass on held-out tokens
  int64_t min_rank = 16, max_rank = 1024;
  int epochs = 4;
  int patience = 2;             // stop after this many epochs without a better checkpoint (0: never)
  int64_t batch = 256;          // tokens per Adam step
  float lr = 2e-3f;
  float pos_weight = 4.0f;      // weight of a firing neuron of mean mass, relative to a silent one
  double holdout = 0.1;         // fraction of tokens held out (half calibrates, half evaluates)
  DType type = DType::F16;      // of the stored fc1/fc2: F32, F16 or Q8_0 (ranks then multiples of 32); the
                                // held-out evaluation runs the engine's kernels on the stored weights
  uint64_t seed = 1;
  double ffn_bytes = 0;         // bytes of the layer's gate + up + down, for the rank's cost; 0: size only
  // The layer's gate matrix (optional): the predictor starts from the best rank-r/2 linear
  // approximation of the gate's pre-activations on the training tokens: with P = X G^T (tokens x
  // n_ff) and V the top r/2 right-singular vectors of P (subspace iteration), fc1 = [V G; -V G],
  // fc2 = [V^T, -V^T], so score = V^T V G x from the first step; training then turns it into a
  // classifier. Taking the subspace from P rather than from G alone keeps what the inputs make of
  // the gate: its per-neuron offsets through a constant input channel, which G's own leading
  // singular vectors miss. Invalid view: random initialization.
  TensorView init_gate;
};

// A trained predictor of one layer and its held-out evaluation.
struct LayerPredictor {
  int64_t rank = 0, n_embd = 0, n_ff = 0;
  std::vector<float> fc1;  // [rank][n_embd] (rounded to the stored type)
  std::vector<float> fc2;  // [n_ff][rank]
  float threshold = 0;     // neuron j predicted active when score_j >= threshold
  double recall_mass = 0, recall_count = 0, precision = 0;
  double predicted_sparsity = 0, true_sparsity = 0;  // fractions of (token, neuron) pairs not predicted / not firing
  double cost = 0;         // bytes per token by the cost model above
  size_t bytes = 0;        // of fc1 + fc2 in the stored type
  double train_loss = 0;   // mean weighted cross-entropy of the last epoch
  int best_epoch = 0;      // the epoch whose weights were kept (0: the initialization)
  int epochs_run = 0;      // epochs trained (fewer than asked when `patience` stopped them)
};

// Fails with a clear message unless `t` can store a predictor of this shape: F32, F16, or Q8_0
// when n_embd and the rank are multiples of 32.
void check_predictor_type(DType t, int64_t n_embd, int64_t rank);

// What the initialization described at init_gate starts from, for one layer: the gate's
// transpose G^T as floats and the pre-activations P = X G^T of the first n tokens of the samples
// (at most 2048; the engine's product with the gate as stored) with P^T. A layer's rank search
// computes them once.
struct GateProducts {
  int64_t d = 0, nf = 0, n = 0;
  std::vector<float> GT, P, PT;  // [d x nf], [n x nf], [nf x n]
};
GateProducts gate_products(ThreadPool& pool, const TensorView& gate, const LayerSamples& s, int64_t n_tokens);

// fc1/fc2 of the rank-(rank/2) approximation described at init_gate (rank even).
void gate_subspace_init(ThreadPool& pool, const GateProducts& gate, int64_t rank, uint64_t seed, std::vector<float>& fc1,
                        std::vector<float>& fc2);

// Trains one rank (deterministic for a seed and thread count); `gate`: o.init_gate's products
// with the training tokens when the caller has them (else computed here when o.init_gate is set).
LayerPredictor fit_predictor(ThreadPool& pool, const LayerSamples& s, int64_t rank, const PredictorTrainOptions& o,
                             const GateProducts* gate = nullptr);

// Searches the rank (see the top of this file) and returns the chosen predictor; `progress`
// gets one line per rank tried.
LayerPredictor train_layer_predictor(ThreadPool& pool, const LayerSamples& s, const PredictorTrainOptions& o,
                                     const TrainProgress& progress = {});

// The predictor weight type for a model when none is asked for: Q8_0 (half the bytes of F16, and
// the engine's fastest kernels) where n_embd and the ranks allow, else F16.
DType auto_predictor_type(const Hparams& hp, int64_t max_rank);

// Every layer's predictor, layer by layer: o (its rank search, the ranks capped at min(n_embd,
// n_ff)) with the layer's FFN bytes as the
// rank's cost and, with `from_gate`, the layer's gate as the starting point (init_gate). Each
// layer's samples are freed once trained. `progress` gets (layer, message) lines.
std::vector<LayerPredictor> train_predictors(ThreadPool& pool, const Model& model, std::vector<LayerSamples>& samples,
                                             PredictorTrainOptions o, bool from_gate,
                                             const std::function<void(int64_t layer, const std::string&)>& progress);

// Scores of a trained predictor for n tokens (double precision; for tests and evaluation).
void predictor_scores_reference(const LayerPredictor& p, const float* x, int64_t n, double* scores);

// Writes the predictor GGUF (docs/sparse_formats.md). Per-layer thresholds of one sign are
// folded into fc2 (scaled by 1/|threshold|, global threshold -1 or +1), so that a reader that
// knows only `powerinfer.sparse_threshold` (PowerInfer) predicts the same; otherwise the global
// threshold is 0 and `ember.predictor.thresholds` holds them.
void write_predictor_file(const std::string& path, const std::string& model_name,
                          const std::vector<LayerPredictor>& layers, DType type);

}  // namespace ember
