#include "ops/cpu/attention.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu_features.hpp"
#include "ops/cpu/vec.hpp"

namespace ember::cpu {
namespace detail {
// attention_avx512.cpp: softmax(q.K^T * scale) V for one head over the n positions at k, v.
void attend_one_avx512(const AttentionShape& s, const float* qh, const void* k, const void* v, int64_t kv_stride,
                       int64_t n, float* outh, float* scores);
// The same for kGroupHeads consecutive heads sharing one KV head (q, out: the heads one after the
// other; scores: kGroupHeads * n floats).
void attend_four_avx512(const AttentionShape& s, const float* q, const void* k, const void* v, int64_t kv_stride,
                        int64_t n, float* out, float* scores);
// attention_avx2.cpp: the one-head kernel on AVX2 + FMA + F16C, for head sizes a multiple of 8.
void attend_one_avx2(const AttentionShape& s, const float* qh, const void* k, const void* v, int64_t kv_stride,
                     int64_t n, float* outh, float* scores);
}  // namespace detail
namespace {

// Position j's row of a cache (kv_head's columns) as floats: the row itself (float cache) or
// its conversion into `tmp` (F16).
const float* cache_row(const AttentionShape& s, const void* c, int64_t j, int64_t kv_stride, int64_t kv_head,
                       float* tmp) {
  const int64_t off = j * kv_stride + kv_head * s.head_dim;
  if (!s.kv_f16) return static_cast<const float*>(c) + off;
  from_f16(static_cast<const uint16_t*>(c) + off, tmp, s.head_dim);
  return tmp;
}

// One token's consecutive heads [h, h + heads) of one KV head (heads: 1, or kGroupHeads on
// AVX-512): softmax(q.K^T * scale) V over the visible positions. scratch: the scores (heads *
// n_ctx) and a converted row (head_dim).
void attend_heads(const AttentionShape& s, const float* qh, int heads, int64_t pos, const void* k, const void* v,
                  int64_t kv_stride, int64_t kv_head, float* outh, float* scores, float* row) {
  const int64_t hd = s.head_dim;
  int64_t first = 0;
  if (s.window > 0 && pos - s.window + 1 > 0) first = pos - s.window + 1;
  const int64_t n = pos - first + 1;
  const int64_t off = (first * kv_stride + kv_head * hd) * (s.kv_f16 ? 2 : 4);
  const uint8_t *kb = static_cast<const uint8_t*>(k) + off, *vb = static_cast<const uint8_t*>(v) + off;
  if (simd_level() == SimdLevel::avx512) {
    if (heads == detail::kGroupHeads) return detail::attend_four_avx512(s, qh, kb, vb, kv_stride, n, outh, scores);
    return detail::attend_one_avx512(s, qh, kb, vb, kv_stride, n, outh, scores);
  }
  if (simd_level() == SimdLevel::avx2 && hd % 8 == 0)
    return detail::attend_one_avx2(s, qh, kb, vb, kv_stride, n, outh, scores);
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    float sc = dot_f32(qh, cache_row(s, k, first + j, kv_stride, kv_head, row), hd) * s.scale;
    if (s.softcap > 0) sc = s.softcap * std::tanh(sc / s.softcap);
    scores[j] = sc;
    mx = sc > mx ? sc : mx;
  }
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
  }
  float inv = static_cast<float>(1.0 / sum);
  std::memset(outh, 0, sizeof(float) * hd);
  for (int64_t j = 0; j < n; ++j) axpy_f32(scores[j] * inv, cache_row(s, v, first + j, kv_stride, kv_head, row), outh, hd);
}

}  // namespace

size_t attention_scratch_floats(int64_t n_ctx, int64_t head_dim, int n_threads) {
  return static_cast<size_t>(n_threads) * static_cast<size_t>(detail::kGroupHeads * n_ctx + head_dim);
}

void attention(ThreadPool& pool, const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
               const void* k, const void* v, int64_t kv_stride, float* out, float* scratch) {
  const int64_t group = s.n_head / s.n_head_kv;
  const int64_t n_ctx = pos0 + n_tokens;
  // Work items: (token, run of `heads` heads of one KV head); runs of kGroupHeads where the
  // grouped kernel applies and leaves at least two items per thread.
  const int heads = simd_level() == SimdLevel::avx512 && group % detail::kGroupHeads == 0 &&
                            n_tokens * s.n_head / detail::kGroupHeads >= 2 * pool.size()
                        ? detail::kGroupHeads
                        : 1;
  const int64_t runs = s.n_head / heads;
  pool.parallel_for(n_tokens * runs, 1, [&](int64_t begin, int64_t end, int ith) {
    float* scores = scratch + static_cast<size_t>(ith) * static_cast<size_t>(detail::kGroupHeads * n_ctx + s.head_dim);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t t = p / runs, h = p % runs * heads;
      attend_heads(s, q + (t * s.n_head + h) * s.head_dim, heads, pos0 + t, k, v, kv_stride, h / group,
                   out + (t * s.n_head + h) * s.head_dim, scores, scores + detail::kGroupHeads * n_ctx);
    }
  });
}

void attention_reference(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0, const float* k,
                         const float* v, int64_t kv_stride, float* out) {
  const int64_t hd = s.head_dim, group = s.n_head / s.n_head_kv;
  for (int64_t t = 0; t < n_tokens; ++t) {
    int64_t pos = pos0 + t;
    for (int64_t h = 0; h < s.n_head; ++h) {
      const float* qh = q + (t * s.n_head + h) * hd;
      int64_t kvh = h / group;
      std::vector<double> sc;
      int64_t first = s.window > 0 ? std::max<int64_t>(0, pos - s.window + 1) : 0;
      for (int64_t j = first; j <= pos; ++j) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += double(qh[i]) * k[j * kv_stride + kvh * hd + i];
        d *= s.scale;
        if (s.softcap > 0) d = s.softcap * std::tanh(d / s.softcap);
        sc.push_back(d);
      }
      double mx = -INFINITY, sum = 0;
      for (double x : sc) mx = std::max(mx, x);
      for (double& x : sc) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (size_t j = 0; j < sc.size(); ++j) o += sc[j] / sum * v[(first + j) * kv_stride + kvh * hd + i];
        out[(t * s.n_head + h) * hd + i] = static_cast<float>(o);
      }
    }
  }
}

}  // namespace ember::cpu
