// Token sampling as llama.cpp's default chain does it: logit biases, penalties (repetition;
// OpenAI's presence and frequency), top-k, top-p, min-p, temperature, then a draw from the
// distribution. Greedy when temperature <= 0. Deterministic for a seed. Buffers are sized once
// for the vocabulary.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ember {

struct SamplerParams {
  float temperature = 0.8f;
  int top_k = 40;          // <= 0: off
  float top_p = 0.95f;     // >= 1: off
  float min_p = 0.05f;     // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;
  // OpenAI's penalties over the tokens generated so far (not the prompt's): a token's logit less
  // frequency_penalty for each time it was generated and presence_penalty once if it was.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Added to the logits of these tokens (OpenAI's logit_bias; -100 bans a token in practice).
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;
};

// Throws ember::Error when the logits of the token at position `pos` hold a value that is not
// finite: a NaN from a corrupt weight (a NaN scale in a middle row, which loading does not read)
// must stop the run with its cause, not sample garbage silently.
void check_logits(const float* logits, int64_t n_vocab, int64_t pos);

struct Model;
// The sampling a model's authors recommend, by general.basename (SmolLM2: temperature 0.2,
// top-p 0.9; Gemma 3: temperature 1.0, top-k 64, top-p 0.95, no min-p); nullopt when unknown.
// The CLI's flags and the server's requests default to it.
std::optional<SamplerParams> recommended_sampling(const Model& model);
// recommended_sampling, else llama.cpp's defaults (SamplerParams{}).
SamplerParams default_sampling(const Model& model);

class Sampler {
 public:
  Sampler(const SamplerParams& params, int64_t n_vocab);
  // Which tokens may be picked (constrained generation); empty: all.
  using TokenFilter = std::function<bool(int32_t)>;
  // Picks the next token from logits (n_vocab floats): the chain over the tokens `allowed`
  // accepts (top-k: the k most likely allowed ones). Returns -1 when no token is allowed.
  int32_t sample(const float* logits, const TokenFilter& allowed = {});
  // Records a token for the repetition penalty, and a generated one for the presence and frequency
  // penalties too.
  void accept(int32_t token, bool generated = false);
  void reset();
  const SamplerParams& params() const { return params_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };
  SamplerParams params_;
  int64_t n_vocab_;
  std::mt19937_64 rng_;
  std::vector<Candidate> cand_;
  std::vector<float> probs_;
  std::deque<int32_t> recent_;
  std::unordered_map<int32_t, int32_t> generated_;  // token -> times generated
  bool plain_ = true;  // no bias, no penalty: greedy is an argmax of the raw logits
};

}  // namespace ember
