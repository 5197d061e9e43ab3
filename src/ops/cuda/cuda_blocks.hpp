// CUDA kernels of the attention block and the FFN block's norms (a layer whose attention the
// plan puts on the GPU, device/cuda/cuda_device.cpp), the counterparts of model/blocks.cpp's steps.
// Like cuda_ops.hpp: no CUDA includes, device pointers unless named host_*, `stream` a
// cudaStream_t as void*; every reduction in a fixed order, so results are deterministic.
//
//   norm_rows:    out[r] = norm(x[r]) * w (+ b) over rows of `width`: RMSNorm, or LayerNorm with
//                 an optional bias (cpu::rms_norm / cpu::layer_norm); w may be null (no weight);
//                 with xq also the output rounded to 8 bits (quantize_q8's layout), in the same
//                 launch. Out of place a row spreads over blocks of kNormSpan values, each
//                 computing the row's sums in the same order; in place (out == x) a block a row.
//   add_bias:     y[r][i] += b[i]                                       r < rows
//   add_inplace:  y[i] += x[i]                                          (the residual)
//   softcap:      y[i] = cap * tanh(y[i] / cap)                         (the output head)
//   rope_store:   per token t at position *pos0 + t: q's and k's heads rotated in their first
//                 n_rot dimensions (cpu::RopeTable: theta = pos * inv_freq[i] in double, cos and
//                 sin times attn_factor, pairs (2i, 2i+1) or (i, i + n_rot/2) for neox; none
//                 without a table), then k's and v's rows stored into the caches (F16 or F32) at
//                 the token's position: one launch for RoPE and the KV store
//   attention:    causal attention of q [n][n_head * head_dim] (token t at *pos0 + t) over the
//                 cache positions 0 .. *pos0 + t (from *pos0 + t - window + 1 with a sliding window),
//                 grouped-query heads, scaled scores, softmax; one block per (head, token, chunk
//                 of kAttnChunk positions), the chunks' partial softmaxes merged in order when
//                 there are several; the scores go through `scores` ([n][n_head][n_ctx] floats),
//                 the chunks' results through `partial` (attention_partial_floats). Positions are
//                 read on the device (a captured graph replays at any position); the launch takes
//                 the chunks of `max_positions` (>= *pos0 + n), those past the token left empty.
//                 Prompts (kAttnTilesMin tokens or more): one block per (head, 16 tokens), the key
//                 and value rows staged once for the 16, a running softmax over 16 keys at a time
//                 (the same values to float rounding; scores and partial unused).
#pragma once
#include <cstdint>

namespace ember::cuda {

constexpr int64_t kNormSpan = 256;  // values of a row one block normalizes (out of place)
void norm_rows(const float* x, const float* w, const float* b, float* out, int64_t rows, int64_t width, float eps,
               bool layer_norm, void* stream, void* xq = nullptr);
void add_bias(float* y, const float* b, int64_t rows, int64_t width, void* stream);
void add_inplace(float* y, const float* x, int64_t n, void* stream);
// y[i] = cap * tanh(y[i] / cap): the output head's soft-cap (Gemma 2)
void softcap(float* y, int64_t n, float cap, void* stream);

struct RopeArgs {
  const double* inv_freq = nullptr;  // null: no rotation (learned positions, OPT)
  int64_t n_rot = 0;
  double attn_factor = 1.0;
  bool neox = false;
};
void rope_store(float* q, float* k, const float* v, int64_t n_tokens, int64_t n_head, int64_t n_head_kv,
                int64_t head_dim, const int32_t* pos0, const RopeArgs& rope, void* k_cache, void* v_cache, bool f16,
                void* stream);

// Positions per chunk of the attention (flash decoding: a long context is split into chunks that
// run in parallel, their partial softmaxes merged after), and the chunks for `positions` cached
// positions.
constexpr int64_t kAttnChunk = 256;
constexpr int64_t kAttnTilesMin = 16;  // tokens from which a step's attention runs as tiles
inline int64_t attention_chunks(int64_t positions) { return (positions + kAttnChunk - 1) / kAttnChunk; }
// Floats of the partial results: per token and head, per chunk, (max, sum, head_dim values).
inline int64_t attention_partial_floats(int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_ctx) {
  return n_tokens * n_head * attention_chunks(n_ctx) * (head_dim + 2);
}
struct AttentionArgs {
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0, n_ctx = 0;
  float scale = 1.0f;
  int64_t window = 0;  // 0: none
  bool f16 = true;     // the cache's values
};
void attention(const AttentionArgs& a, const float* q, int64_t n_tokens, const int32_t* pos0, int64_t max_positions,
               const void* k_cache, const void* v_cache, float* out, float* scores, float* partial, void* stream);

}  // namespace ember::cuda
