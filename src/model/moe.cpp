#include "model/moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <utility>

#include "core/error.hpp"
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

// Whether one token's chosen experts (ids, n_used of them) can run fused (moe_decode): each a
// gated product (dense_ffn's one-dispatch case, so the same bits) with a down and no down bias,
// at most 8.
bool fused_decode(const MoeWeights& moe, const int32_t* ids, const Workspace& ws) {
  if (moe.n_used > 8 || ws.moe_each_scratch.empty()) return false;
  for (int64_t i = 0; i < moe.n_used; ++i) {
    const FfnWeights& e = moe.experts[static_cast<size_t>(ids[i])];
    if (!ffn_gated_product(e) || !e.down.valid() || e.down_b.valid()) return false;
  }
  return true;
}

// One token: its k chosen experts' gates and ups in one dispatch (x quantized once), their downs
// in a second, summed in ascending expert order: bit for bit what the grouped loop computes.
void moe_decode(ThreadPool& pool, const MoeWeights& moe, cpu::Activation act, const float* x, float* out,
                Workspace& ws) {
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
  cpu::matmul_gated_each(pool, std::span<const cpu::GatedOut>(gated, used), act, x, ws.mm_scratch.data());
  cpu::matmul_each(pool, std::span<const cpu::MatmulJob>(downs, used), ws.moe_each_scratch.data());
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(d));
  for (int64_t i = 0; i < k; ++i) {
    const float* r = ws.moe_each_out.data() + i * d;
    for (int64_t c = 0; c < d; ++c) out[c] += w[i] * r[c];
  }
}

}  // namespace

void moe_ffn(ThreadPool& pool, const MoeWeights& moe, cpu::Activation act, const float* x, int64_t n, float* out,
             Workspace& ws, bool grouped) {
  const int64_t d = moe.router.cols(), ne = moe.n_expert(), k = moe.n_used;
  EMBER_CHECK(static_cast<int64_t>(ws.moe_order.size()) >= ne && static_cast<int64_t>(ws.moe_ids.size()) >= n * k &&
                  static_cast<int64_t>(ws.moe_x.size()) >= n * d,
              "mixture of experts: the workspace was not set up for {} tokens of {} experts", n, ne);
  cpu::matmul(pool, moe.router, x, n, ws.moe_logits.data(), ws.mm_scratch.data());
  moe_route(moe, ws.moe_logits.data(), n, ws.moe_ids.data(), ws.moe_weights.data(), ws.moe_order.data());
  if (n == 1 && !grouped && fused_decode(moe, ws.moe_ids.data(), ws)) return moe_decode(pool, moe, act, x, out, ws);
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * d));
  for (int64_t e = 0; e < ne; ++e) {  // ascending expert order: each token's sum in that order
    int64_t m = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < k; ++i)
        if (ws.moe_ids[static_cast<size_t>(t * k + i)] == e) {
          ws.moe_tokens[static_cast<size_t>(m)] = static_cast<int32_t>(t);
          ws.moe_token_w[static_cast<size_t>(m++)] = ws.moe_weights[static_cast<size_t>(t * k + i)];
        }
    if (m == 0) continue;
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(ws.moe_x.data() + i * d, x + ws.moe_tokens[static_cast<size_t>(i)] * d,
                  sizeof(float) * static_cast<size_t>(d));
    dense_ffn(pool, moe.experts[static_cast<size_t>(e)], act, ws.moe_x.data(), m, ws.moe_out.data(), ws);
    for (int64_t i = 0; i < m; ++i) {
      float* o = out + ws.moe_tokens[static_cast<size_t>(i)] * d;
      const float* r = ws.moe_out.data() + i * d;
      const float wi = ws.moe_token_w[static_cast<size_t>(i)];
      for (int64_t c = 0; c < d; ++c) o[c] += wi * r[c];
    }
  }
}

}  // namespace ember
