#include "sparse/map_reads.hpp"

#include <unistd.h>

#include <algorithm>

#include "core/timer.hpp"

namespace ember {

namespace {
uintptr_t page_size() {
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}
}  // namespace

MapReads::MapReads(const gguf::Reader& file) : file_(file), io_(kThreads) {}

void MapReads::rows(std::initializer_list<const TensorView*> ws, const int32_t* ids, int64_t n) {
  const uintptr_t page = page_size();
  pages_.clear();
  for (const TensorView* w : ws) {
    if (!w->valid() || !file_.contains(w->data)) continue;
    const size_t size = w->row_size();
    for (int64_t i = 0; i < n; ++i) {
      const auto p = reinterpret_cast<uintptr_t>(w->row(ids[i]));
      for (uintptr_t q = p / page * page; q < p + size; q += page) pages_.push_back(q);
    }
  }
  touch();
}

void MapReads::all(std::initializer_list<const TensorView*> ws) {
  const uintptr_t page = page_size();
  pages_.clear();
  for (const TensorView* w : ws) {
    if (!w->valid() || !file_.contains(w->data)) continue;
    const auto p = reinterpret_cast<uintptr_t>(w->data);
    for (uintptr_t q = p / page * page; q < p + w->nbytes; q += page) pages_.push_back(q);
  }
  touch();
}

void MapReads::touch() {
  if (pages_.empty()) return;
  Timer t;
  std::sort(pages_.begin(), pages_.end());
  pages_.erase(std::unique(pages_.begin(), pages_.end()), pages_.end());
  const int64_t n = static_cast<int64_t>(pages_.size());
  io_.run([&](int ith, int nth) {
    uint8_t sum = 0;
    for (int64_t i = ith; i < n; i += nth) sum ^= *reinterpret_cast<const volatile uint8_t*>(pages_[i]);
    (void)sum;
  });
  ++stats_.calls;
  stats_.pages += static_cast<uint64_t>(n);
  stats_.seconds += t.seconds();
}

}  // namespace ember
