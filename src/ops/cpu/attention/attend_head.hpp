// One head's attention over n cached positions, written once for the SIMD files: the file's
// own three steps (defined before it includes this), with the caches typed as they are stored.
// Include it only inside an anonymous namespace of attention_avx2.cpp / attention_avx512.cpp,
// after its attend_scores, attend_softmax and attend_weighted_sum:
//   attend_scores(q, k, stride, n, hd, scale, scores)   scores[j] = scale * q.k_j, j < n
//   attend_softmax(softcap, n, scores, stat)            scores = softmax(scores); stat: max, sum
//   attend_weighted_sum(scores, v, stride, n, hd, out)  out = sum_j scores[j] v_j

// f(k, v) with the caches typed as they are stored: F16 (uint16_t) or float.
template <class F>
void with_cache_type(const AttentionShape& s, const void* k, const void* v, F&& f) {
  if (s.kv_f16)
    f(static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v));
  else
    f(static_cast<const float*>(k), static_cast<const float*>(v));
}

inline void attend_head(const AttentionShape& s, const float* qh, const void* k, const void* v, int64_t kv_stride,
                        int64_t n, float* outh, float* scores, float* stat) {
  with_cache_type(s, k, v, [&](auto kt, auto vt) {
    attend_scores(qh, kt, kv_stride, n, s.head_dim, s.scale, scores);
    attend_softmax(s.softcap, n, scores, stat);
    attend_weighted_sum(scores, vt, kv_stride, n, s.head_dim, outh);
  });
}
