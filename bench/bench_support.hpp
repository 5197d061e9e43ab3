// Shared by the micro-benchmarks: the thread pool (EMBER_BENCH_THREADS, default 2) and random
// weight matrices of any type.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/thread_pool.hpp"
#include "tensor/quant.hpp"
#include "tensor/tensor_view.hpp"

#include <unistd.h>

namespace ember::bench {

inline int bench_threads() {
  const char* env = std::getenv("EMBER_BENCH_THREADS");
  return env ? std::atoi(env) : 2;
}

inline ThreadPool& pool() {
  static ThreadPool p(bench_threads());
  return p;
}

struct Weights {
  AlignedBuffer<uint8_t> bytes;
  TensorView view;
};

inline Weights make_weights(DType t, int64_t rows, int64_t k) {
  Weights w;
  const size_t stride = row_bytes(t, k);
  w.bytes.resize(stride * rows);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> row(k);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& x : row) x = dist(rng);
    quantize_row(t, row.data(), w.bytes.data() + r * stride, k);
  }
  w.view.type = t;
  w.view.n_dims = 2;
  w.view.ne[0] = k;
  w.view.ne[1] = rows;
  w.view.data = w.bytes.data();
  w.view.nbytes = stride * rows;
  return w;
}

// Bytes of copies to cycle through so that a kernel reads from memory: 4x the last-level cache the
// machine reports, at least 256 MiB (some servers' L3 is 260 MiB: a 256 MiB span measured the
// cache there, not memory).
inline size_t memory_span() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max<size_t>(size_t{256} << 20, l3 > 0 ? 4 * static_cast<size_t>(l3) : 0);
}

// Copies of a matrix totalling >= memory_span(), to cycle through so that decode kernels read their
// weights from memory, not from cache.
struct MemoryCopies {
  AlignedBuffer<uint8_t> bytes;
  size_t size = 0, count = 1, next = 0;
  explicit MemoryCopies(const TensorView& w) : size(w.nbytes) {
    // EMBER_BENCH_HOT=1 keeps one copy (in cache): the kernel's compute speed, as BM_Matmul.
    count = std::getenv("EMBER_BENCH_HOT") ? 1 : std::max<size_t>(1, memory_span() / size + 1);
    bytes.resize(size * count);
    for (size_t c = 0; c < count; ++c) std::memcpy(bytes.data() + c * size, w.data, size);
  }
  // The view of the next copy.
  TensorView advance(TensorView v) {
    v.data = bytes.data() + next * size;
    next = next + 1 == count ? 0 : next + 1;
    return v;
  }
};

}  // namespace ember::bench
