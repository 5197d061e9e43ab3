#include "engine/sampler.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "model/model.hpp"
#include "ops/cpu/vec.hpp"

namespace ember {

void check_logits(const float* logits, int64_t n_vocab, int64_t pos) {
  float sum = 0;  // NaN or infinity in any logit makes the sum not finite
  for (int64_t i = 0; i < n_vocab; ++i) sum += logits[i] * 0.0f;
  EMBER_CHECK(std::isfinite(sum), "the model computed logits that are not finite (NaN or infinity) at position {}: a "
              "weight of the file is likely corrupt (`ember inspect --verify MODEL` names the tensor)", pos);
}

std::optional<SamplerParams> recommended_sampling(const Model& model) {
  const std::string base = model.file->opt_string("general.basename").value_or("");
  SamplerParams p;
  if (base == "smollm2") {  // the SmolLM2 model cards
    p.temperature = 0.2f, p.top_p = 0.9f;
    return p;
  }
  if (base == "gemma-3") {  // Gemma 3's generation_config.json
    p.temperature = 1.0f, p.top_k = 64, p.top_p = 0.95f, p.min_p = 0.0f;
    return p;
  }
  return std::nullopt;
}

SamplerParams default_sampling(const Model& model) { return recommended_sampling(model).value_or(SamplerParams{}); }


Sampler::Sampler(const SamplerParams& p, int64_t n_vocab) : params_(p), n_vocab_(n_vocab), rng_(p.seed) {
  EMBER_CHECK(n_vocab > 0, "sampler: empty vocabulary");
  EMBER_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, "--temp must be >= 0, got {}", p.temperature);
  EMBER_CHECK(p.top_p > 0 && p.top_p <= 1.0f + 1e-6f, "--top-p must be in (0, 1], got {}", p.top_p);
  EMBER_CHECK(p.min_p >= 0 && p.min_p <= 1, "--min-p must be in [0, 1], got {}", p.min_p);
  EMBER_CHECK(p.repeat_penalty > 0, "--repeat-penalty must be positive, got {}", p.repeat_penalty);
  EMBER_CHECK(p.repeat_last_n >= 0, "--repeat-last-n must be >= 0");
  EMBER_CHECK(std::isfinite(p.presence_penalty) && std::isfinite(p.frequency_penalty), "the penalties must be finite");
  for (const auto& [id, bias] : p.logit_bias)
    EMBER_CHECK(id >= 0 && id < n_vocab && std::isfinite(bias), "a logit bias for token {} ({}): tokens are 0 to {}, "
                "biases finite", id, bias, n_vocab - 1);
  plain_ = p.repeat_penalty == 1.0f && p.presence_penalty == 0 && p.frequency_penalty == 0 && p.logit_bias.empty();
  cand_.reserve(n_vocab);
  probs_.reserve(n_vocab);
}

void Sampler::reset() {
  recent_.clear();
  generated_.clear();
  rng_.seed(params_.seed);
}

void Sampler::accept(int32_t token, bool generated) {
  if (generated && (params_.presence_penalty != 0 || params_.frequency_penalty != 0)) ++generated_[token];
  if (params_.repeat_last_n <= 0) return;
  recent_.push_back(token);
  while (static_cast<int>(recent_.size()) > params_.repeat_last_n) recent_.pop_front();
}

int32_t Sampler::sample(const float* logits, const TokenFilter& allowed) {
  if (params_.temperature <= 0 && plain_) {
    const auto best = static_cast<int32_t>(cpu::argmax_f32(logits, n_vocab_));  // greedy: no candidate list
    if (!allowed || allowed(best)) return best;
  }
  cand_.clear();
  for (int64_t i = 0; i < n_vocab_; ++i) cand_.push_back({static_cast<int32_t>(i), logits[i]});
  for (const auto& [id, bias] : params_.logit_bias) cand_[static_cast<size_t>(id)].logit += bias;

  // Repetition penalty (as in CTRL / llama.cpp): divide positive logits, multiply negative ones,
  // once per distinct recent token.
  if (params_.repeat_penalty != 1.0f) {
    for (size_t k = 0; k < recent_.size(); ++k) {
      int32_t id = recent_[k];
      if (id < 0 || id >= n_vocab_) continue;
      if (std::find(recent_.begin(), recent_.begin() + k, id) != recent_.begin() + k) continue;
      float& l = cand_[id].logit;
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
  }
  for (const auto& [id, n] : generated_)
    if (id >= 0 && id < n_vocab_)
      cand_[static_cast<size_t>(id)].logit -= static_cast<float>(n) * params_.frequency_penalty + params_.presence_penalty;

  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t n = cand_.size();
  if (allowed) {
    // The chain below over the allowed tokens only: the best `want` of them, most likely first.
    // Usually they are among the most likely 256; when not (the grammar allows few tokens), the
    // rest are filtered first and only the survivors sorted.
    const size_t want = params_.temperature <= 0 ? 1 : params_.top_k > 0 ? static_cast<size_t>(params_.top_k) : n;
    const size_t head = std::min<size_t>(n, 256);
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(head), cand_.end(), by_logit);
    size_t kept = 0;
    for (size_t i = 0; i < head && kept < want; ++i)
      if (allowed(cand_[i].id)) cand_[kept++] = cand_[i];
    if (kept < want && head < n) {
      size_t m = kept;
      for (size_t i = head; i < n; ++i)
        if (allowed(cand_[i].id)) cand_[m++] = cand_[i];
      const size_t upto = std::min(m, want);
      std::partial_sort(cand_.begin() + static_cast<std::ptrdiff_t>(kept), cand_.begin() + static_cast<std::ptrdiff_t>(upto),
                        cand_.begin() + static_cast<std::ptrdiff_t>(m), by_logit);
      kept = upto;
    }
    if (kept == 0) return -1;
    n = kept;
    if (params_.temperature <= 0) return cand_[0].id;
  } else if (params_.temperature <= 0) {
    auto best = std::max_element(cand_.begin(), cand_.end(),
                                 [](const Candidate& a, const Candidate& b) { return a.logit < b.logit; });
    return best->id;
  } else if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + params_.top_k, cand_.end(), by_logit);
    n = params_.top_k;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }

  // Softmax over the survivors (at temperature 1 for the top-p / min-p filters, as llama.cpp).
  auto softmax = [&](float temp) {
    probs_.resize(n);
    float mx = cand_[0].logit;
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += probs_[i] = std::exp((cand_[i].logit - mx) / temp);
    for (size_t i = 0; i < n; ++i) probs_[i] = static_cast<float>(probs_[i] / sum);
  };
  softmax(1.0f);
  if (params_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += probs_[i];
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = std::max<size_t>(keep, 1);
  }
  if (params_.min_p > 0) {
    float limit = probs_[0] * params_.min_p;
    size_t keep = 1;
    while (keep < n && probs_[keep] >= limit) ++keep;
    n = keep;
  }
  softmax(params_.temperature);
  // Inverse-CDF draw: 53 random bits, no allocation.
  double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53, cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += probs_[i];
    if (u < cum) return cand_[i].id;
  }
  return cand_[n - 1].id;
}

}  // namespace ember
