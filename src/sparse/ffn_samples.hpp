// Predictor training samples (sparse/predictor_train.hpp): per layer, the FFN inputs of a subset
// of the tokens that ran, the neurons that fired for each and their activation mass, recorded by
// an FFN executor on its way through the forward pass (the trainer's own, or the profiler's, so
// that `ember sparsify` and `ember profile --samples` profile and sample in one pass).
#pragma once
#include <cstdint>
#include <vector>

namespace ember {

// One layer's training data: n tokens of x and their firing neurons (CSR-style lists).
struct LayerSamples {
  int64_t n_embd = 0, n_ff = 0, n = 0;
  std::vector<float> x;            // [n][n_embd]
  std::vector<uint32_t> offsets;   // [n + 1]: token t's neurons are idx/mass[offsets[t] .. offsets[t+1])
  std::vector<int32_t> idx;        // firing neurons, ascending per token
  std::vector<float> mass;         // |act(gate) * up| of each

  void add_token(const float* x_row, const int32_t* ids, const float* masses, int64_t count);
};

// Which tokens a recorder keeps: an even spread of at most max_tokens of the first `total` tokens
// through the FFN (token i is kept when floor(i * kept / total) steps). batch(layer, n) is called
// for each layer of each batch of n tokens, layer 0 first; keep(t) then says whether the batch's
// token t is kept.
class TokenSpread {
 public:
  TokenSpread(int64_t total, int64_t max_tokens);
  void batch(int64_t layer, int64_t n) {
    if (layer == 0) batch_start_ = seen_, seen_ += n;
  }
  bool keep(int64_t t) const {
    const int64_t i = batch_start_ + t;
    return i < total_ && (i * kept_ / total_) != ((i + 1) * kept_ / total_);
  }
  int64_t kept() const { return kept_; }

 private:
  int64_t total_, kept_, seen_ = 0, batch_start_ = 0;
};

// Keeps the tokens of a TokenSpread. The forward pass calls record() for each layer of each
// batch, layer 0 first, with the batch's FFN input x, firing values a and values h
// (model/ffn.hpp); a neuron fires by ffn_fires at the layer's threshold, and its mass is |h|.
class FfnSampleRecorder {
 public:
  FfnSampleRecorder(int64_t n_layer, int64_t n_embd, int64_t n_ff, int64_t total, int64_t max_tokens);
  void record(int64_t layer, const float* x, const float* a, const float* h, int64_t n, float threshold);
  // The samples recorded (moved out; the recorder is spent).
  std::vector<LayerSamples> take() { return std::move(layers_); }
  int64_t kept() const { return layers_.empty() ? 0 : layers_[0].n; }

 private:
  std::vector<LayerSamples> layers_;
  TokenSpread spread_;
  std::vector<int32_t> ids_;
  std::vector<float> masses_;
};

}  // namespace ember
