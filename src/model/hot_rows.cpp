#include "model/hot_rows.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/mmap_file.hpp"
#include "core/timer.hpp"

namespace ember {
namespace {

// The FFN matrices a layer's neuron rows lie in (those still in the file's map).
std::vector<const TensorView*> neuron_matrices(const Model& m, const FfnWeights& f) {
  std::vector<const TensorView*> v;
  for (const TensorView* w : {&f.gate, &f.up, &f.down_t})
    if (w->valid() && m.file->contains(w->data)) v.push_back(w);
  return v;
}

// Address ranges of rows [0, k) of each matrix, overlapping ones merged (a bundle's three
// matrices are one range).
std::vector<std::pair<const uint8_t*, const uint8_t*>> row_ranges(const std::vector<const TensorView*>& ws, int64_t k) {
  std::vector<std::pair<const uint8_t*, const uint8_t*>> r;
  for (const TensorView* w : ws) r.push_back({w->row(0), w->row(k - 1) + w->row_size()});
  std::sort(r.begin(), r.end());
  std::vector<std::pair<const uint8_t*, const uint8_t*>> merged;
  for (const auto& x : r) {
    if (!merged.empty() && x.first <= merged.back().second) merged.back().second = std::max(merged.back().second, x.second);
    else merged.push_back(x);
  }
  return merged;
}

}  // namespace

HotRows keep_hot_rows(Model& model, size_t bytes) {
  Timer timer;
  HotRows h;
  size_t left = bytes;
  const auto in_map = [&](const TensorView& w) { return w.valid() && model.file->contains(w.data); };
  // 1. What every token reads whole.
  std::vector<const TensorView*> whole;
  for (const LayerWeights& l : model.layers) {
    for (const TensorView* w : l.attention_tensors())
      if (in_map(*w)) whole.push_back(w);
    for (const TensorView* w : l.ffn_block_tensors())
      if (in_map(*w)) whole.push_back(w);
    for (const TensorView* w : {&l.ffn.fc1, &l.ffn.fc2, &l.ffn.up_b})
      if (in_map(*w)) whole.push_back(w);
  }
  for (const TensorView* w : {&model.output_norm, &model.output})
    if (in_map(*w)) whole.push_back(w);
  for (const TensorView* w : whole) {
    if (w->span_bytes() > left) continue;
    left -= w->span_bytes();
    h.every_token_bytes += make_pages_private(w->data, w->span_bytes());
  }
  // 2. The hottest neurons' rows.
  const int64_t L = static_cast<int64_t>(model.layers.size()), n_ff = model.hp.n_ff;
  std::vector<size_t> cost(static_cast<size_t>(L), 0);  // bytes of one neuron's rows in the map
  size_t per_rank = 0;
  const auto bytes_of = [](const std::vector<std::pair<const uint8_t*, const uint8_t*>>& r) {
    size_t n = 0;
    for (const auto& [b, e] : r) n += static_cast<size_t>(e - b);
    return n;
  };
  for (int64_t l = 0; l < L; ++l) {
    // One more neuron's bytes, padding between bundles included.
    const auto ws = neuron_matrices(model, model.layers[l].ffn);
    if (!ws.empty() && model.hp.n_ff >= 2) cost[l] = bytes_of(row_ranges(ws, 2)) - bytes_of(row_ranges(ws, 1));
    per_rank += cost[l];
  }
  std::vector<int64_t> k(static_cast<size_t>(L), 0);
  h.all_neurons = L * n_ff;
  if (per_rank > 0) {
    if (static_cast<int64_t>(model.neuron_freq.size()) == L * n_ff) {
      std::vector<std::pair<float, int32_t>> all;  // (frequency, layer), the most frequent first
      all.reserve(static_cast<size_t>(L * n_ff));
      double total = 0;
      for (int64_t l = 0; l < L; ++l)
        for (int64_t i = 0; i < n_ff; ++i) {
          const float f = model.neuron_freq[static_cast<size_t>(l * n_ff + i)];
          total += f;
          if (cost[l] > 0) all.push_back({f, static_cast<int32_t>(l)});
        }
      std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      for (const auto& [f, l] : all) {  // a layer's count of its hottest
        if (cost[l] > left) break;
        left -= cost[l];
        ++k[l];
      }
      // What the prefixes kept hold (a file's bands of neurons that fire together are hot first
      // only band by band, so a prefix is not exactly the hottest).
      double kept = 0;
      for (int64_t l = 0; l < L; ++l)
        for (int64_t i = 0; i < k[l]; ++i) kept += model.neuron_freq[static_cast<size_t>(l * n_ff + i)];
      h.firing_share = total > 0 ? kept / total : 0.0;
    } else {
      const int64_t each = std::min<int64_t>(n_ff, static_cast<int64_t>(left / per_rank));
      for (int64_t l = 0; l < L; ++l) k[l] = cost[l] > 0 ? each : 0;
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    if (k[l] == 0) continue;
    for (const auto& [b, e] : row_ranges(neuron_matrices(model, model.layers[l].ffn), k[l]))
      h.neuron_bytes += make_pages_private(b, static_cast<size_t>(e - b));
    h.neurons += k[l];
  }
  model.hot_neurons = std::move(k);
  h.seconds = timer.seconds();
  return h;
}

}  // namespace ember
