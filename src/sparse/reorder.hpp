// Neuron reordering, hot neurons first (PowerInfer section 5: the neurons a layer fires most go
// to the front, so that a placement is a prefix and the sparse kernels read the hot rows
// together). A permutation of a layer's neurons changes nothing in the output as long as it is
// applied to all of them at once: the rows of gate and up (and the up bias), the columns of down
// (the rows of the neuron-major down_t) and the rows of the predictor's fc2.
//
// A permutation `perm` lists, for each new position i, the original index perm[i] of the neuron
// that lands there.
#pragma once
#include <cstdint>
#include <vector>

#include "core/thread_pool.hpp"
#include "tensor/tensor_view.hpp"

namespace ember {

// Neurons by descending count; ties keep their original order (stable), so the result depends
// on the counts only.
std::vector<int32_t> hot_first_permutation(const float* counts, int64_t n);
// inverse[perm[i]] = i.
std::vector<int32_t> inverse_permutation(const std::vector<int32_t>& perm);
// Whether perm holds each of 0..n-1 exactly once.
bool is_permutation(const std::vector<int32_t>& perm, int64_t n);

// Row i of the result = row perm[i] of t (any type: rows are copied as bytes, exactly). For a
// 1-D tensor the "rows" are its elements (F32 only).
std::vector<uint8_t> permute_rows(const TensorView& t, const std::vector<int32_t>& perm);

// A bundle of matrices with a row per neuron (`ember prepare --bundle`): row i of the result, of
// `stride` bytes, is row perm[i] of each of `parts` in turn (rows copied as bytes; every part has
// perm.size() rows), then zeros.
std::vector<uint8_t> permute_bundle(const std::vector<TensorView>& parts, const std::vector<int32_t>& perm,
                                    size_t stride);

// The neuron-major form of an input-major down projection (ne = [n_ff, n_embd], as in GGUF) in
// `type`, its rows in the order perm: row i = column perm[i] of down. Quantized types are
// requantized along the other axis (n_embd must be a multiple of the block size).
std::vector<uint8_t> neuron_major_permuted(ThreadPool& pool, const TensorView& down, DType type,
                                           const std::vector<int32_t>& perm);

}  // namespace ember
