#include "core/huge_pages.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace ember {

namespace {

size_t huge_size(size_t bytes) { return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;  // keep every buffer on the heap, where ASan sees overflows
#else
constexpr bool kSanitized = false;
#endif

bool huge_allocation(size_t bytes) { return !kSanitized && bytes >= kHugeAllocMin; }

// The value in kB of `key` in a /proc file of "Key: value kB" lines, in bytes; 0 if absent.
size_t proc_kb(const char* path, const std::string& key) {
  std::ifstream f(path);
  std::string k;
  while (f >> k) {
    if (k == key) {
      size_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
    f.ignore(4096, '\n');
  }
  return 0;
}

}  // namespace

void* alloc_zeroed(size_t bytes, bool touch) {
  if (!huge_allocation(bytes)) {
    const size_t n = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, n);
    if (p) std::memset(p, 0, n);
    return p;
  }
  // Map a huge page more than needed and trim both ends to the alignment.
  const size_t n = huge_size(bytes), span = n + kHugePageBytes;
  void* m = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (base + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  if (start > base) ::munmap(m, start - base);
  if (base + span > start + n) ::munmap(reinterpret_cast<void*>(start + n), base + span - (start + n));
  // Before the first touch, so that the pages are faulted in huge (a no-op where transparent
  // huge pages are off).
  ::madvise(reinterpret_cast<void*>(start), n, MADV_HUGEPAGE);
  if (touch) std::memset(reinterpret_cast<void*>(start), 0, n);
  return reinterpret_cast<void*>(start);
}

void free_zeroed(void* p, size_t bytes) {
  if (!p) return;
  if (!huge_allocation(bytes))
    std::free(p);
  else
    ::munmap(p, huge_size(bytes));
}

size_t available_memory_bytes() { return proc_kb("/proc/meminfo", "MemAvailable:"); }

size_t anon_rss_bytes() { return proc_kb("/proc/self/status", "RssAnon:"); }

size_t anon_huge_page_bytes() { return proc_kb("/proc/self/smaps_rollup", "AnonHugePages:"); }

}  // namespace ember
