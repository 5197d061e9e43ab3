// What the one-token kernels over groups of scattered rows share at every level
// (sparse/sparse_avx2.cpp, sparse/sparse_avx512.cpp): how far ahead rows are prefetched, with
// which hint, and the dispatch on a group's row count. Include only inside an anonymous namespace
// of those files, after <immintrin.h>: each ISA compiles its own copy.
//
// Why groups: an active row is a short read (1-2 KB) somewhere in a large matrix, so its first
// cache lines are a DRAM latency away and the hardware prefetcher has not seen it coming. Going
// through several rows in step keeps that many independent streams in flight, and the rows of a
// later group are prefetched while the current one is computed (spread over the loop, a line at a
// time as a row's blocks go by, so that the prefetches do not queue up in front of the loads).

// How many rows ahead the prefetches run: about kPrefetchAhead bytes of rows, at least a group
// of kGroup (short rows need more of them; 4 KB to 16 KB measured about the same).
constexpr int64_t kPrefetchAhead = 16384;
template <int kGroup>
inline int64_t rows_ahead(size_t row_bytes) {
  return std::clamp<int64_t>(kPrefetchAhead / static_cast<int64_t>(row_bytes), kGroup, 8 * kGroup);
}

// Prefetches the lines that start in [p, p + n) with hint H: one prefetch per line as the spans
// of a row go by; prefetch_row_start asks for the row's first line. Which hint is faster depends
// on the CPU (into_l1): into L2 (T1) on AMD Zen 4, where T0 measured 5-8 % slower (it holds the
// few L1 miss buffers longer); into L1 (T0) on Intel Xeon, where it measured 7-10 % faster on the
// gathers.
template <int H>
inline void prefetch_span(const uint8_t* p, int n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), end = a + static_cast<uintptr_t>(n);
  for (uintptr_t line = (a + 63) & ~uintptr_t{63}; line < end; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), static_cast<_mm_hint>(H));
}
template <int H>
inline void prefetch_row_start(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), static_cast<_mm_hint>(H));
}
inline bool into_l1() { return cpu_features().intel; }

// f(std::integral_constant<int, c>{}) for a count c in 1 .. kMax (0: nothing).
template <int kMax, class F>
inline void with_rows(int64_t c, F&& f) {
  if constexpr (kMax > 0) {
    if (c == kMax) f(std::integral_constant<int, kMax>{});
    else with_rows<kMax - 1>(c, f);
  }
}

// A gather's walk over a list of n rows of `row_bytes` each: groups of up to kGroup rows in list
// order, group(R, cur, next, i) with the rows of list entries i .. i + R (cur) and those about
// rows_ahead on (next, to prefetch; past the list's end its last row).
template <int kGroup, class Group>
inline void grouped_rows(const uint8_t* w, size_t stride, const int32_t* rows, int64_t n, size_t row_bytes,
                         Group&& group) {
  const int64_t ahead = rows_ahead<kGroup>(row_bytes);
  const auto row = [&](int64_t i) { return w + static_cast<size_t>(rows[std::min(i, n - 1)]) * stride; };
  for (int64_t i = 0; i < n; i += kGroup) {
    const uint8_t* cur[kGroup];
    const uint8_t* next[kGroup];
    for (int g = 0; g < kGroup; ++g) cur[g] = row(i + g), next[g] = row(i + ahead + g);
    with_rows<kGroup>(std::min<int64_t>(kGroup, n - i), [&](auto r) { group(r, cur, next, i); });
  }
}
