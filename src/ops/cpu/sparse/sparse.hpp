// Neuron-sparse FFN kernels (PowerInfer, arXiv 2312.12456, section 5.3): only the rows of gate
// and up and the neuron-major rows of down that belong to active neurons are read.
//
//   gather_matmul:  Y[t][i] = dot(W row active[i], X[t])          (gate and up: a row per neuron)
//   sparse_axpy:    out[t] += sum_i H[t][i] * D_nm row active[i]    (down, stored neuron-major)
//
// `active` lists neuron (row) indices, each in [0, rows), in any order, without duplicates for
// sparse_axpy (a duplicate would simply be added twice). Every weight type the dense matmul
// supports works (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K).
//
// One token (decode) at the AVX-512 level: the 4-bit gathers (Q4_0, Q4_1) and the axpy over
// Q8_0 / Q4_0 / Q4_1 rows run grouped kernels that keep eight scattered rows in flight
// (sparse/sparse_avx512.cpp); their results are bit-identical to the row-at-a-time kernels.
//
// Threads are balanced by the number of active neurons, never by index ranges (active neurons
// cluster: a range split would leave threads idle). Neither kernel lets two threads add into one
// float, and each output element is always accumulated in the same order, so results are
// deterministic (see AxpySplit for which split is bit-identical across thread counts).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/aligned_buffer.hpp"
#include "core/thread_pool.hpp"
#include "tensor/tensor_view.hpp"

namespace ember::cpu {

// ---- gather-matmul (gate, up) --------------------------------------------------------------

// Bytes of `scratch` gather_matmul needs (the quantized activations), = matmul_scratch_bytes.
size_t gather_matmul_scratch_bytes(DType weight_type, int64_t k, int64_t n_tokens);

// Y[t * y_stride + i] = dot(W row active[i], X[t]) for t < n_tokens, i < n_active. X is
// token-major float (n_tokens x cols(W)); activations are quantized once per call. The active
// list is split over the threads in equal counts; runs of consecutive indices go to the dense
// row kernel in one call.
void gather_matmul(ThreadPool& pool, const TensorView& W, const float* X, int64_t n_tokens, const int32_t* active,
                   int64_t n_active, float* Y, int64_t y_stride, void* scratch);

// The same on one thread with activations already quantized by quantize_activations().
void gather_matmul_rows(const TensorView& W, const void* x_quantized, int64_t n_tokens, const int32_t* active,
                        int64_t n_active, float* Y, int64_t y_stride);

// ---- axpy over a neuron-major down projection ---------------------------------------------

// How sparse_axpy spreads work over threads.
//  columns: every thread takes all active neurons but only its slice of the output columns
//           (slices of whole blocks, at least kAxpyMinSlice wide). Each output element is the
//           same chain out += H[0] w0 + H[1] w1 + ... in list order whatever the split, so the
//           result is bit-identical for every thread count. The default.
//  neurons: PowerInfer's split: each thread takes an equal share of the active list for the
//           whole width and accumulates into its own partial vector; the partials are then
//           added to out in thread order. Bit-identical run to run for a fixed thread count
//           (PowerInfer's CPU axpy adds into the shared output without synchronization).
enum class AxpySplit { columns, neurons };
constexpr int64_t kAxpyMinSlice = 256;

// Floats of `scratch` sparse_axpy needs: per-thread dequantization rows, plus the per-thread
// partial outputs of the neurons split.
size_t sparse_axpy_scratch_floats(int64_t n_embd, int64_t n_tokens, int n_threads, AxpySplit split);

// out[t * out_stride + j] += sum_i H[t * h_stride + i] * D_nm[active[i]][j] for j < cols(D_nm).
// D_nm holds one row of n_embd = cols(D_nm) per neuron, in any supported type; quantized rows
// are dequantized block by block on the fly. Zero H entries are skipped (exact: they add 0).
void sparse_axpy(ThreadPool& pool, const TensorView& D_nm, const int32_t* active, int64_t n_active, const float* H,
                 int64_t n_tokens, int64_t h_stride, float* out, int64_t out_stride, float* scratch,
                 AxpySplit split = AxpySplit::columns);

// One thread's share: neurons list[0..n) for columns [col_begin, col_end) (multiples of the
// block size, or col_end = cols). `tmp` holds col_end - col_begin floats.
void sparse_axpy_rows(const TensorView& D_nm, const int32_t* active, int64_t n_active, const float* H,
                      int64_t n_tokens, int64_t h_stride, int64_t col_begin, int64_t col_end, float* out,
                      int64_t out_stride, float* tmp);

// ---- up and down together (one token) ------------------------------------------------------

// The tail of a one-token sparse FFN on one thread, for the listed neurons in list order:
// h[i] = dot(up row active[i], x) * g[i], then out[0..cols(D_nm)) += h[i] * D_nm row active[i]
// (a zero h[i] adds nothing). x_quantized as quantize_activations(up.type) makes it; `tmp` holds
// cols(D_nm) floats. Bit for bit gather_matmul_rows, the products and sparse_axpy_rows over all
// columns; at the AVX-512 level, for 4-bit up and row-wise Q8_0 / Q4_0 / Q4_1 down rows, one pass
// that alternates groups of up rows with their down rows (sparse/sparse_avx512.cpp), so that the next
// group's loads are in flight while this group's arithmetic runs.
void sparse_up_down_rows(const TensorView& up, const void* x_quantized, const TensorView& D_nm, const int32_t* active,
                         int64_t n_active, const float* g, float* h, float* out, float* tmp);

// ---- the neuron-major copy of down ---------------------------------------------------------

// Which type a neuron-major copy of a down matrix of type `down_type` is stored in.
//  exact:   F32, F16 and BF16 stay as they are (a transpose, bit-exact). With `shared_scales`,
//           Q4_0 and Q4_1 become Q4_0_NM / Q4_1_NM (ops/cpu/nm4/nm4.hpp): the file's codes and
//           scales, bit-exact, in the file's bytes, with the scales in a table shared by 32
//           neurons (so rows alone cannot be copied elsewhere: the hybrid devices do not take
//           it); Q4_K becomes Q4_1_NM too, its codes kept and each sub-block's d sc and -dmin m
//           rounded to fp16. Other quantized types (and these without `shared_scales`) become Q8_0:
//           the transpose cannot keep their blocks (they run along the other axis), so each
//           value is requantized, and Q8_0 keeps that second rounding at 8 bits (relative error
//           ~0.4% of a block's largest value; the dense path rounds the activations to 8 bits
//           too), at 34/18 the bytes of Q4_0.
//  compact: as exact, but Q4_0 / Q4_1 / Q4_K become Q4_0_NM8 / Q4_1_NM8: the same codes, the
//           scale tables as u8 codes with an fp16 scale and base per 32 outputs (each table
//           value within half a step, 1/510, of its group's range): the tables take 9/16 the
//           bytes, a kept row with its share 9-15 % fewer (docs/agreement.md measures what it
//           costs, docs/benchmarks.md what it gains: no decode speed on 2 cores).
//  same:    the type of down (PowerInfer's ffn_down_t): smallest, but a quantized matrix is
//           rounded twice (error about sqrt(2) times the type's own).
//  q8_0:    Q8_0 for every type (what `exact` gives a quantized type without shared scales).
//  f32/f16: dequantized values as floats (F32 exact; F16 rounds to 11 bits).
enum class NeuronMajorType { exact, same, q8_0, f32, f16, compact };  // (values in plan cache keys: append)
DType neuron_major_dtype(DType down_type, NeuronMajorType choice, int64_t n_embd, bool shared_scales = false);

struct NeuronMajorMatrix {
  AlignedBuffer<uint8_t> bytes;
  TensorView view;  // ne[0] = n_embd (columns), ne[1] = n_ff (one row per neuron)
};

// Builds the neuron-major copy of `down` (ne[0] = n_ff, ne[1] = n_embd, input-major as in GGUF):
// row j of the result is column j of down, dequantized and quantized to `type` (which needs
// n_embd to be a multiple of its block size), or for the Q4_*_NM* types transposed code by code.
// Threaded over neurons.
NeuronMajorMatrix make_neuron_major(ThreadPool& pool, const TensorView& down, DType type);

// Row i of a neuron-major matrix as floats (cols() values), for every type above.
void dequantize_neuron(const TensorView& D_nm, int64_t i, float* dst);

// Bytes one neuron of a neuron-major matrix of type t takes: its row, and for the Q4_*_NM* types
// its share of the scale tables (one 32nd of a block's, rounded up).
uint64_t neuron_major_row_bytes(DType t, int64_t n_embd);

// Rows ids[0..n) of the neuron-major matrix D_nm, in that order, as a matrix of their own in
// `type` (a row-wise type: not a Q4_*_NM* one): copied as they are where the type is D_nm's,
// else dequantized (dequantize_neuron) and quantized to `type`. What a hybrid device holds of a
// layer's down (device/device.hpp). Threaded over rows.
NeuronMajorMatrix neuron_major_rows(ThreadPool& pool, const TensorView& D_nm, const int32_t* ids, int64_t n,
                                    DType type);

}  // namespace ember::cpu
