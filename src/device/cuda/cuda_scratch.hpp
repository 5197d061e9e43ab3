// The buffers CUDA's kernels keep in its arena beside the common scratch (sparse/placement.hpp's
// DeviceScratch), and the sizes of its 8-bit activations and firing counts: known in every build
// (a plan for a CUDA device is made and checked anywhere).
#pragma once
#include <cstdint>

#include "device/device.hpp"
#include "sparse/placement.hpp"

namespace ember {

// n_tokens rows of `cols` activations rounded to 8 bits in Q8_1 blocks of 32 (36 bytes each, the
// last block of a row padded): what CUDA's quantized matvecs read (cuda::quantize_q8).
inline uint64_t gpu_q8_bytes(int64_t cols, int64_t n_tokens) {
  return static_cast<uint64_t>((cols + 31) / 32) * 36 * static_cast<uint64_t>(n_tokens);
}
// CUDA's firing counts of an FFN layer: a 64-bit total of the fired (token, neuron) pairs, then
// an int32 per neuron (cuda::compact reads them).
uint64_t gpu_ffn_counts_bytes(const PlanModel& m);

// CUDA's own buffers of each side, as offsets in its arena. The FFN side: the share positions
// (n_ff, then two counters: active, fired), the down axpy's partial sums (cuda::sparse_axpy:
// kAxpyChunks rows of n_embd), the input in 8 bits, the firing counts (gpu_ffn_counts_bytes); with
// predictors their hidden layer (rank), the prediction per token (max_batch x n_ff bytes), the
// predicted share rows (n_ff, then their count and a spare: cuda::compact's totals), the input and
// the hidden layer in 8 bits. The attention side: the hidden state, the norm's output, the block's
// output (n_embd floats each), q, k, v, the attention's output, the scores
// ([max_batch][n_head][n_ctx]), the RoPE tables' inverse frequencies (head_dim / 2 doubles, global
// then local), the block's inputs in 8 bits (n_embd or q_dim values), the attention's partial
// results over chunks of the context (cuda_blocks.hpp), and the positions of the rows' sequences
// (max_batch int32). The experts' side: the slots' inputs and neuron values (n_ff_expert floats)
// in 8 bits, and those values.
struct CudaScratchLayout {
  struct Ffn {
    uint64_t pos = 0, partial = 0, xq = 0, counts = 0, hid = 0, mask = 0, cand = 0, pxq = 0, hidq = 0;
  } ffn;
  struct Attention {
    uint64_t x_hidden = 0, xn = 0, o = 0, q = 0, k = 0, v = 0, att = 0, scores = 0, rope = 0, rope_local = 0,
             aq = 0, attn_partial = 0, positions = 0;
  } attn;
  struct Experts {
    uint64_t ex_xq = 0, ex_h = 0, ex_hq = 0;
  } ex;
};
// Those of an arena laid out for a plan (device_arena_layout): each side's from where its own
// buffers begin (DeviceArenaLayout::ffn_own, attn_own, experts_own), for the sides it keeps.
CudaScratchLayout cuda_scratch_layout(const DeviceArenaLayout& a, const PlanModel& m, const PlanOptions& opts,
                                      const Plan& plan);

// CUDA's DeviceScratch (PlanOptions::scratch for a CUDA session; DeviceCaps::scratch).
const DeviceScratch& cuda_scratch();

}  // namespace ember
