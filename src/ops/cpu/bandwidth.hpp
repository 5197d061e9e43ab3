// A memory read-bandwidth probe: the yardstick for memory-bound kernels (decode matvec).
#pragma once
#include <cstddef>

#include "core/thread_pool.hpp"

namespace ember::cpu {

// Reads a buffer of `bytes` (allocated and touched here; use well beyond the last-level cache,
// e.g. 1 GiB) with every thread of the pool, each summing its own slice; returns the best of a
// few runs in bytes per second.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes);

}  // namespace ember::cpu
