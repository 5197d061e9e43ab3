// CUDA kernels of the hybrid engine (built only when CMake finds a CUDA toolkit: EMBER_HAS_CUDA).
// This header has no CUDA includes, so plain C++ files can call it: pointers are device
// pointers unless named host_*, `stream` is a cudaStream_t passed as void*.
//
// Weights: F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K matrices. A block type is held on the device in the
// split layout of pack_matrix (every row's codes, then every row's block factors: the same bytes
// as GGUF's rows, with codes in aligned 16-byte vectors); F32 and F16 as they are. Activations of
// quantized rows are rounded to 8 bits first (quantize_q8: the CPU's Q8_1 values, in a split
// layout too) and multiplied in integers (dp4a); F32 and F16 rows take float activations. Every
// kernel sums in a fixed order and spreads over many blocks: results are deterministic.
//
//   quantize_q8:   x rows -> 8-bit codes and factors (as the CPU's quantize_row(Q8_1))
//   matvec:        for rows r of a RowSet (all, or ids[i] for i < *count on the device) and every
//                  token t: v = dot(W row r, x[t]) (+ bias[r]), then the Epilogue:
//                    store     y[t][i] = v                     add       y[t][i] += v
//                    relu      y[t][i] = max(v, 0)             gate_mul  y[t][i] = v * a[t][pos[i]]
//                    act       y[t][i] = act(v)                          (pos null: a[t][i])
//                    fire      y[t][i] = act(v), 0 where |act(v)| <= threshold (or where a row
//                              does not serve the token: allowed[t][row] = 0); counts[i] = tokens
//                              that fired (the FFN rule's firing test, model/ffn.hpp)
//                    select    mask[t][i] = 1 where v >= threshold for token t (every position;
//                              the predictor's per-token verdict), counts[i] = 1 where some token's
//                              is, for i < k (the share's positions, for compaction)
//                  A warp per row reads the row once for up to kMvTokens tokens; prompts of
//                  kGemmMinTokens or more run as tiles (each weight read once per 64 tokens).
//   compact:       the positions i < n (n = *n_valid, or max_n) with counts[i] > 0 in order:
//                  out_ids (ids[i], or i), out_pos (i); totals[0] = their number, totals[1] = the
//                  sum of the counts (the fired (token, neuron) pairs). Blocks of kCompactSpan
//                  positions, each counting the positions before it (no atomics).
//   sparse_axpy:   out[t][j] = sum_k h[t][k] * D row active[k] [j] (overwrites out): the active rows
//                  in axpy_chunks(n_tokens) interleaved chunks, each block one chunk's partial sums
//                  of a column tile into `partial`, then the chunks added in order (axpy_reduce);
//                  prompts of 64 tokens or more over 8-bit rows with TileMath::mma as a matrix
//                  product on tensor cores (bf16: the exact codes, h d in three parts)
//   ffn_merge:     the FFN block's end on the device: o = cpu + (the device's chunks added in
//                  order) + down_b (each part optional, in that order, as the hybrid merges on the
//                  host), then x += o, or o kept for a post-norm (the caller then norms and adds)
//   experts_gate_up, experts_down: a mixture's experts on the device, several in one launch: each
//                  expert's gate and up rows over its slots (h = up x * act(gate x), the gated
//                  rule of model/ffn.hpp), then its down rows over its slots' h; the matvec's
//                  warps and order of sums, so the same bits as three matvecs an expert
//   relu, add:     elementwise
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
void copy_device(void* dst, const void* src, size_t bytes, void* stream);            // async, on the device
void copy_to_device_sync(void* dst, const void* host_src, size_t bytes);
// Free and total memory of the current device (cudaMemGetInfo).
void mem_info(size_t* free_bytes, size_t* total_bytes);
void copy_to_host_sync(void* host_dst, const void* src, size_t bytes);
// Events: record one on a stream, wait for it on the host.
void* event_create();
void event_destroy(void* event);
void event_record(void* event, void* stream);
void event_sync(void* event);
// Events that time (for measurements): the milliseconds between two recorded, completed events.
void* timing_event_create();
float event_elapsed_ms(void* start, void* end);

// Kernels launched by this process so far through ops/cuda/ (each launch counts one, captured
// ones included): a device's counters take differences.
uint64_t launches();

// CUDA graphs: the work queued on `stream` between capture_begin and capture_end becomes a graph
// (its node count in *nodes), replayed by graph_launch. graphs_supported() is false where the
// runtime has none (the HIP CPU runtime of tools/cuda_on_cpu/).
bool graphs_supported();
void capture_begin(void* stream);
void* capture_end(void* stream, size_t* nodes);
void graph_launch(void* graph, void* stream);
void graph_destroy(void* graph);

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K: integer dot products (dp4a)
// with 8-bit activations; F32 and F16 take floats. A K-quant's block of 32 is multiplied against the same
// 32-value activation blocks with its factors from the super-block: Q4_K and Q5_K as Q4_1 (d sc and
// -dmin m), Q6_K as Q8_0 with a scale for each half (d sc).
constexpr bool takes_q8(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0 ||
         t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}
// True for the weight types the kernels read.
constexpr bool supports(DType t) { return takes_q8(t) || t == DType::F32 || t == DType::F16; }

// The device layout of `rows` rows of `cols` values of `type` from GGUF rows at src (host memory,
// row after row): block types split into codes and factors (see above), F32 and F16 copied.
// dst holds row_bytes(type, cols) * rows bytes.
void pack_matrix(DType type, const void* src, int64_t rows, int64_t cols, void* dst);

// xq = the n_tokens rows of `cols` values at x (a multiple of 32) rounded to 8 bits as the CPU's
// quantize_row(Q8_1) rounds them (tensor/quant.cpp): q = x * (127 / max|x|) rounded to nearest
// even, d = max|x| / 127 and s = d * sum(q) in fp16. Laid out as every block's 32 codes (token t's
// blocks from t * cols / 32 on), then every block's (d, s): gpu_q8_bytes(cols, n_tokens) bytes.
void quantize_q8(const float* x, int64_t n_tokens, int64_t cols, void* xq, void* stream);
// The CPU's Q8_1 blocks (tensor/quant.hpp's BlockQ8_1, 36 bytes each) of a device layout copied
// to the host (tests).
void q8_to_blocks(const void* host_xq, int64_t n_tokens, int64_t cols, void* host_blocks);

// What a matvec reads: the activations' float rows, and for weights that take them rounded to 8
// bits (takes_q8) their quantize_q8 layout, so the CPU and the device agree to the order of sums.
struct Activations {
  const float* f = nullptr;
  const void* q8 = nullptr;
};

// A matrix on the device (pack_matrix's layout).
struct Matrix {
  DType type = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
};

// The rows a matvec computes: all the matrix's (ids null), or ids[i] for i < *count (a device
// int; null: all max of them).
struct RowSet {
  const int32_t* ids = nullptr;
  const int32_t* count = nullptr;
  int64_t max = -1;  // -1: the matrix's rows
};

enum class Epilogue { store, add, relu, fire, select, gate_mul, act };
struct MatvecOut {
  Epilogue kind = Epilogue::store;
  float* y = nullptr;             // store, add, relu, fire, gate_mul: y[t * stride + i]
  int64_t stride = 0;             // 0: the row set's size
  const float* bias = nullptr;    // store, add: + bias[row]
  cpu::Activation act = cpu::Activation::relu;  // fire, act
  float threshold = 0.0f;         // fire: |act(v)| > threshold fires; select: v >= threshold
  int32_t* counts = nullptr;      // fire, select: per position
  int64_t k = 0;                  // select: positions below k are counted
  uint8_t* mask = nullptr;        // select: [n_tokens][mask_stride]
  int64_t mask_stride = 0;
  const uint8_t* allowed = nullptr;  // fire: [n_tokens][allowed_stride] by row (null: every row)
  int64_t allowed_stride = 0;
  const float* a = nullptr;       // gate_mul: a[t * a_stride + pos[i]] (pos null: + i)
  int64_t a_stride = 0;
  const int32_t* pos = nullptr;
};
constexpr int kMvTokens = 4;  // tokens a warp computes from one read of its row's weights
// From this many tokens on (prompts), products run as tiles of 64 rows x 64 tokens staged in
// shared memory (each weight read once per 64 tokens), fire and select counting with integer
// atomics. 8-bit products: the matvec's per-block terms, summed block after block (the same
// bits); F32 / F16: fused multiply-adds column after column (the same values to rounding).
constexpr int64_t kGemmMinTokens = 16;
// How the tiles multiply the 8-bit codes: tensor cores (mma.sync m16n8k32, a warp per 16 rows x 32
// tokens) or dp4a (a thread per 4 x 4). The same integer sums either way, so the same bits. With
// mma a long prompt's down (sparse_axpy) runs on tensor cores too (the same values to rounding). The
// default: mma on a card of compute capability 8.0 or more, dp4a on others and on the HIP CPU
// runtime (where mma is its definition written with shuffles, which the tests run);
// EMBER_CUDA_TILES=dp4a or mma overrides it.
enum class TileMath { dp4a, mma };
TileMath tile_math();
void set_tile_math(TileMath m);
void matvec(const Matrix& W, const RowSet& rows, Activations x, int64_t n_tokens, const MatvecOut& out, void* stream);
// The plain forms: y[t][r] = dot(W row r, x[t]) over all rows, and over the rows ids[i] for i <
// *n_rows (n_rows null: i < max_rows) of a matrix of w_rows rows into y[t * y_stride + i].
void matvec(DType type, const void* W, int64_t cols, int64_t rows, Activations x, int64_t n_tokens, float* y,
            void* stream);
void gather_matvec(DType type, const void* W, int64_t w_rows, int64_t cols, const int32_t* rows,
                   const int32_t* n_rows, int64_t max_rows, Activations x, int64_t n_tokens, float* y,
                   int64_t y_stride, void* stream);

// A mixture's experts run together. The slots of every expert are rows of one activation matrix
// (x: n_slots x n_embd; h: n_slots x n_ff; out: n_slots x n_embd), each expert's slots
// consecutive: first .. first + n - 1. Its matrices are in pack_matrix's layout; the experts of
// one call share their shape and types (gate's type equal to up's). A warp per row reads it once
// for up to kMvTokens of the expert's slots, as matvec does: meant for experts with few slots
// each (decode, small batches; an expert with a prompt's kGemmMinTokens slots is a matvec of its
// own, on the tiles). kExpertsPerLaunch experts a launch.
struct ExpertRun {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
  int32_t first = 0, n = 0;
};
struct ExpertShape {
  DType gate_up = DType::F32, down = DType::F32;
  int64_t n_embd = 0, n_ff = 0;
  cpu::Activation act = cpu::Activation::silu;
};
constexpr int kExpertsPerLaunch = 32;
// h[s][j] = dot(up row j, x[s]) * act(dot(gate row j, x[s])) for every slot s of every run.
void experts_gate_up(const ExpertShape& shape, const ExpertRun* runs, int n_runs, Activations x, int64_t n_slots,
                     float* h, void* stream);
// out[s][j] = dot(down row j, h[s]) for every slot s of every run.
void experts_down(const ExpertShape& shape, const ExpertRun* runs, int n_runs, Activations h, int64_t n_slots,
                  float* out, void* stream);

constexpr int kCompactSpan = 1024;  // positions a block of compact takes
// fired_total (a device uint64, or null): totals[1] added to it (statistics across calls).
void compact(const int32_t* counts, int64_t max_n, const int32_t* n_valid, const int32_t* ids, int32_t* out_ids,
             int32_t* out_pos, int32_t* totals, void* stream, uint64_t* fired_total = nullptr);

void relu(float* y, int64_t n, void* stream);
void add(const float* a, const float* b, float* out, int64_t n, void* stream);

// D: one row of `cols` per neuron (pack_matrix's layout of all its rows, n_rows of them); h
// stride h_stride; out: [n_tokens][cols], overwritten; partial: kAxpyChunks * cols floats.
constexpr int64_t kAxpyChunks = 64;
inline int64_t axpy_chunks(int64_t n_tokens) { return n_tokens >= kAxpyChunks ? 1 : kAxpyChunks / n_tokens; }
void sparse_axpy(DType type, const void* D, int64_t n_rows, int64_t cols, const int32_t* active,
                 const int32_t* n_active, const float* h, int64_t h_stride, int64_t n_tokens, float* out,
                 float* partial, void* stream);
// The partial sums only (sparse_axpy without its reduction, axpy_reduce), for ffn_merge.
void sparse_axpy_partial(DType type, const void* D, int64_t n_rows, int64_t cols, const int32_t* active,
                         const int32_t* n_active, const float* h, int64_t h_stride, int64_t n_tokens, float* partial,
                         void* stream);
// out[t][j] = the chunks of sparse_axpy_partial added in chunk order.
void axpy_reduce(const float* partial, int64_t cols, int64_t n_tokens, float* out, void* stream);
// n_tokens rows of `cols`: o = cpu (null: none) + the device's chunks (partial null: none) +
// down_b (null: none); then x += o, or, with keep_o, o written for the caller's post-norm.
void ffn_merge(float* x, float* o, const float* cpu, const float* partial, const float* down_b, int64_t cols,
               int64_t n_tokens, bool keep_o, void* stream);

}  // namespace ember::cuda
