// A memory read-bandwidth probe: the yardstick for memory-bound kernels (decode matvec).
#pragma once
#include <cstddef>

#include "core/thread_pool.hpp"

namespace ember::cpu {

// Reads a buffer of `bytes` (allocated and touched here; use well beyond the last-level cache,
// e.g. 1 GiB) with every thread of the pool, each summing its own slice; returns the best of a
// few runs in bytes per second.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes);

// The same buffer cut into rows of `row_bytes` (a multiple of 64), of which a fixed random
// `keep` share (0 < keep <= 1) is read, in order, each thread its slice of every kept row, with
// the slice `kScatterAhead` kept rows on prefetched into L2 line by line: the access pattern of
// the input-channel-major sparse axpy (ops/cpu/nm4/nm4.hpp, sparse/sparse.hpp) with no arithmetic, i.e. the
// most those kernels can read. Bytes per second of the kept rows, the best of a few runs.
double measure_scattered_read_bandwidth(ThreadPool& pool, size_t bytes, size_t row_bytes, double keep);
constexpr int kScatterAhead = 8;

}  // namespace ember::cpu
