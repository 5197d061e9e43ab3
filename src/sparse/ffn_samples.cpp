#include "sparse/ffn_samples.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "model/ffn.hpp"

namespace ember {

void LayerSamples::add_token(const float* x_row, const int32_t* ids, const float* masses, int64_t count) {
  if (offsets.empty()) offsets.push_back(0);
  x.insert(x.end(), x_row, x_row + n_embd);
  idx.insert(idx.end(), ids, ids + count);
  mass.insert(mass.end(), masses, masses + count);
  offsets.push_back(static_cast<uint32_t>(idx.size()));
  ++n;
}

TokenSpread::TokenSpread(int64_t total, int64_t max_tokens) : total_(total), kept_(std::min(total, max_tokens)) {
  EMBER_CHECK(total >= 1 && max_tokens >= 1, "recording needs tokens to keep (total {}, at most {})", total, max_tokens);
}

FfnSampleRecorder::FfnSampleRecorder(int64_t n_layer, int64_t n_embd, int64_t n_ff, int64_t total, int64_t max_tokens)
    : layers_(static_cast<size_t>(n_layer)), spread_(total, max_tokens), ids_(n_ff), masses_(n_ff) {
  for (LayerSamples& s : layers_) {
    s.n_embd = n_embd, s.n_ff = n_ff;
    s.x.reserve(static_cast<size_t>(spread_.kept() * n_embd));
    s.offsets.reserve(static_cast<size_t>(spread_.kept() + 1));
  }
}

void FfnSampleRecorder::record(int64_t layer, const float* x, const float* a, const float* h, int64_t n,
                               float threshold) {
  LayerSamples& s = layers_[static_cast<size_t>(layer)];
  spread_.batch(layer, n);
  for (int64_t t = 0; t < n; ++t) {
    if (!spread_.keep(t)) continue;
    const float* at = a + t * s.n_ff;
    const float* ht = h + t * s.n_ff;
    int64_t c = 0;
    for (int64_t j = 0; j < s.n_ff; ++j)
      if (ffn_fires(at[j], threshold)) ids_[c] = static_cast<int32_t>(j), masses_[c++] = std::fabs(ht[j]);
    s.add_token(x + t * s.n_embd, ids_.data(), masses_.data(), c);
  }
}

}  // namespace ember
