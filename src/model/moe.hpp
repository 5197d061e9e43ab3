// The mixture-of-experts FFN (MoeWeights, model/model.hpp), as llama.cpp's build_moe_ffn with
// softmax gating computes it:
//
//   p = softmax(router x)                                 over the n_expert experts
//   E = the n_used experts of largest p                   (ties: the lower index)
//   w_e = p_e / sum_{e' in E} p_e'   (norm_weights)       else w_e = p_e
//   out = sum_{e in E} w_e * expert_e(x)                  expert_e: a dense SwiGLU FFN
//
// Tokens are grouped by expert, so each chosen expert runs once per batch over the tokens that
// chose it (the same kernels as a dense layer) and an unchosen expert is never read. Each
// token's sum is taken in ascending expert order: deterministic.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "core/thread_pool.hpp"
#include "model/ffn.hpp"
#include "model/workspace.hpp"
#include "model/model.hpp"

namespace ember {

// The experts token t chose (ids[t * n_used ..]) and their weights, from the router's logits
// (n x n_expert, overwritten with the probabilities); `order` holds n_expert ints of scratch.
void moe_route(const MoeWeights& moe, float* logits, int64_t n, int32_t* ids, float* weights, int32_t* order);

// A prompt's experts run over blocks of up to this many neurons (gate, up) and output columns
// (down), moe_block's choice; a thread's tile of results holds a block's columns for a token block.
constexpr int64_t kMoeBlockMax = 256;

// out (n x n_embd) = the mixture's output for x (n x n_embd), in the buffers Workspace::init sized.
// One token (decode) runs its chosen experts fused: every gate and up in one dispatch on one
// quantization of x, then every down in a second; a prompt runs its tokens grouped by expert
// in four dispatches without copying a float (moe.cpp's moe_prompt). Both give the same bits as
// the grouped loop (each chosen expert a dense_ffn over its tokens' copied rows), which
// `grouped` forces: the reference the tests hold them to.
//
// `in` (optional) changes what the experts read, for executors that zero inputs (input sparsity):
// the experts take in.experts_x in place of x (the router still reads x), and in.values(h, rows,
// n_ff) is called on the neuron values (rows x n_ff, one row per token and chosen expert) before
// the downs read them. The same paths, so the same bits as the grouped loop given the same.
struct MoeInputs {
  const float* experts_x = nullptr;  // n x n_embd; null: x
  FfnValuesHook values;  // empty: the values as computed
};
void moe_ffn(ThreadPool& pool, const MoeWeights& moe, cpu::Activation act, const float* x, int64_t n, float* out,
             Workspace& ws, bool grouped = false, const MoeInputs& in = {});

// The grouped loop with each expert's FFN run by `expert(e, rows, m, out)`: out (m x n_embd) =
// expert e of the rows (m x n_embd) of the tokens that chose it, what dense_ffn computes; the
// routing and each token's weighted sum as moe_ffn. For executors that look inside the experts
// (the profiler); `expert` may use the workspace's gate and up buffers.
using ExpertFfn = std::function<void(int64_t e, const float* rows, int64_t m, float* out)>;
void moe_ffn_each(ThreadPool& pool, const MoeWeights& moe, const float* x, int64_t n, float* out, Workspace& ws,
                  const ExpertFfn& expert);

// A mixture split between a device and the CPU (the hybrid executor, device/device.hpp), bit for
// bit what moe_ffn computes:
//   moe_route_slots: the router's choice of n tokens (moe_route) grouped into slots by expert in
//     the workspace (ws.moe_first: expert e's slots [first[e], first[e + 1]), each expert's tokens
//     ascending; moe_tokens / moe_token_w per slot; moe_active: the chosen experts ascending);
//     returns how many experts were chosen. moe_group_slots: the same from choices already in
//     ws.moe_ids (a device given the host's routing).
//   moe_expert_rows: each listed expert's output (unweighted) for each of its slots, in the token
//     blocks moe_ffn runs: rows holds one n_embd row per slot, the listed experts' slots in order.
//   moe_merge_rows: out = each token's weighted sum of its experts' rows in ascending expert
//     order (expert_rows[a]: the first row of the a-th chosen expert, ws.moe_active[a]).
// moe_split_refusal says why a layer's experts cannot be split (the fused paths' rule), or empty.
int64_t moe_route_slots(ThreadPool& pool, const MoeWeights& moe, const float* x, int64_t n, Workspace& ws);
int64_t moe_group_slots(const MoeWeights& moe, int64_t n, Workspace& ws);
void moe_expert_rows(ThreadPool& pool, const MoeWeights& moe, cpu::Activation act, const float* x, int64_t n,
                     const int32_t* experts, int64_t count, Workspace& ws, float* rows);
void moe_merge_rows(const MoeWeights& moe, int64_t n, const Workspace& ws, const float* const* expert_rows,
                    int64_t n_active, float* out);
std::string moe_split_refusal(const MoeWeights& moe);

}  // namespace ember
