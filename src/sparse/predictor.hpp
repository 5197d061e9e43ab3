// Activation predictors (PowerInfer, arXiv 2312.12456, section 5.1): per layer a small MLP
//   score = fc2 relu(fc1 x),   fc1: [n_embd -> rank], fc2: [rank -> n_ff]   (F32 or F16)
// over the FFN's input x (after ffn_norm). Neuron j is predicted active for a token when
// score_j >= threshold; a batch takes the union of its tokens' predictions.
// The file format is in docs/sparse_formats.md ("Predictor file").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.hpp"
#include "model/model.hpp"

namespace ember {

// Floats of working memory predict_active needs for n_tokens (hidden and score rows).
size_t predictor_scratch_floats(int64_t rank, int64_t n_ff, int64_t n_tokens);
// Bytes of matmul scratch it needs (activation conversion for fc1 and fc2).
size_t predictor_mm_scratch_bytes(const TensorView& fc1, const TensorView& fc2, int64_t n_tokens);

// Mirrored predictors. When a predictor's hidden units come in mirrored pairs (fc1 rows
// h .. 2h-1 are minus rows 0 .. h-1, and fc2 columns h .. 2h-1 minus columns 0 .. h-1, as
// `ember train-predictor` writes its linear start), then score = fc2[:, :h] (fc1[:h] x) exactly,
// because relu(a) - relu(-a) = a: the same prediction from half the rank and half the bytes,
// without the ReLU. mirrored_half returns h for such a pair (when fc2's first h columns are whole
// blocks of its type), 0 otherwise.
int64_t mirrored_half(const TensorView& fc1, const TensorView& fc2);
// Bytes copy_half_columns writes: fc2.rows() rows of h values of fc2's type.
size_t half_columns_bytes(const TensorView& fc2, int64_t h);
// Copies the first h columns of every row of fc2 to dst and returns their view [fc2.rows() x h].
TensorView copy_half_columns(const TensorView& fc2, int64_t h, uint8_t* dst);
// The first `rows` rows of m (a view into the same bytes).
TensorView first_rows(const TensorView& m, int64_t rows);

// Writes to `active` (capacity n_ff) the sorted neuron indices predicted active for at least one
// of the n tokens x[t * n_embd ...] and returns their count. `scratch` holds
// predictor_scratch_floats() floats; afterwards scratch[0 .. n * n_ff) are the scores (token-major)
// and the hidden activations follow them. No allocation; threaded on `pool`.
// `linear`: no ReLU between fc1 and fc2 (a mirrored predictor's halves).
int64_t predict_active(ThreadPool& pool, const TensorView& fc1, const TensorView& fc2, float threshold,
                       const float* x, int64_t n_tokens, float* scratch, void* mm_scratch, int32_t* active,
                       bool linear = false);

// Opens a predictor GGUF, checks it against the model (one fc1/fc2 pair per layer, fc1
// [n_embd, rank], fc2 [rank, n_ff], F32 or F16) and binds the views to every layer's
// FfnWeights::fc1/fc2; the file stays mapped in model.side_files. Sets model.predictor_threshold
// from `powerinfer.sparse_threshold` (0 when absent). Errors name the file and what is wrong.
void attach_predictors(Model& model, const std::string& path);

// Layer l's predictor score threshold: Model::predictor_thresholds[l] where the file has them,
// else Model::predictor_threshold.
float predictor_threshold(const Model& model, int64_t layer);

// True when every layer has a predictor (attached, or bound from a sparse-ready file).
bool has_predictors(const Model& model);
// Bytes of all layers' predictor weights.
size_t predictor_bytes(const Model& model);

}  // namespace ember
