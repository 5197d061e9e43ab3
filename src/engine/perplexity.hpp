// Perplexity and KL divergence against a saved base run, as llama.cpp's perplexity tool computes
// them: the text is cut into non-overlapping chunks of n_ctx tokens (the first token of each
// chunk replaced by BOS when the model adds one), each chunk is evaluated from position 0, and
// the second half of each chunk is scored: the logits at position j predict token j + 1, for j
// in [n_ctx/2, n_ctx - 1). Errors are one standard error, as llama.cpp prints them.
//
// Log-prob files (--save-logits / --kl-base) hold, per scored token, the full distribution as
// 16-bit fixed-point log-probs (llama.cpp stores uint16 log-probs as well; the format differs):
//
//   header  "EMBERLP1", u32 version (1), u32 n_vocab, u32 n_ctx, u32 n_chunk, u32 first (=n_ctx/2),
//           u32 0, then i32 tokens[n_chunk * n_ctx] (the evaluated input, BOS replacement included)
//   rows    per chunk, per scored token (n_ctx - 1 - first of them):
//           i32 top1 (argmax), f32 lp_true (log-prob of the actual next token), f32 lp_max,
//           u16 q[n_vocab] with log-prob_i = lp_max - q_i * kLogProbStep, clamped at
//           lp_max - 65535 * kLogProbStep (about 40 nats below the top: p < 5e-18 of it)
//
// Reading a base file checks that n_vocab, n_ctx and the tokens are those of the current run.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/session.hpp"

namespace ember {

inline constexpr double kLogProbStep = 40.0 / 65535.0;

struct PerplexityOptions {
  int64_t n_ctx = 512;     // chunk length in tokens (<= the session's context)
  int64_t max_chunks = 0;  // 0: every whole chunk of the text
  std::string save_logits;  // write the log-prob file here (empty: no)
  std::string kl_base;      // compare against this log-prob file (empty: no)
};

// Sums over the scored tokens of a run; the derived numbers follow llama.cpp.
struct PerplexityReport {
  int64_t n_chunks = 0, n_scored = 0;
  double ppl = 0, ppl_err = 0;  // exp(mean nll), its standard error (delta method)
  // With a base run:
  bool has_base = false;
  double base_ppl = 0, base_ppl_err = 0;
  double ln_ratio = 0, ln_ratio_err = 0;  // mean of ln p_base(true) - ln p(true) = ln(PPL/PPL_base)
  double kld_mean = 0, kld_err = 0, kld_median = 0, kld_p99 = 0, kld_max = 0;
  double same_top1 = 0, same_top1_err = 0;  // fraction of tokens with the base's argmax
};

// Runs the text's tokens through the session chunk by chunk. `bos` replaces the first token of
// each chunk (llama.cpp's behaviour for models that add BOS); -1: no replacement.
// `on_chunk(i, n_chunk, running_ppl)` is called after each chunk.
PerplexityReport compute_perplexity(Session& session, const std::vector<int32_t>& tokens, int32_t bos,
                                    const PerplexityOptions& opts,
                                    const std::function<void(int64_t, int64_t, double)>& on_chunk = {});

// The pieces, exposed for tests.
// log-softmax of n logits in double precision.
void log_softmax(const float* logits, int64_t n, std::vector<double>& out);
// KL(P || Q) = sum_i p_i (log p_i - log q_i) for two log-prob vectors (each normalized).
double kl_divergence(const std::vector<double>& log_p, const std::vector<double>& log_q);

// One stored row: the quantized log-probs, and their reconstruction (renormalized).
struct LogProbRow {
  int32_t top1 = 0;
  float lp_true = 0, lp_max = 0;
  std::vector<uint16_t> q;
};
LogProbRow quantize_log_probs(const std::vector<double>& log_p, int32_t true_token);
void dequantize_log_probs(const LogProbRow& row, std::vector<double>& log_p);  // renormalized

}  // namespace ember
