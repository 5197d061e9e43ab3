#include "model/moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <utility>

#include "core/aligned_buffer.hpp"
#include "core/error.hpp"
#include "model/expert_cache.hpp"
#include "model/ffn.hpp"
#include "ops/cpu/matmul.hpp"

namespace ember {

void moe_route(const MoeWeights& moe, float* logits, int64_t n, int32_t* ids, float* weights, int32_t* order) {
  const int64_t ne = moe.n_expert(), k = moe.n_used;
  for (int64_t t = 0; t < n; ++t) {
    float* p = logits + t * ne;
    const float mx = *std::max_element(p, p + ne);
    double sum = 0;
    for (int64_t e = 0; e < ne; ++e) sum += (p[e] = std::exp(p[e] - mx));
    for (int64_t e = 0; e < ne; ++e) p[e] = static_cast<float>(p[e] / sum);
    std::iota(order, order + ne, 0);
    std::partial_sort(order, order + k, order + ne,
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float total = 0;
    for (int64_t i = 0; i < k; ++i) total += p[order[i]];
    // llama.cpp clamps the sum below at 2^-14 before dividing.
    const float norm = moe.norm_weights ? 1.0f / std::max(total, 6.103515625e-5f) : 1.0f;
    for (int64_t i = 0; i < k; ++i) {
      ids[t * k + i] = order[i];
      weights[t * k + i] = p[order[i]] * norm;
    }
  }
}

namespace {

// o[c] += w * r[c]: a token's sum of its experts' outputs, one expert at a time (every path).
void add_weighted(float* o, float w, const float* r, int64_t n) {
  for (int64_t c = 0; c < n; ++c) o[c] += w * r[c];
}

// Whether expert e runs in the fused paths beside e0 (the first one chosen): a gated product
// (dense_ffn's one-dispatch case, so the same bits) with a down and no down bias, of e0's types
// and widths (one quantization of the input serves every gate and up, one of the values every
// down).
bool fusable(const FfnWeights& e0, const FfnWeights& e) {
  return ffn_gated_product(e) && e.down.valid() && !e.down_b.valid() && e.gate.type == e0.gate.type &&
         e.down.type == e0.down.type && e.n_ff() == e0.n_ff() && e.n_embd() == e0.n_embd();
}

// Whether one token's chosen experts (ids, n_used of them) can run fused (moe_decode): at most 8.
bool fused_decode(const MoeWeights& moe, const int32_t* ids, const Workspace& ws) {
  if (moe.n_used > 8 || ws.moe_each_scratch.empty()) return false;
  const FfnWeights& e0 = moe.experts[static_cast<size_t>(ids[0])];
  for (int64_t i = 0; i < moe.n_used; ++i)
    if (!fusable(e0, moe.experts[static_cast<size_t>(ids[i])])) return false;
  return true;
}

// One token: its k chosen experts' gates and ups in one dispatch (x quantized once), their downs
// in a second, summed in ascending expert order: bit for bit what the grouped loop computes.
void moe_decode(ThreadPool& pool, const MoeWeights& moe, cpu::Activation act, const float* x, float* out,
                Workspace& ws, const MoeInputs& in) {
  const int64_t d = moe.router.cols(), k = moe.n_used;
  int32_t* ids = ws.moe_ids.data();
  float* w = ws.moe_weights.data();
  for (int64_t i = 1; i < k; ++i)  // ascending expert order, the weights alongside
    for (int64_t j = i; j > 0 && ids[j - 1] > ids[j]; --j) std::swap(ids[j - 1], ids[j]), std::swap(w[j - 1], w[j]);
  const int64_t n_ff = moe.experts[static_cast<size_t>(ids[0])].n_ff();
  cpu::GatedOut gated[8];
  cpu::MatmulJob downs[8];
  for (int64_t i = 0; i < k; ++i) {
    const FfnWeights& e = moe.experts[static_cast<size_t>(ids[i])];
    float* h = ws.moe_values.data() + i * n_ff;
    gated[i] = {&e.gate, &e.up, h, ws.moe_up.data() + i * n_ff};
    downs[i] = {&e.down, h, ws.moe_each_out.data() + i * d};
  }
  const auto used = static_cast<size_t>(k);
  cpu::matmul_gated_each(pool, std::span<const cpu::GatedOut>(gated, used), act, in.experts_x ? in.experts_x : x,
                         ws.mm_scratch.data());
  if (in.values) in.values(ws.moe_values.data(), k, n_ff);
  cpu::matmul_each(pool, std::span<const cpu::MatmulJob>(downs, used), ws.moe_each_scratch.data());
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(d));
  for (int64_t i = 0; i < k; ++i) add_weighted(out, w[i], ws.moe_each_out.data() + i * d, d);
}

// Groups the n tokens' choices by expert into slots (a token once per chosen expert; the slots
// of expert e are [moe_first[e], moe_first[e + 1]), its tokens ascending), with each slot's
// token and weight, and lists the chosen experts ascending in moe_active. Returns their count.
int64_t group_by_expert(const MoeWeights& moe, int64_t n, Workspace& ws) {
  const int64_t ne = moe.n_expert(), k = moe.n_used;
  int32_t* first = ws.moe_first.data();
  int32_t* next = ws.moe_order.data();
  std::fill(first, first + ne + 1, 0);
  for (int64_t s = 0; s < n * k; ++s) ++first[ws.moe_ids[static_cast<size_t>(s)] + 1];
  int64_t n_active = 0;
  for (int64_t e = 0; e < ne; ++e) {
    if (first[e + 1] > 0) ws.moe_active[static_cast<size_t>(n_active++)] = static_cast<int32_t>(e);
    first[e + 1] += first[e];
    next[e] = first[e];
  }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < k; ++i) {
      const int32_t s = next[ws.moe_ids[static_cast<size_t>(t * k + i)]]++;
      ws.moe_tokens[static_cast<size_t>(s)] = static_cast<int32_t>(t);
      ws.moe_token_w[static_cast<size_t>(s)] = ws.moe_weights[static_cast<size_t>(t * k + i)];
    }
  return n_active;
}

// x quantized once (in the gate's layout) and its rows gathered into slot order: slot s holds
// token slot_token(s)'s row, for n_slots slots.
template <class SlotToken>
cpu::PreparedRows gather_slot_inputs(ThreadPool& pool, const FfnWeights& e0, const float* x, int64_t n,
                                     int64_t n_slots, Workspace& ws, SlotToken slot_token) {
  const cpu::PreparedRows xq = cpu::prepare_rows(pool, e0.gate.type, x, n, e0.n_embd(), ws.mm_scratch.data());
  uint8_t* xs = align64(ws.moe_slot_x.data());
  pool.parallel_for(n_slots, 16, [&](int64_t s0, int64_t s1, int) {
    for (int64_t s = s0; s < s1; ++s) std::memcpy(xs + s * xq.stride, xq.x + slot_token(s) * xq.stride, xq.stride);
  });
  return {xs, xq.stride};
}

// The block (64, 128 or kMoeBlockMax rows) a dispatch over `count` matrices of `rows` rows each
// runs in: the largest that still gives every thread four blocks. Larger blocks are longer
// streams of weights, with fewer starts that nothing fetched ahead (2 threads, the Qwen3-MoE
// prompt 1.10x at 256 against 64 at AVX2, 1.12x at AVX-512; the Mixtral shape 1.04x / 1.10x).
// Rows and columns do not depend on their block: the same bits at every thread count.
int64_t moe_block(int64_t rows, int64_t count, int n_threads) {
  for (int64_t b = kMoeBlockMax; b > 64; b /= 2)
    if (count * ((rows + b - 1) / b) >= 4 * static_cast<int64_t>(n_threads)) return b;
  return 64;
}

// Every listed expert's gate and up over its slots in one dispatch (blocks of moe_block neurons
// of one expert, the activation applied in the block): values[s] (n_ff each) for the slots
// [slots(a).first, slots(a).second) of expert experts[a], from the gathered inputs xs.
template <class Slots>
void experts_values(ThreadPool& pool, const MoeWeights& moe, cpu::Activation act, const int32_t* experts,
                    int64_t count, Slots slots, const cpu::PreparedRows& xs, float* values, Workspace& ws) {
  const int64_t n_ff = moe.experts[static_cast<size_t>(experts[0])].n_ff(), tb = cpu::kMatmulTokenBlock;
  const int64_t nb = moe_block(n_ff, count, pool.size()), ff_blocks = (n_ff + nb - 1) / nb;
  pool.parallel_for(count * ff_blocks, 1, [&](int64_t i0, int64_t i1, int ith) {
    float* up = ws.moe_tile.data() + ith * tb * kMoeBlockMax;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t a = i / ff_blocks;
      const FfnWeights& w = moe.experts[static_cast<size_t>(experts[a])];
      const int64_t r0 = i % ff_blocks * nb, r1 = std::min(n_ff, r0 + nb), nr = r1 - r0;
      const auto [first, last] = slots(a);
      for (int64_t s0 = first; s0 < last; s0 += tb) {
        const int64_t nt = std::min<int64_t>(tb, last - s0);
        float* h = values + s0 * n_ff + r0;
        cpu::matmul_rows_prepared(w.gate, xs.x + s0 * xs.stride, xs.stride, nt, r0, r1, h, n_ff);
        cpu::matmul_rows_prepared(w.up, xs.x + s0 * xs.stride, xs.stride, nt, r0, r1, up, nr);
        for (int64_t t = 0; t < nt; ++t) cpu::gated_activation(act, h + t * n_ff, up + t * nr, h + t * n_ff, nr);
      }
    }
  });
}

// The listed experts' downs over their slots' quantized values hq (slot s at row s - slot0) in one
// dispatch over blocks of moe_block output columns, each block running the experts in the
// listed order; sink(s, c0, r, nc) takes slot s's output columns [c0, c0 + nc) (unweighted) in
// that order.
template <class Slots, class Sink>
void experts_downs(ThreadPool& pool, const MoeWeights& moe, const int32_t* experts, int64_t count, Slots slots,
                   const cpu::PreparedRows& hq, int64_t slot0, Workspace& ws, Sink sink) {
  const int64_t d = moe.router.cols(), tb = cpu::kMatmulTokenBlock;
  const int64_t cb = moe_block(d, 1, pool.size()), d_blocks = (d + cb - 1) / cb;
  pool.parallel_for(d_blocks, 1, [&](int64_t i0, int64_t i1, int ith) {
    float* r = ws.moe_tile.data() + ith * tb * kMoeBlockMax;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t c0 = i * cb, c1 = std::min(d, c0 + cb), nc = c1 - c0;
      for (int64_t a = 0; a < count; ++a) {
        const FfnWeights& w = moe.experts[static_cast<size_t>(experts[a])];
        const auto [first, last] = slots(a);
        for (int64_t s0 = first; s0 < last; s0 += tb) {
          const int64_t nt = std::min<int64_t>(tb, last - s0);
          cpu::matmul_rows_prepared(w.down, hq.x + (s0 - slot0) * hq.stride, hq.stride, nt, c0, c1, r, nc);
          for (int64_t t = 0; t < nt; ++t) sink(s0 + t, c0, r + t * nc, nc);
        }
      }
    }
  });
}

// A prompt through its chosen experts, grouped by expert without copying a float: x quantized
// once and its rows gathered into slot order; every chosen expert's gate and up over its slots
// in one dispatch; the values quantized once; then the downs in one dispatch over blocks of
// output columns, each block running the chosen experts in ascending order and adding each
// slot's weighted result to its token: every token's sum in ascending expert order, in the token
// blocks matmul() takes, so bit for bit the grouped loop. Returns false (nothing done) where an
// expert does not fuse.
bool moe_prompt(ThreadPool& pool, const MoeWeights& moe, cpu::Activation act, const float* x, int64_t n, float* out,
                Workspace& ws, const MoeInputs& in) {
  const int64_t d = moe.router.cols(), k = moe.n_used, n_slots = n * k;
  const int64_t n_active = group_by_expert(moe, n, ws);
  const int32_t* first = ws.moe_first.data();
  const int32_t* active = ws.moe_active.data();
  // The memory tier holds a limited number of experts at once: the chosen ones run in groups of
  // ascending experts that it holds together, each group adding onto the tokens' sums after
  // the one before, so every token's sum is still taken in ascending expert order.
  const int64_t group = moe.cache ? std::min<int64_t>(n_active, moe.cache->slots()) : n_active;
  if (moe.cache) moe.cache->ensure(moe, active, group);
  // A copy: the memory tier may evict the first expert for a later group.
  const FfnWeights e0 = moe.experts[static_cast<size_t>(active[0])];
  for (int64_t a = 0; a < group; ++a)
    if (!fusable(e0, moe.experts[static_cast<size_t>(active[a])])) return false;
  const int64_t n_ff = e0.n_ff();
  EMBER_CHECK(static_cast<int64_t>(ws.moe_values.size()) >= n_slots * n_ff && ws.moe_slot_x.size() > 64 &&
                  static_cast<int64_t>(ws.moe_tile.size()) >= pool.size() * cpu::kMatmulTokenBlock * kMoeBlockMax,
              "mixture of experts: the workspace was not set up for {} tokens on {} threads", n, pool.size());

  const cpu::PreparedRows xs = gather_slot_inputs(pool, e0, in.experts_x ? in.experts_x : x, n, n_slots, ws,
                                                  [&](int64_t s) { return ws.moe_tokens[static_cast<size_t>(s)]; });
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * d));
  float* values = ws.moe_values.data();
  for (int64_t g0 = 0; g0 < n_active; g0 += group) {
    const int64_t g1 = std::min(n_active, g0 + group);
    if (g0 > 0) {
      moe.cache->ensure(moe, active + g0, g1 - g0);
      for (int64_t a = g0; a < g1; ++a)
        EMBER_CHECK(fusable(e0, moe.experts[static_cast<size_t>(active[a])]),
                    "mixture of experts: the memory tier's experts came back in other types");
    }
    const auto slots = [&](int64_t a) {
      const int32_t e = active[g0 + a];
      return std::pair<int64_t, int64_t>(first[e], first[e + 1]);
    };
    experts_values(pool, moe, act, active + g0, g1 - g0, slots, xs, values, ws);
    // The group's slots are contiguous (slots ascend with their experts): their values quantized
    // once, then the downs, each adding its slots' weighted results in ascending expert order.
    const int64_t slot0 = first[active[g0]], slot1 = first[active[g1 - 1] + 1];
    if (in.values) in.values(values + slot0 * n_ff, slot1 - slot0, n_ff);
    const cpu::PreparedRows hq =
        cpu::prepare_rows(pool, e0.down.type, values + slot0 * n_ff, slot1 - slot0, n_ff, ws.moe_slot_h.data());
    experts_downs(pool, moe, active + g0, g1 - g0, slots, hq, slot0, ws,
                  [&](int64_t s, int64_t c0, const float* r, int64_t nc) {
                    const auto i = static_cast<size_t>(s);
                    add_weighted(out + ws.moe_tokens[i] * d + c0, ws.moe_token_w[i], r, nc);
                  });
  }
  return true;
}

// The router's logits for n tokens and each token's choice (moe_route) into the workspace.
void route(ThreadPool& pool, const MoeWeights& moe, const float* x, int64_t n, Workspace& ws) {
  const int64_t ne = moe.n_expert(), k = moe.n_used;
  EMBER_CHECK(static_cast<int64_t>(ws.moe_order.size()) >= ne && static_cast<int64_t>(ws.moe_ids.size()) >= n * k &&
                  static_cast<int64_t>(ws.moe_x.size()) >= n * moe.router.cols(),
              "mixture of experts: the workspace was not set up for {} tokens of {} experts", n, ne);
  cpu::matmul(pool, moe.router, x, n, ws.moe_logits.data(), ws.mm_scratch.data());
  moe_route(moe, ws.moe_logits.data(), n, ws.moe_ids.data(), ws.moe_weights.data(), ws.moe_order.data());
}

// Each chosen expert once, in ascending order, over copies of its tokens' rows; each token's
// weighted results summed in that order.
// `resident`: the memory tier already holds every chosen expert (moe_ffn's one token).
void grouped_loop(const MoeWeights& moe, const float* x, int64_t n, float* out, Workspace& ws,
                  const ExpertFfn& expert, bool resident = false) {
  const int64_t d = moe.router.cols(), ne = moe.n_expert(), k = moe.n_used;
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * d));
  for (int64_t e = 0; e < ne; ++e) {
    int64_t m = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < k; ++i)
        if (ws.moe_ids[static_cast<size_t>(t * k + i)] == e) {
          ws.moe_tokens[static_cast<size_t>(m)] = static_cast<int32_t>(t);
          ws.moe_token_w[static_cast<size_t>(m++)] = ws.moe_weights[static_cast<size_t>(t * k + i)];
        }
    if (m == 0) continue;
    if (moe.cache && !resident) {  // the memory tier: this expert resident
      const auto id = static_cast<int32_t>(e);
      moe.cache->ensure(moe, &id, 1);
    }
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(ws.moe_x.data() + i * d, x + ws.moe_tokens[static_cast<size_t>(i)] * d,
                  sizeof(float) * static_cast<size_t>(d));
    expert(e, ws.moe_x.data(), m, ws.moe_out.data());
    for (int64_t i = 0; i < m; ++i)
      add_weighted(out + ws.moe_tokens[static_cast<size_t>(i)] * d, ws.moe_token_w[static_cast<size_t>(i)],
                   ws.moe_out.data() + i * d, d);
  }
}

}  // namespace

int64_t moe_route_slots(ThreadPool& pool, const MoeWeights& moe, const float* x, int64_t n, Workspace& ws) {
  route(pool, moe, x, n, ws);
  return group_by_expert(moe, n, ws);
}

int64_t moe_group_slots(const MoeWeights& moe, int64_t n, Workspace& ws) { return group_by_expert(moe, n, ws); }

std::string moe_split_refusal(const MoeWeights& moe) {
  const FfnWeights& e0 = moe.experts.front();
  for (int64_t e = 0; e < moe.n_expert(); ++e)
    if (!fusable(e0, moe.experts[static_cast<size_t>(e)]))
      return fmt::format("expert {} is not a gated FFN of the first expert's types and widths without a down bias", e);
  return {};
}

void moe_expert_rows(ThreadPool& pool, const MoeWeights& moe, cpu::Activation act, const float* x, int64_t n,
                     const int32_t* experts, int64_t count, Workspace& ws, float* rows) {
  if (count == 0) return;
  const int32_t* first = ws.moe_first.data();
  // The listed experts' slots packed in order: expert a's at [begin[a], begin[a + 1]).
  int32_t* begin = ws.moe_order.data();
  EMBER_CHECK(static_cast<int64_t>(ws.moe_order.size()) > count, "mixture of experts: {} experts listed", count);
  begin[0] = 0;
  for (int64_t a = 0; a < count; ++a) {
    const int32_t e = experts[a];
    EMBER_CHECK(e >= 0 && e < moe.n_expert() && (a == 0 || e > experts[a - 1]),
                "mixture of experts: the experts listed are not ascending ids below {}", moe.n_expert());
    begin[a + 1] = begin[a] + first[e + 1] - first[e];
  }
  const int64_t n_slots = begin[count], d = moe.router.cols();
  const FfnWeights& e0 = moe.experts[static_cast<size_t>(experts[0])];
  const int64_t n_ff = e0.n_ff();
  EMBER_CHECK(static_cast<int64_t>(ws.moe_values.size()) >= n_slots * n_ff,
              "mixture of experts: the workspace was not set up for {} tokens", n);
  // Packed slot p of listed expert a is its (p - begin[a])-th slot of the routing.
  const auto token_of = [&](int64_t p) {
    int64_t a = 0;
    while (begin[a + 1] <= p) ++a;
    return ws.moe_tokens[static_cast<size_t>(first[experts[a]] + (p - begin[a]))];
  };
  const cpu::PreparedRows xs = gather_slot_inputs(pool, e0, x, n, n_slots, ws, token_of);
  const auto slots = [&](int64_t a) { return std::pair<int64_t, int64_t>(begin[a], begin[a + 1]); };
  float* values = ws.moe_values.data();
  experts_values(pool, moe, act, experts, count, slots, xs, values, ws);
  const cpu::PreparedRows hq = cpu::prepare_rows(pool, e0.down.type, values, n_slots, n_ff, ws.moe_slot_h.data());
  experts_downs(pool, moe, experts, count, slots, hq, 0, ws, [&](int64_t p, int64_t c0, const float* r, int64_t nc) {
    std::memcpy(rows + p * d + c0, r, sizeof(float) * static_cast<size_t>(nc));
  });
}

void moe_merge_rows(const MoeWeights& moe, int64_t n, const Workspace& ws, const float* const* expert_rows,
                    int64_t n_active, float* out) {
  const int64_t d = moe.router.cols();
  const int32_t* first = ws.moe_first.data();
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * d));
  for (int64_t a = 0; a < n_active; ++a) {
    const int32_t e = ws.moe_active[static_cast<size_t>(a)];
    for (int32_t s = first[e]; s < first[e + 1]; ++s)
      add_weighted(out + ws.moe_tokens[static_cast<size_t>(s)] * d, ws.moe_token_w[static_cast<size_t>(s)],
                   expert_rows[a] + (s - first[e]) * d, d);
  }
}

void moe_ffn(ThreadPool& pool, const MoeWeights& moe, cpu::Activation act, const float* x, int64_t n, float* out,
             Workspace& ws, bool grouped, const MoeInputs& in) {
  route(pool, moe, x, n, ws);
  // The memory tier: a token's chosen experts resident before their types are compared (the
  // cache repacks what it reads); a prompt's are made resident group by group (moe_prompt).
  if (n == 1 && moe.cache) {
    moe.cache->ensure(moe, ws.moe_ids.data(), moe.n_used);
    if (ws.ffn_residual) moe.cache->read_ahead(pool, moe, ws.ffn_residual);  // the next layer's, while this one runs
  }
  if (n == 1 && !grouped && fused_decode(moe, ws.moe_ids.data(), ws)) return moe_decode(pool, moe, act, x, out, ws, in);
  if (n > 1 && !grouped && moe_prompt(pool, moe, act, x, n, out, ws, in)) return;
  grouped_loop(moe, in.experts_x ? in.experts_x : x, n, out, ws, [&](int64_t e, const float* rows, int64_t m, float* o) {
    dense_ffn(pool, moe.experts[static_cast<size_t>(e)], act, rows, m, o, ws, in.values);
  }, n == 1);
}

void moe_ffn_each(ThreadPool& pool, const MoeWeights& moe, const float* x, int64_t n, float* out, Workspace& ws,
                  const ExpertFfn& expert) {
  route(pool, moe, x, n, ws);
  grouped_loop(moe, x, n, out, ws, expert);
}

}  // namespace ember
