#include "ops/cpu/bandwidth.hpp"

#include <emmintrin.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <random>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/error.hpp"

namespace ember::cpu {
namespace {

// Sums 64-byte lines with four independent SSE2 accumulators (baseline x86-64 suffices to
// saturate memory; the result is kept so the reads are not optimized away).
// With `ahead`, line i of `ahead` is prefetched into L2 as line i of p is read.
uint64_t sum_lines(const uint8_t* p, size_t n_lines, const uint8_t* ahead = nullptr) {
  __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n_lines; ++i, p += 64) {
    if (ahead) _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * i), _MM_HINT_T1);
    a0 = _mm_add_epi64(a0, _mm_load_si128(reinterpret_cast<const __m128i*>(p)));
    a1 = _mm_add_epi64(a1, _mm_load_si128(reinterpret_cast<const __m128i*>(p + 16)));
    a2 = _mm_add_epi64(a2, _mm_load_si128(reinterpret_cast<const __m128i*>(p + 32)));
    a3 = _mm_add_epi64(a3, _mm_load_si128(reinterpret_cast<const __m128i*>(p + 48)));
  }
  const __m128i s = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(s)) + static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s)));
}

// A buffer of n_lines lines, each page written by the thread that will read it.
AlignedBuffer<uint8_t> probe_buffer(ThreadPool& pool, size_t n_lines) {
  AlignedBuffer<uint8_t> buf(n_lines * 64);
  pool.run([&](int ith, int nth) {
    int64_t l0, l1;
    split_range(static_cast<int64_t>(n_lines), ith, nth, l0, l1);
    for (int64_t l = l0; l < l1; ++l) buf[static_cast<size_t>(l) * 64] = static_cast<uint8_t>(l);
  });
  return buf;
}

// `bytes` / the best time of read(ith, nth) on every thread over three runs after a warm-up
// (page tables, frequency); read returns a sum, kept so that the reads are not optimized away.
template <class F>
double best_rate(ThreadPool& pool, double bytes, const F& read) {
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  for (int run = 0; run < 4; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int ith, int nth) { sink.fetch_add(read(ith, nth), std::memory_order_relaxed); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (run > 0 && s > 0) best = std::max(best, bytes / s);
  }
  if (sink.load() == 42) best += 0.0;  // keeps the sums observable
  return best;
}

}  // namespace

double measure_read_bandwidth(ThreadPool& pool, size_t bytes) {
  const size_t n_lines = std::max<size_t>(bytes / 64, 1);
  const AlignedBuffer<uint8_t> buf = probe_buffer(pool, n_lines);
  return best_rate(pool, static_cast<double>(n_lines * 64), [&](int ith, int nth) {
    int64_t l0, l1;
    split_range(static_cast<int64_t>(n_lines), ith, nth, l0, l1);
    return sum_lines(buf.data() + static_cast<size_t>(l0) * 64, static_cast<size_t>(l1 - l0));
  });
}

double measure_scattered_read_bandwidth(ThreadPool& pool, size_t bytes, size_t row_bytes, double keep) {
  EMBER_CHECK(row_bytes >= 64 && row_bytes % 64 == 0, "scattered read: rows of {} bytes, need a multiple of 64",
              row_bytes);
  EMBER_CHECK(keep > 0.0 && keep <= 1.0, "scattered read: keep share {} is not in (0, 1]", keep);
  const size_t n_rows = std::max<size_t>(bytes / row_bytes, 1), row_lines = row_bytes / 64;
  const AlignedBuffer<uint8_t> buf = probe_buffer(pool, n_rows * row_lines);
  std::vector<size_t> rows(n_rows);
  std::iota(rows.begin(), rows.end(), size_t{0});
  std::mt19937 rng(3);
  std::shuffle(rows.begin(), rows.end(), rng);
  rows.resize(std::max<size_t>(1, static_cast<size_t>(keep * static_cast<double>(n_rows) + 0.5)));
  std::sort(rows.begin(), rows.end());
  const double kept_bytes = static_cast<double>(rows.size() * row_bytes);
  return best_rate(pool, kept_bytes, [&](int ith, int nth) {
    int64_t l0, l1;  // this thread's lines of every row
    split_range(static_cast<int64_t>(row_lines), ith, nth, l0, l1);
    const size_t first = static_cast<size_t>(l0) * 64, n = static_cast<size_t>(l1 - l0);
    uint64_t sum = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const uint8_t* ahead = i + kScatterAhead < rows.size() ? buf.data() + rows[i + kScatterAhead] * row_bytes + first
                                                             : nullptr;
      sum += sum_lines(buf.data() + rows[i] * row_bytes + first, n, ahead);
    }
    return sum;
  });
}

}  // namespace ember::cpu
