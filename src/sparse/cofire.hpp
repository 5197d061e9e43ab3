// Neurons that fire together, laid out together (PowerInfer-2's neuron clusters). A model read
// from its file under a memory budget (model/hot_rows.hpp, sparse/map_reads.hpp) fetches each
// missed neuron's rows, a bundle of a page or two (`ember prepare --bundle`); with neurons in
// plain hot-first order the neurons a token needs past the kept prefix seldom neighbour each
// other, so nearly every one is a read of its own, and the disk's reads a second set the pace.
// Ordering each band of the hot-first order so that neurons which fire for the same tokens are
// neighbours turns those into longer runs of pages: fewer, larger reads for the same bytes.
//
// The profiler records which neurons fired for an even spread of at most `max_tokens` of the
// tokens it counts (FiringRecord: a bit per token and neuron, neuron-major), and derives each
// layer's order (cofire_order): the hot-first order cut into bands of kCofireBand neurons (a
// prefix of any length is still, to within a band, the hottest neurons: what a budget keeps),
// each band a greedy chain that starts at its hottest neuron and steps to the unplaced neuron
// whose firing is most like the current one's (cosine of the two tokens-fired sets: both fired /
// sqrt(each fired)), ties and neurons that never fired with the current one taken hottest first.
// The profile stores the order (blk.N.ffn_cluster_order, docs/sparse_formats.md); `ember
// prepare` lays the neurons out in it.
#pragma once
#include <cstdint>
#include <vector>

#include "core/thread_pool.hpp"
#include "sparse/ffn_samples.hpp"

namespace ember {

// Neurons a band of the clustered order holds (its last may hold fewer).
constexpr int64_t kCofireBand = 256;
// Tokens the profiler records firing for, at most.
constexpr int64_t kCofireTokens = 2048;

class FiringRecord {
 public:
  // n_layer layers of n_ff neurons; an even spread of at most max_tokens of `total` tokens.
  FiringRecord(int64_t n_layer, int64_t n_ff, int64_t total, int64_t max_tokens);
  // Called for each layer of each batch, layer 0 first, with the batch's n x n_ff firing values
  // a: neuron j fired for a kept token when ffn_fires(a, threshold) (model/ffn.hpp).
  void record(int64_t layer, const float* a, int64_t n, float threshold);
  int64_t n_ff() const { return n_ff_; }
  int64_t words() const { return words_; }
  int64_t tokens() const { return next_.empty() ? 0 : next_[0]; }  // kept tokens recorded (layer 0)
  // Layer l's bits: neuron j's words at bits(l) + j * words(); bit t of them: fired for kept token t.
  const uint64_t* bits(int64_t layer) const { return bits_[static_cast<size_t>(layer)].data(); }

 private:
  TokenSpread spread_;
  int64_t n_ff_, words_;
  std::vector<std::vector<uint64_t>> bits_;
  std::vector<int64_t> next_;  // per layer: the kept tokens recorded so far
};

// The clustered order of one layer (see above) from its hot-first order (hot_first[i]: the
// neuron at position i) and its firing bits (words 64-bit words a neuron, neuron-major).
std::vector<int32_t> cofire_order(const uint64_t* bits, int64_t words, const std::vector<int32_t>& hot_first,
                                  int64_t band = kCofireBand);

// Neurons a token needs past the first `kept` of an order, in runs of neighbours: how many runs
// (reads from a file) and neurons, over tokens first, first + step, ... below `tokens`.
struct RunCount {
  int64_t runs = 0, neurons = 0;
};
RunCount count_runs(const uint64_t* bits, int64_t words, int64_t tokens, const std::vector<int32_t>& order, int64_t kept,
                    int64_t first = 0, int64_t step = 1);

// Every layer's clustered order (cofire_order), layers in parallel on pool; counts[l]: layer l's
// firing counts, whose hot-first order (sparse/reorder.hpp) the bands cut. With the orders, what
// they are worth on tokens they were not made from: an order made from the even recorded tokens
// alone, and the runs the odd tokens' neurons past each layer's hottest tenth make in it and in
// the hot-first order (what the profiler reports: an order fitted to its own tokens looks better
// than it is, chance coincidences of rare neurons included).
struct CofireOrders {
  std::vector<std::vector<int32_t>> orders;
  RunCount hot_first, clustered;
};
CofireOrders cofire_orders(ThreadPool& pool, const FiringRecord& rec, const std::vector<std::vector<float>>& counts);

}  // namespace ember
