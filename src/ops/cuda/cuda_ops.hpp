// CUDA kernels of the hybrid engine (built only when CMake finds a CUDA toolkit: EMBER_HAS_CUDA).
// This header has no CUDA includes, so plain C++ files can call it: pointers are device
// pointers unless named host_*, `stream` is a cudaStream_t passed as void*.
//
// Weight rows are in GGUF block layouts (F32, F16, Q8_0, Q4_0, Q4_1), read as they are stored; the
// activations of quantized rows are rounded to 8 bits first (Q8_1 blocks, quantize_q8), as the
// CPU's kernels round them, and multiplied in integers (dp4a); F32 and F16 rows take float
// activations. Every kernel sums in a fixed order: results are deterministic.
//
//   quantize_q8:    x rows -> Q8_1 blocks (as the CPU's quantize_row)
//   matvec:         y[t][r]  = dot(W row r, x[t])                       r < rows
//   gather_matvec:  y[t][i]  = dot(W row rows[i], x[t])                 i < *n_rows (device count)
//   ffn_fire:       act(y) in place; zero where |.| <= threshold; the firing positions
//                   (any token) compacted, in order, into active (rows[i]) and pos (i), their
//                   count into n_active[0], the fired (token, position) pairs into n_active[1]
//   relu:           y[i] = max(y[i], 0)                                   (the predictor's hidden layer)
//   predict_select: scores [t][n_ff] in predictor_row_order (engine/device.hpp): the share's
//                   positions i < k with score >= threshold for some token compacted, in order,
//                   into cand (their count into *n_cand); mask[c] = the same test for position k + c
//   gate_mul:       h[t][k] *= act[t][pos[k]]                           k < *n_active
//   sparse_axpy:    out[t][j] = sum_k h[t][k] * D row active[k] [j]     (overwrites out): the
//                   active rows in max(1, kAxpyChunks / n_tokens) interleaved chunks, each block
//                   one chunk's partial sums of a column tile into `partial`, then the chunks
//                   added in order (no atomics)
//   add:            out[i] = a[i] + b[i]                                (the partial-sum merge)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/cpu/activation.hpp"
#include "tensor/dtype.hpp"

namespace ember::cuda {

// Whether a CUDA device can be used; `why` says why not.
bool available(std::string* why);
std::string device_name();

// Thin wrappers of the runtime (each throws ember::Error naming the failed call).
void* malloc_device(size_t bytes);
void free_device(void* p);
void* malloc_host_pinned(size_t bytes);
void free_host_pinned(void* p);
void* stream_create();
void stream_destroy(void* stream);
void stream_sync(void* stream);
void copy_to_device(void* dst, const void* host_src, size_t bytes, void* stream);    // async
void copy_to_host(void* host_dst, const void* src, size_t bytes, void* stream);      // async
void copy_to_device_sync(void* dst, const void* host_src, size_t bytes);
// Free and total memory of the current device (cudaMemGetInfo).
void mem_info(size_t* free_bytes, size_t* total_bytes);
void copy_to_host_sync(void* host_dst, const void* src, size_t bytes);

// True for the weight types the kernels read.
bool supports(DType t);

// What a matvec reads: the activations' float rows, and for weights that take them rounded to 8
// bits (takes_q8) their Q8_1 blocks from quantize_q8, as the CPU's kernels round activations for
// quantized weights (so the two agree to the order of float sums).
struct Activations {
  const float* f = nullptr;
  const void* q8 = nullptr;
};
bool takes_q8(DType t);  // Q4_0, Q4_1, Q8_0: integer dot products (dp4a) with Q8_1 activations
// xq = the n_tokens rows of `cols` values at x (a multiple of 32) in Q8_1 blocks, exactly as the
// CPU's quantize_row(Q8_1) rounds them (tensor/quant.cpp): q = x * (127 / max|x|) rounded to
// nearest even, d = max|x| / 127 and s = d * sum(q) in fp16 (the CPU's Q8_0 blocks are the same
// d and q). Token t's blocks start at t * cols / 32 blocks.
void quantize_q8(const float* x, int64_t n_tokens, int64_t cols, void* xq, void* stream);

void matvec(DType type, const void* W, int64_t cols, int64_t rows, Activations x, int64_t n_tokens, float* y,
            void* stream);
// y has stride y_stride per token; n_rows points to a device int32 (<= max_rows).
void gather_matvec(DType type, const void* W, int64_t cols, const int32_t* rows, const int32_t* n_rows,
                   int64_t max_rows, Activations x, int64_t n_tokens, float* y, int64_t y_stride, void* stream);
// act: [n_tokens][n] in place; active/pos: n ints each; n_active: two ints, the firing
// positions and the fired (token, position) pairs.
// n_valid (a device int, or null): only the first *n_valid positions of each token's row of n.
void ffn_fire(cpu::Activation act, float threshold, float* y, int64_t n, int64_t n_tokens, const int32_t* rows,
              int32_t* active, int32_t* pos, int32_t* n_active, void* stream, const int32_t* n_valid = nullptr);
void relu(float* y, int64_t n, void* stream);
void predict_select(const float* scores, int64_t n_ff, int64_t n_tokens, float threshold, int64_t k, uint8_t* mask,
                    int32_t* cand, int32_t* n_cand, void* stream);
// Events: record one on a stream, wait for it on the host.
void* event_create();
void event_destroy(void* event);
void event_record(void* event, void* stream);
void event_sync(void* event);
// h: [n_tokens][max_rows] with stride max_rows; act: [n_tokens][n] stride n.
void gate_mul(float* h, const float* act, int64_t n, const int32_t* pos, const int32_t* n_active, int64_t max_rows,
              int64_t n_tokens, void* stream);
// D: one row of `cols` per neuron; h stride h_stride; out: [n_tokens][cols], overwritten;
// partial: kAxpyChunks * cols floats of scratch.
constexpr int64_t kAxpyChunks = 32;
void sparse_axpy(DType type, const void* D, int64_t cols, const int32_t* active, const int32_t* n_active,
                 const float* h, int64_t h_stride, int64_t n_tokens, float* out, float* partial, void* stream);
void add(const float* a, const float* b, float* out, int64_t n, void* stream);

}  // namespace ember::cuda
