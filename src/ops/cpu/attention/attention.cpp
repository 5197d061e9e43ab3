#include "ops/cpu/attention/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu_features.hpp"
#include "ops/cpu/vec.hpp"

namespace ember::cpu {
namespace detail {
// attention/attention_avx512.cpp: softmax(q.K^T * scale) V for one head over the n positions at k, v.
// stat, when not null, receives the largest score and the sum of the exponentials.
void attend_one_avx512(const AttentionShape& s, const float* qh, const void* k, const void* v, int64_t kv_stride,
                       int64_t n, float* outh, float* scores, float* stat);
// The same for `heads` (2 to kGroupHeads) consecutive heads sharing one KV head (q, out: the heads
// one after the other; scores: heads * n floats; stat: two per head).
void attend_group_avx512(const AttentionShape& s, int heads, const float* q, const void* k, const void* v,
                         int64_t kv_stride, int64_t n, float* out, float* scores, float* stat);
// attention/attention_avx2.cpp: the one-head and grouped kernels on AVX2 + FMA + F16C, for head
// sizes a multiple of 8.
void attend_one_avx2(const AttentionShape& s, const float* qh, const void* k, const void* v, int64_t kv_stride,
                     int64_t n, float* outh, float* scores, float* stat);
void attend_group_avx2(const AttentionShape& s, int heads, const float* q, const void* k, const void* v,
                       int64_t kv_stride, int64_t n, float* out, float* scores, float* stat);
}  // namespace detail
namespace {

// Decode over a long context: positions in chunks of up to kChunk, merged afterwards, so that the
// work splits over the threads however few KV heads there are (flash-decoding). Applies where a
// batch has fewer than kSplitBelow (token, run of grouped heads) items; the decision and the
// chunk edges depend only on the shapes, so the result does not depend on the thread count.
constexpr int64_t kChunk = 512;
constexpr int64_t kSplitTokens = 4;  // at most this many tokens (the scratch holds their partials)
constexpr int64_t kSplitBelow = 8;

// Position j's row of a cache (kv_head's columns) as floats: the row itself (float cache) or
// its conversion into `tmp` (F16).
const float* cache_row(const AttentionShape& s, const void* c, int64_t j, int64_t kv_stride, int64_t kv_head,
                       float* tmp) {
  const int64_t off = j * kv_stride + kv_head * s.head_dim;
  if (!s.kv_f16) return static_cast<const float*>(c) + off;
  from_f16(static_cast<const uint16_t*>(c) + off, tmp, s.head_dim);
  return tmp;
}

// First position token position `pos` sees (sliding window).
int64_t first_visible(const AttentionShape& s, int64_t pos) {
  return s.window > 0 && pos - s.window + 1 > 0 ? pos - s.window + 1 : 0;
}

// Whether this level has a grouped kernel for the shape (AVX-512; AVX2 for head sizes a multiple
// of 8, as its one-head kernel).
bool grouped_kernel(const AttentionShape& s) {
  return simd_level() == SimdLevel::avx512 || (vector_level() == SimdLevel::avx2 && s.head_dim % 8 == 0);
}

// Heads the grouped kernels take together: the largest of 4, 3, 2 that divides the group.
int group_heads(int64_t group) {
  for (int g = detail::kGroupHeads; g > 1; --g)
    if (group % g == 0) return g;
  return 1;
}

// One token's consecutive heads [h, h + heads) of one KV head (heads: 1, or up to kGroupHeads
// where grouped_kernel): softmax(q.K^T * scale) V over positions [first, first + n). scratch: the scores
// (heads * n) and a converted row (head_dim). stat: per head the largest score and the sum of
// the exponentials, or null.
void attend_heads(const AttentionShape& s, const float* qh, int heads, int64_t first, int64_t n, const void* k,
                  const void* v, int64_t kv_stride, int64_t kv_head, float* outh, float* scores, float* row,
                  float* stat) {
  const int64_t hd = s.head_dim;
  const int64_t off = (first * kv_stride + kv_head * hd) * (s.kv_f16 ? 2 : 4);
  const uint8_t *kb = static_cast<const uint8_t*>(k) + off, *vb = static_cast<const uint8_t*>(v) + off;
  if (simd_level() == SimdLevel::avx512) {
    if (heads > 1) return detail::attend_group_avx512(s, heads, qh, kb, vb, kv_stride, n, outh, scores, stat);
    return detail::attend_one_avx512(s, qh, kb, vb, kv_stride, n, outh, scores, stat);
  }
  if (vector_level() == SimdLevel::avx2 && hd % 8 == 0) {
    if (heads > 1) return detail::attend_group_avx2(s, heads, qh, kb, vb, kv_stride, n, outh, scores, stat);
    return detail::attend_one_avx2(s, qh, kb, vb, kv_stride, n, outh, scores, stat);
  }
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
  if (stat) stat[0] = mx, stat[1] = static_cast<float>(sum);
  float inv = static_cast<float>(1.0 / sum);
  std::memset(outh, 0, sizeof(float) * hd);
  for (int64_t j = 0; j < n; ++j) axpy_f32(scores[j] * inv, cache_row(s, v, first + j, kv_stride, kv_head, row), outh, hd);
}

// How the visible positions of the batch's last token (the most of any token) split: the
// fewest chunks of at most kChunk, of equal length (so that, say, 513 positions make two
// halves, not 512 and 1). Returns the chunk count and sets `len`.
int64_t split_chunks(const AttentionShape& s, int64_t n_tokens, int64_t pos0, int64_t& len) {
  const int64_t last = pos0 + n_tokens - 1, n = last - first_visible(s, last) + 1;
  // Only where the (token, run of heads) items are few: with enough of them the threads are
  // busy anyway, and the merge would only cost (it measured 10-15 % on 8 runs).
  const int64_t items = n_tokens * (s.n_head / group_heads(s.n_head / s.n_head_kv));
  if (n_tokens > kSplitTokens || items >= kSplitBelow || n <= kChunk) return 1;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  len = (n + chunks - 1) / chunks;
  return chunks;
}

}  // namespace

// Per thread in the split path: a chunk's scores, a converted row, the run's outputs.
size_t split_thread_floats(int64_t head_dim) {
  return static_cast<size_t>(detail::kGroupHeads * kChunk + head_dim + detail::kGroupHeads * head_dim);
}

size_t attention_scratch_floats(int64_t n_ctx, int64_t n_head, int64_t head_dim, int n_threads) {
  // Without a split, the scores of a whole context per thread; with one (contexts beyond a
  // chunk), per chunk, plus each (token, head, chunk)'s output and statistics.
  const size_t whole = static_cast<size_t>(n_threads) * static_cast<size_t>(detail::kGroupHeads * n_ctx + head_dim);
  if (n_ctx <= kChunk) return whole;
  const size_t chunks = static_cast<size_t>((n_ctx + kChunk - 1) / kChunk);
  return std::max(whole, static_cast<size_t>(n_threads) * split_thread_floats(head_dim) +
                             static_cast<size_t>(kSplitTokens * n_head) * chunks * static_cast<size_t>(head_dim + 2));
}

void attention(ThreadPool& pool, const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
               const void* k, const void* v, int64_t kv_stride, float* out, float* scratch) {
  const int64_t group = s.n_head / s.n_head_kv, hd = s.head_dim;
  const int64_t n_ctx = pos0 + n_tokens;
  int64_t len = kChunk;
  const int64_t chunks = split_chunks(s, n_tokens, pos0, len);
  if (chunks > 1) {
    // Each item: one token's run of heads over one chunk of its visible positions, into
    // partials (normalized output and per head max and sum); then the chunks merged per head.
    const int heads = grouped_kernel(s) ? group_heads(group) : 1;
    const int64_t runs = s.n_head / heads;
    const size_t per_thread = split_thread_floats(hd);
    float* part = scratch + static_cast<size_t>(pool.size()) * per_thread;
    const auto part_at = [&](int64_t t, int64_t h, int64_t c) {
      return part + static_cast<size_t>((t * s.n_head + h) * chunks + c) * static_cast<size_t>(hd + 2);
    };
    pool.parallel_for(n_tokens * runs * chunks, 1, [&](int64_t begin, int64_t end, int ith) {
      float* scores = scratch + static_cast<size_t>(ith) * per_thread;
      float* row = scores + detail::kGroupHeads * kChunk;
      float* out_g = row + hd;
      for (int64_t p = begin; p < end; ++p) {
        const int64_t c = p % chunks, r = p / chunks % runs, t = p / chunks / runs, h = r * heads;
        const int64_t pos = pos0 + t, first = first_visible(s, pos);
        const int64_t b = first + c * len, e = std::min(pos + 1, b + len);
        if (e <= b) {  // this token sees fewer chunks
          for (int g = 0; g < heads; ++g) part_at(t, h + g, c)[hd] = -INFINITY, part_at(t, h + g, c)[hd + 1] = 0;
          continue;
        }
        float stat[2 * detail::kGroupHeads];
        attend_heads(s, q + (t * s.n_head + h) * hd, heads, b, e - b, k, v, kv_stride, h / group, out_g, scores, row,
                     stat);
        for (int g = 0; g < heads; ++g) {
          float* dst = part_at(t, h + g, c);
          std::memcpy(dst, out_g + g * hd, sizeof(float) * static_cast<size_t>(hd));
          dst[hd] = stat[2 * g], dst[hd + 1] = stat[2 * g + 1];
        }
      }
    });
    pool.parallel_for(n_tokens * s.n_head, 1, [&](int64_t begin, int64_t end, int) {
      for (int64_t p = begin; p < end; ++p) {
        const int64_t t = p / s.n_head, h = p % s.n_head;
        float m = -INFINITY;
        for (int64_t c = 0; c < chunks; ++c) m = std::max(m, part_at(t, h, c)[hd]);
        double total = 0;
        for (int64_t c = 0; c < chunks; ++c) {
          const float* pc = part_at(t, h, c);
          if (pc[hd + 1] > 0) total += std::exp(static_cast<double>(pc[hd]) - m) * pc[hd + 1];
        }
        float* o = out + (t * s.n_head + h) * hd;
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(hd));
        for (int64_t c = 0; c < chunks; ++c) {
          const float* pc = part_at(t, h, c);
          if (pc[hd + 1] <= 0) continue;
          const float w = static_cast<float>(std::exp(static_cast<double>(pc[hd]) - m) * pc[hd + 1] / total);
          axpy_f32(w, pc, o, hd);
        }
      }
    });
    return;
  }
  // Work items: (token, run of `heads` heads of one KV head): the largest run the grouped kernel
  // takes that still gives every thread an item (a run of G heads reads and converts each K and
  // V row once for G; one head at a time, each head's item reads them again). The kernels give
  // the same bits, so the choice changes only the time.
  int heads = 1;
  if (grouped_kernel(s))
    for (int g = detail::kGroupHeads; g > 1; --g)
      if (group % g == 0 && n_tokens * s.n_head / g >= pool.size()) {
        heads = g;
        break;
      }
  const int64_t runs = s.n_head / heads;
  pool.parallel_for(n_tokens * runs, 1, [&](int64_t begin, int64_t end, int ith) {
    float* scores = scratch + static_cast<size_t>(ith) * static_cast<size_t>(detail::kGroupHeads * n_ctx + hd);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t t = p / runs, h = p % runs * heads;
      const int64_t pos = pos0 + t, first = first_visible(s, pos);
      attend_heads(s, q + (t * s.n_head + h) * hd, heads, first, pos - first + 1, k, v, kv_stride, h / group,
                   out + (t * s.n_head + h) * hd, scores, scores + detail::kGroupHeads * n_ctx, nullptr);
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
