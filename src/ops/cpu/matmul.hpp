// Dense matrix products with weights of any supported type, threaded over the pool.
//
// Y[t][r] = sum_i W[r][i] * X[t][i]   for t < n_tokens, r < rows(W), i < k = cols(W)
//
// X and Y are row-major float (token-major). For quantized weights the activations are first
// quantized once per call into the type the weight's dot product takes (Q8_0, Q8_1, Q8_K), as
// llama.cpp does; `scratch` holds them and must have matmul_scratch_bytes() bytes (allocated
// once by the caller, so the per-token path allocates nothing).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/thread_pool.hpp"
#include "tensor/tensor_view.hpp"

namespace ember::cpu {

size_t matmul_scratch_bytes(DType weight_type, int64_t k, int64_t n_tokens);

void matmul(ThreadPool& pool, const TensorView& W, const float* X, int64_t n_tokens, float* Y, void* scratch);

// The same product for a subset of rows [row_begin, row_end) of W, single-threaded, with
// activations already quantized by quantize_activations(). Y[t][r - row_begin] layout with
// row stride `y_stride`. Building block for matmul and for the neuron-sparse kernels.
void matmul_rows(const TensorView& W, const void* x_quantized, int64_t n_tokens, int64_t row_begin,
                 int64_t row_end, float* Y, int64_t y_stride);
void quantize_activations(DType weight_type, const float* X, int64_t n_tokens, int64_t k, void* out);

// For callers that run many matmul_rows calls on one activation (the neuron-sparse gather):
// rearranges the rows quantize_activations() wrote at the start of `scratch` (laid out as
// matmul_scratch_bytes() counts) into the layout the weight type's kernel reads, once (Q4_0/Q4_1
// quads: matmul_rows would redo it on every call), and returns what matmul_rows_prepared takes.
const void* prepare_activations(DType weight_type, void* scratch, int64_t n_tokens, int64_t k);
void matmul_rows_prepared(const TensorView& W, const void* x_prepared, int64_t n_tokens, int64_t row_begin,
                          int64_t row_end, float* Y, int64_t y_stride);

// out[t][:] = dequantized row ids[t] of W (embedding lookup).
void get_rows(const TensorView& W, const int32_t* ids, int64_t n, float* out);

// Dot product of one weight row of `type` with one quantized activation row (length k).
float vec_dot(DType type, int64_t k, const void* w_row, const void* x_quantized_row);

}  // namespace ember::cpu
