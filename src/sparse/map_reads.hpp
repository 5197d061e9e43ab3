// Rows of a dense model's FFN left in the file's map (a model larger than its memory budget,
// Model::resident_weight_budget) made resident before a sparse kernel reads them. The kernel's
// own page faults would come one at a time, each waiting on the disk; here the pages of every
// listed row are gathered into runs of consecutive pages (a neuron's bundle, neighbours), every
// run is asked of the disk as one read at once (read_pages_ahead), and kThreads threads then
// fault the pages in as they arrive. Rows the model keeps resident (Model::hot_neurons,
// model/hot_rows.hpp) are skipped. The bytes are the file's, read where they lie: the tokens are
// those of a run with no budget, bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/thread_pool.hpp"
#include "gguf/reader.hpp"
#include "tensor/tensor_view.hpp"

namespace ember {

struct MapReadStats {
  uint64_t calls = 0;
  uint64_t rows = 0;       // neurons whose rows were asked for
  uint64_t kept_rows = 0;  // of those, kept resident (no read)
  uint64_t pages = 0;      // pages touched (each a read where the page cache did not hold it)
  uint64_t runs = 0;       // runs of consecutive pages asked of the disk
  double seconds = 0;      // waiting on them
};

class MapReads {
 public:
  // Threads that ask for the runs and wait for them. The reads themselves are in flight at once
  // whatever their number (read_pages_ahead does not wait): on the 7B ReLU shape at a third of
  // its bytes 2, 8, 16 and 64 threads decode within noise of each other (docs/benchmarks.md,
  // "Models bigger than memory"), the disk's reads a second being the bound.
  static constexpr int kThreads = 8;
  explicit MapReads(const gguf::Reader& file);

  // The pages of rows ids[0..n) of each matrix in `ws` that lies in the file's map, but for rows
  // below `kept` (resident: Model::hot_neurons_of).
  void rows(std::initializer_list<const TensorView*> ws, const int32_t* ids, int64_t n, int64_t kept = 0);
  // Every page of each matrix in `ws` that lies in the file's map (a dense batch).
  void all(std::initializer_list<const TensorView*> ws);

  const MapReadStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  void touch();  // pages_, sorted and deduplicated, on the reading threads

  const gguf::Reader& file_;
  ThreadPool io_;
  std::vector<uintptr_t> pages_;
  std::vector<std::pair<uintptr_t, uintptr_t>> runs_;  // [first page, end) of consecutive pages
  // Per matrix of the last call (cold_) and of this one (next_cold_): the span of its rows read,
  // advised cold when the next call comes.
  std::vector<std::pair<uintptr_t, uintptr_t>> cold_, next_cold_;
  MapReadStats stats_;
};

}  // namespace ember
