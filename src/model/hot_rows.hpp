// A dense model larger than its memory budget (Model::resident_weight_budget): of what the
// repacking left in the file's map, the part worth keeping is kept resident, in this order:
//   1. what every token reads whole: the norms and biases, the predictors (fc1, fc2), and any
//      matrix outside the FFN's neuron rows (attention, the output head) the repacking did not
//      take;
//   2. the FFN rows of the hottest neurons: by the profile's firing frequencies
//      (Model::neuron_freq, ember prepare), the most frequent first over all layers; a prepared
//      file orders each layer hot first, so a layer's kept neurons are its first k
//      (Model::hot_neurons). Without frequencies, an equal count in every layer.
// Their pages in the map are made the process's own (make_pages_private): the kernel reclaims a
// file's pages from the page cache under a memory limit, never these, and the kernels read them
// where they lie: the same bytes at the same addresses, so the same tokens. The cold neurons'
// rows are read as the predictor names them (sparse/map_reads.hpp), which skips the kept ones.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "model/model.hpp"

namespace ember {

struct HotRows {
  size_t every_token_bytes = 0;  // kept of step 1
  size_t neuron_bytes = 0;       // kept of step 2
  int64_t neurons = 0, all_neurons = 0;
  double firing_share = -1.0;    // of the profile's firings the kept neurons hold (-1: no frequencies)
  double seconds = 0.0;
};

// Of a memory budget, what stays free of repacked and kept weights: the page cache the rows each
// token reads pass through (a layer's share at a time) and buffers made after loading; at most a
// quarter of a small budget.
inline size_t page_cache_slack(size_t budget) {
  return std::min(std::max(budget / 32, size_t{48} << 20), budget / 4);
}

// Keeps at most `bytes` resident as above and sets model.hot_neurons.
HotRows keep_hot_rows(Model& model, size_t bytes);

}  // namespace ember
