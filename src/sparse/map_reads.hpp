// Rows of a dense model's FFN left in the file's map (a model larger than its memory budget,
// Model::resident_weight_budget) made resident before a sparse kernel reads them. The kernel's
// own page faults would come one at a time, each waiting on the disk; here the pages of every
// listed row are faulted in by kThreads reading threads at once, so the disk has that many reads
// in flight. The bytes are the file's, read where they lie: the tokens are those of a run with
// no budget, bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/thread_pool.hpp"
#include "gguf/reader.hpp"
#include "tensor/tensor_view.hpp"

namespace ember {

struct MapReadStats {
  uint64_t calls = 0;
  uint64_t pages = 0;      // pages touched (each a read where the page cache did not hold it)
  double seconds = 0;      // waiting on them
};

class MapReads {
 public:
  // Reads in flight: 64 decode the 7B ReLU shape at a third of its bytes at 0.50 tok/s, 16 at
  // 0.46 (docs/benchmarks.md, "Models bigger than memory"). They wait on the disk, not the cores.
  static constexpr int kThreads = 64;
  explicit MapReads(const gguf::Reader& file);

  // The pages of rows ids[0..n) of each matrix in `ws` that lies in the file's map.
  void rows(std::initializer_list<const TensorView*> ws, const int32_t* ids, int64_t n);
  // Every page of each matrix in `ws` that lies in the file's map (a dense batch).
  void all(std::initializer_list<const TensorView*> ws);

  const MapReadStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  void touch();  // pages_, sorted and deduplicated, on the reading threads

  const gguf::Reader& file_;
  ThreadPool io_;
  std::vector<uintptr_t> pages_;
  MapReadStats stats_;
};

}  // namespace ember
