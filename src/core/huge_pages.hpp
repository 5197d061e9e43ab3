// Memory for large, long-lived buffers (weights copied or repacked at load, KV caches), backed
// by transparent huge pages where the kernel gives them.
//
// Why: decode reads every weight once per token. With 4 KiB pages, a 1.1B model is 150,000
// pages, each a TLB miss and a page walk, and the neuron-sparse kernels touch a new page every
// row or two (a Q4_0 row of 2048 values is 1152 bytes). 2 MiB pages make these walks rare:
// measured on the 2-core Zen 4 box, dense decode +9 % and predictor-mode decode +11 % (see
// docs/benchmarks.md; `ember bench` with and without --mmap).
#pragma once
#include <cstddef>

namespace ember {

constexpr size_t kHugePageBytes = size_t{2} << 20;
// Allocations of at least this size are huge-page aligned and advised (below it, the rounding
// to 2 MiB would waste too much).
constexpr size_t kHugeAllocMin = size_t{4} << 20;

// `bytes` zeroed bytes aligned to 64, or for bytes >= kHugeAllocMin a fresh anonymous mapping
// aligned to kHugePageBytes with MADV_HUGEPAGE (the size rounded up to whole huge pages). With
// `touch`, every page is written once here, so that the cost of making memory resident is paid
// now (at load) rather than at its first use (the first prompt); without, a huge-page mapping's
// pages become resident as they are first written (a buffer filled in parallel a piece at a time).
// Null when the allocation fails. Give it back with free_zeroed(p, bytes), the same bytes.
// Under AddressSanitizer every buffer comes from the heap (where overflows are caught).
void* alloc_zeroed(size_t bytes, bool touch = true);
void free_zeroed(void* p, size_t bytes);

// The memory the system can give without swapping (MemAvailable of /proc/meminfo: free memory
// plus reclaimable caches), 0 where unknown.
size_t available_memory_bytes();

// Bytes of this process's anonymous memory resident now (RssAnon of /proc/self/status), 0 where
// unknown.
size_t anon_rss_bytes();

// Bytes of this process's anonymous memory currently in transparent huge pages
// (AnonHugePages of /proc/self/smaps_rollup), 0 where unknown.
size_t anon_huge_page_bytes();

}  // namespace ember
