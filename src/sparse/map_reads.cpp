#include "sparse/map_reads.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "core/mmap_file.hpp"
#include "core/timer.hpp"

namespace ember {

namespace {
uintptr_t page_size() {
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}
}  // namespace

MapReads::MapReads(const gguf::Reader& file) : file_(file), io_(kThreads) {}

void MapReads::rows(std::initializer_list<const TensorView*> ws, const int32_t* ids, int64_t n, int64_t kept) {
  const uintptr_t page = page_size();
  pages_.clear();
  int64_t n_kept = 0;
  for (int64_t i = 0; i < n; ++i) n_kept += ids[i] < kept ? 1 : 0;
  stats_.rows += static_cast<uint64_t>(n);
  stats_.kept_rows += static_cast<uint64_t>(n_kept);
  next_cold_.clear();
  for (const TensorView* w : ws) {
    if (!w->valid() || !file_.contains(w->data)) continue;
    const size_t size = w->row_size();
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < kept) continue;
      const auto p = reinterpret_cast<uintptr_t>(w->row(ids[i]));
      for (uintptr_t q = p / page * page; q < p + size; q += page) pages_.push_back(q);
      lo = std::min(lo, p), hi = std::max(hi, p + size);
    }
    if (hi > lo) next_cold_.push_back({lo, hi});
  }
  // A bundle's three views span the same rows: one span for them.
  std::sort(next_cold_.begin(), next_cold_.end());
  size_t m = 0;
  for (const auto& x : next_cold_) {
    if (m > 0 && x.first <= next_cold_[m - 1].second) next_cold_[m - 1].second = std::max(next_cold_[m - 1].second, x.second);
    else next_cold_[m++] = x;
  }
  next_cold_.resize(m);
  touch();
}

void MapReads::all(std::initializer_list<const TensorView*> ws) {
  const uintptr_t page = page_size();
  pages_.clear();
  next_cold_.clear();  // whole matrices, their kept rows among them: left as they are
  for (const TensorView* w : ws) {
    if (!w->valid() || !file_.contains(w->data)) continue;
    const auto p = reinterpret_cast<uintptr_t>(w->data);
    for (uintptr_t q = p / page * page; q < p + w->span_bytes(); q += page) pages_.push_back(q);
  }
  touch();
}

void MapReads::touch() {
  // The last call's pages have been read by their kernels (a layer reads its rows before they
  // run, and its next read, or the next layer's, comes after): cold again, so that the page cache
  // reclaims them before the pages asked for now (a page faulted in, then read by a kernel, would
  // otherwise outlive newer ones; at a budget's margin the layer's own rows went first). One call
  // a matrix, over the span from its first row read to its last: rows past the kept ones only.
  for (const auto& [b, e] : cold_) pages_are_cold(reinterpret_cast<const void*>(b), e - b);
  cold_.swap(next_cold_);
  if (pages_.empty()) return;
  Timer t;
  std::sort(pages_.begin(), pages_.end());
  pages_.erase(std::unique(pages_.begin(), pages_.end()), pages_.end());
  const uintptr_t page = page_size();
  runs_.clear();
  for (uintptr_t p : pages_) {
    if (!runs_.empty() && runs_.back().second == p) runs_.back().second += page;
    else runs_.push_back({p, p + page});
  }
  const int64_t n = static_cast<int64_t>(runs_.size());
  io_.run([&](int ith, int nth) {
    // Every run of this thread asked of the disk first (reads in flight at once), then waited for.
    for (int64_t i = ith; i < n; i += nth)
      read_pages_ahead(reinterpret_cast<const void*>(runs_[i].first), runs_[i].second - runs_[i].first);
    uint8_t sum = 0;
    for (int64_t i = ith; i < n; i += nth)
      for (uintptr_t p = runs_[i].first; p < runs_[i].second; p += page)
        sum ^= *reinterpret_cast<const volatile uint8_t*>(p);
    (void)sum;
  });
  ++stats_.calls;
  stats_.pages += static_cast<uint64_t>(pages_.size());
  stats_.runs += static_cast<uint64_t>(n);
  stats_.seconds += t.seconds();
}

}  // namespace ember
