// Causal multi-head attention with grouped-query heads, over a KV cache.
#pragma once
#include <cstdint>

#include "core/thread_pool.hpp"

namespace ember::cpu {

struct AttentionShape {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;       // applied to q.k (usually 1/sqrt(head_dim))
  int64_t window = 0;       // sliding window (keys within the last `window` positions); 0 = none
  float softcap = 0.0f;     // logit soft-capping (tanh), 0 = none
  bool kv_f16 = false;      // the K and V caches hold F16 (uint16_t) values, not float
};

// q:   [n_tokens][n_head * head_dim], token t sits at position pos0 + t.
// k,v: caches with rows of n_head_kv * head_dim values (float, or F16 when shape.kv_f16) at
//      stride kv_stride values per position, already holding positions 0 .. pos0 + n_tokens - 1.
// out: [n_tokens][n_head * head_dim].
// scratch: attention_scratch_floats(pos0 + n_tokens, n_head, head_dim, pool.size()) floats.
// A decode step (up to 4 tokens) over more than 512 visible positions with few heads to share
// out (fewer than 8 runs of heads that share a KV head, e.g. SmolLM2's 3 or Gemma-3's 1) splits
// the positions into equal chunks of at most 512 that run in parallel and are merged after
// (flash-decoding); the decision and the chunk edges depend only on the shapes, so the result
// does not depend on the thread count.
void attention(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n_tokens, int64_t pos0,
               const void* k, const void* v, int64_t kv_stride, float* out, float* scratch);
size_t attention_scratch_floats(int64_t n_ctx, int64_t n_head, int64_t head_dim, int n_threads);

namespace detail {
// Most heads the AVX-512 kernel takes together when they share a KV head (it takes the largest
// of 4, 3, 2 that divides n_head / n_head_kv, where there are enough such runs to keep the
// threads busy).
constexpr int kGroupHeads = 4;
}  // namespace detail

// Plain single-threaded reference of the same computation (tests), with float caches.
void attention_reference(const AttentionShape& shape, const float* q, int64_t n_tokens, int64_t pos0,
                         const float* k, const float* v, int64_t kv_stride, float* out);

}  // namespace ember::cpu
