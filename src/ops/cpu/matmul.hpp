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
#include <span>

#include "core/thread_pool.hpp"
#include "ops/cpu/activation.hpp"
#include "tensor/tensor_view.hpp"

namespace ember::cpu {

size_t matmul_scratch_bytes(DType weight_type, int64_t k, int64_t n_tokens);

void matmul(ThreadPool& pool, const TensorView& W, const float* X, int64_t n_tokens, float* Y, void* scratch);

// Products of several matrices with the same X (Q, K and V of a layer): X is quantized once and
// all of them run in one dispatch over the pool (one wake-up and one barrier instead of one per
// matrix). Every matrix must have the type and width of the first; y gets n_tokens x rows(w)
// floats as from matmul(), and the results are bit-identical to separate matmul() calls. The
// scratch is the one matmul() takes for the first matrix.
struct MatmulOut {
  const TensorView& w;
  float* y;
};
void matmul_multi(ThreadPool& pool, std::span<const MatmulOut> outs, const float* X, int64_t n_tokens, void* scratch);

// The first half of a gated FFN in one dispatch: out = act(gate X) * (up X), n_tokens x rows.
// up_buf receives up X (same size). In decode each thread gates the neurons whose gate and up
// rows it computed. Bit-identical to two matmul() calls followed by gated_activation().
void matmul_gated(ThreadPool& pool, const TensorView& gate, const TensorView& up, Activation act, const float* X,
                  int64_t n_tokens, float* out, float* up_buf, void* scratch);

// One token (decode) through several gated products in one dispatch (a mixture's chosen
// experts): outs[i].out = act(gate_i x) * (up_i x), outs[i].up_buf = up_i x, x quantized once
// (every gate and up of one type and width). Bit-identical to matmul_gated for each. At most 8.
struct GatedOut {
  const TensorView* gate;
  const TensorView* up;
  float* out;
  float* up_buf;
};
void matmul_gated_each(ThreadPool& pool, std::span<const GatedOut> outs, Activation act, const float* x,
                       void* scratch);

// One token (decode) through several matrices with an input each, in one dispatch: y_i = W_i x_i
// (every W_i of one type and width; each x_i quantized once). Bit-identical to matmul() for
// each. At most 8; the scratch is matmul_each_scratch_bytes(type, width, jobs).
struct MatmulJob {
  const TensorView* w;
  const float* x;
  float* y;
};
size_t matmul_each_scratch_bytes(DType weight_type, int64_t k, size_t n_jobs);
void matmul_each(ThreadPool& pool, std::span<const MatmulJob> jobs, void* scratch);

// The same product for a subset of rows [row_begin, row_end) of W, single-threaded, with
// activations already quantized by quantize_activations(). Y[t][r - row_begin] layout with
// row stride `y_stride`. Building block for matmul and for the neuron-sparse kernels.
void matmul_rows(const TensorView& W, const void* x_quantized, int64_t n_tokens, int64_t row_begin,
                 int64_t row_end, float* Y, int64_t y_stride);
void quantize_activations(DType weight_type, const float* X, int64_t n_tokens, int64_t k, void* out);

// matmul() runs a prompt in blocks of this many tokens: a caller that runs rows of W over its
// own tokens (matmul_rows_prepared) in the same blocks gets, for those rows, the bits matmul()
// gives (a kernel's tile for several tokens may round apart from its one-token tile).
constexpr int64_t kMatmulTokenBlock = 64;

// X quantized once (over the pool) into the layout W's kernel reads, for products whose tokens
// are chosen later (a mixture's prompt: each expert over the tokens that chose it): n_tokens
// rows of `stride` = prepared_row_bytes() bytes each, in `scratch` (matmul_scratch_bytes()), or
// X itself for float weights. A row may be copied anywhere (gathered) and handed, `stride`
// apart, to matmul_rows_prepared.
struct PreparedRows {
  const uint8_t* x;
  size_t stride;
};
size_t prepared_row_bytes(DType weight_type, int64_t k);
PreparedRows prepare_rows(ThreadPool& pool, DType weight_type, const float* X, int64_t n_tokens, int64_t k,
                          void* scratch);

// For many matmul_rows calls on the same activations (the gather over scattered active rows):
// rearranges quantize_activations() rows once into the layout W's kernel reads (a per-thread
// buffer, valid until the thread's next call; the rows themselves when no rearranging is
// needed) and sets *x_stride; matmul_rows_prepared then runs rows [row_begin, row_end) on them.
const void* prepare_activations(DType weight_type, const void* x_quantized, int64_t n_tokens, int64_t k,
                                size_t* x_stride);
void matmul_rows_prepared(const TensorView& W, const void* x_prepared, size_t x_stride, int64_t n_tokens,
                          int64_t row_begin, int64_t row_end, float* Y, int64_t y_stride);

// out[t][:] = dequantized row ids[t] of W (embedding lookup).
void get_rows(const TensorView& W, const int32_t* ids, int64_t n, float* out);

// Dot product of one weight row of `type` with one quantized activation row (length k).
float vec_dot(DType type, int64_t k, const void* w_row, const void* x_quantized_row);

}  // namespace ember::cpu
