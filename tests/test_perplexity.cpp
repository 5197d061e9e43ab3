// Perplexity and KL divergence (engine/perplexity.hpp) on small synth models: perplexity against
// an independent double-precision forward pass, KLD of a run against itself, and KLD / top-1 /
// p99 against a perturbed run computed directly from both runs' logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "core/error.hpp"
#include "engine/perplexity.hpp"
#include "engine/session.hpp"
#include "synth/synth.hpp"
#include "support/reference_llama.hpp"
#include "support/session_params.hpp"

using namespace ember;

namespace {

std::filesystem::path temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / "ember-test-perplexity";
  std::filesystem::create_directories(dir);
  return dir;
}

std::unique_ptr<Model> synth_model(uint64_t seed, const std::string& name) {
  SynthOptions o;
  o.seed = seed;
  o.n_threads = 1;
  o.n_vocab = 300;
  std::string path = (temp_dir() / name).string();
  synth_write(o, path);
  return load_model(path);
}

std::vector<int32_t> random_tokens(size_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n_vocab - 1));
  std::vector<int32_t> t(n);
  for (auto& x : t) x = pick(rng);
  return t;
}

// Log-softmax of double logits.
std::vector<double> log_softmax_d(const std::vector<double>& z) {
  double mx = *std::max_element(z.begin(), z.end()), s = 0;
  for (double v : z) s += std::exp(v - mx);
  std::vector<double> out(z.size());
  for (size_t i = 0; i < z.size(); ++i) out[i] = z[i] - mx - std::log(s);
  return out;
}

}  // namespace

TEST(Perplexity, MatchesDoublePrecisionReference) {
  auto model = synth_model(7, "ref.gguf");
  const int64_t n_ctx = 13;  // odd: first = 6, 6 scored per chunk
  auto tokens = random_tokens(3 * n_ctx + 5, model->hp.n_vocab, 3);  // 3 whole chunks and a tail
  for (int32_t bos : {-1, 1}) {
    // The reference: each chunk from position 0, BOS replacing its first token.
    double nll = 0, nll2 = 0;
    int64_t n = 0;
    for (int64_t c = 0; c < 3; ++c) {
      std::vector<int32_t> chunk(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx);
      if (bos >= 0) chunk[0] = bos;
      auto logits = test_support::reference_llama_logits(*model, chunk);
      for (int64_t j = n_ctx / 2; j < n_ctx - 1; ++j) {
        double l = -log_softmax_d(logits[j])[chunk[j + 1]];
        nll += l, nll2 += l * l, ++n;
      }
    }
    const double mean = nll / n, ppl = std::exp(mean);
    const double err = ppl * std::sqrt((nll2 / n - mean * mean) / (n - 1));
    for (int threads : {1, 3}) {
      Session s(*model, test_support::session_params(threads, 64, 5));  // batches of 5: chunks are split
      PerplexityOptions o;
      o.n_ctx = n_ctx;
      std::vector<double> running;
      auto rep = compute_perplexity(s, tokens, bos, o, [&](int64_t, int64_t, double p) { running.push_back(p); });
      EXPECT_EQ(rep.n_chunks, 3);
      EXPECT_EQ(rep.n_scored, 18);
      EXPECT_NEAR(rep.ppl, ppl, 1e-4 * ppl) << "bos " << bos << " threads " << threads;
      EXPECT_NEAR(rep.ppl_err, err, 1e-3 * err);
      ASSERT_EQ(running.size(), 3u);
      EXPECT_DOUBLE_EQ(running.back(), rep.ppl);
      EXPECT_FALSE(rep.has_base);
    }
  }
}

TEST(Perplexity, QuantizedLogProbsRoundTrip) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  std::vector<float> z(1001);
  for (auto& v : z) v = nd(rng);
  z[17] = 30.0f;   // a clear top-1
  z[400] = -60.0f;  // far below the clamp
  std::vector<double> lp, back;
  log_softmax(z.data(), static_cast<int64_t>(z.size()), lp);
  LogProbRow r = quantize_log_probs(lp, 5);
  EXPECT_EQ(r.top1, 17);
  EXPECT_FLOAT_EQ(r.lp_true, static_cast<float>(lp[5]));
  EXPECT_EQ(r.q[17], 0);
  EXPECT_EQ(r.q[400], 65535);
  dequantize_log_probs(r, back);
  for (size_t i = 0; i < lp.size(); ++i)
    if (lp[i] > lp[17] - 39.0) {
      EXPECT_NEAR(back[i], lp[i], 0.6 * kLogProbStep + 1e-6) << i;
    }
  EXPECT_LT(kl_divergence(lp, back), 1e-7);
}

TEST(Perplexity, KlAgainstItselfIsZero) {
  auto model = synth_model(9, "self.gguf");
  auto tokens = random_tokens(40, model->hp.n_vocab, 4);
  const std::string base = (temp_dir() / "self.lp").string();
  PerplexityOptions o;
  o.n_ctx = 10;
  o.save_logits = base;
  Session s(*model, test_support::session_params(2, 32, 16));
  auto a = compute_perplexity(s, tokens, -1, o);
  o.save_logits.clear();
  o.kl_base = base;
  auto b = compute_perplexity(s, tokens, -1, o);
  ASSERT_TRUE(b.has_base);
  EXPECT_DOUBLE_EQ(a.ppl, b.ppl);
  EXPECT_NEAR(b.base_ppl, b.ppl, 1e-6 * b.ppl);  // the base stores the true token's log-prob as f32
  EXPECT_NEAR(b.ln_ratio, 0.0, 1e-6);
  EXPECT_LT(b.kld_mean, 1e-7);
  EXPECT_LT(b.kld_p99, 1e-7);
  EXPECT_DOUBLE_EQ(b.same_top1, 1.0);
  // A base from another text or chunk length is refused with a clear error.
  auto other = tokens;
  other[25] = (other[25] + 1) % static_cast<int32_t>(model->hp.n_vocab);
  EXPECT_THROW(compute_perplexity(s, other, -1, o), Error);
  o.n_ctx = 8;
  EXPECT_THROW(compute_perplexity(s, tokens, -1, o), Error);
  std::filesystem::remove(base);
}

// A run whose FFN drops neurons (oracle mode with a threshold on |act(gate)|) against the dense
// base: the reported KLD statistics equal those computed directly from both runs' logits.
TEST(Perplexity, KlAgainstPerturbedRunMatchesDirectComputation) {
  auto model = synth_model(12, "pert.gguf");
  const int64_t n_ctx = 12, n_chunk = 4, nv = model->hp.n_vocab;
  auto tokens = random_tokens(n_chunk * n_ctx, nv, 8);
  const std::string base = (temp_dir() / "pert.lp").string();
  SessionParams dense = test_support::session_params(1, 32, 32);
  SessionParams pert = dense;
  pert.sparse.mode = FfnMode::oracle;
  pert.sparse.threshold = 0.3f;

  // Direct: the scored logits of both runs, KL in double from the unquantized distributions.
  auto scored_logits = [&](const SessionParams& p) {
    Session s(*model, p);
    std::vector<std::vector<double>> out;
    std::vector<float> all(n_ctx * nv);
    std::vector<double> lp;
    for (int64_t c = 0; c < n_chunk; ++c) {
      s.reset();
      s.eval_all_logits(tokens.data() + c * n_ctx, n_ctx, all.data());
      for (int64_t j = n_ctx / 2; j < n_ctx - 1; ++j) {
        log_softmax(all.data() + j * nv, nv, lp);
        out.push_back(lp);
      }
    }
    return out;
  };
  auto lp_base = scored_logits(dense), lp_pert = scored_logits(pert);
  std::vector<double> kl;
  int64_t same = 0;
  double d = 0;
  for (size_t i = 0; i < lp_base.size(); ++i) {
    kl.push_back(kl_divergence(lp_base[i], lp_pert[i]));
    auto am = [](const std::vector<double>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
    same += am(lp_base[i]) == am(lp_pert[i]);
    const int64_t c = static_cast<int64_t>(i) / (n_ctx - 1 - n_ctx / 2), j = static_cast<int64_t>(i) % (n_ctx - 1 - n_ctx / 2);
    const int32_t truth = tokens[c * n_ctx + n_ctx / 2 + j + 1];
    d += lp_base[i][truth] - lp_pert[i][truth];
  }
  double mean_kl = 0;
  for (double v : kl) mean_kl += v / kl.size();
  ASSERT_GT(mean_kl, 1e-4) << "the perturbation is too small to test anything";
  std::sort(kl.begin(), kl.end());
  const double idx = 0.99 * (kl.size() - 1);
  const size_t lo = static_cast<size_t>(idx);
  const double p99 = kl[lo] + (idx - lo) * (kl[std::min(lo + 1, kl.size() - 1)] - kl[lo]);

  PerplexityOptions o;
  o.n_ctx = n_ctx;
  o.save_logits = base;
  {
    Session s(*model, dense);
    compute_perplexity(s, tokens, -1, o);
  }
  o.save_logits.clear();
  o.kl_base = base;
  Session s(*model, pert);
  auto rep = compute_perplexity(s, tokens, -1, o);
  ASSERT_TRUE(rep.has_base);
  EXPECT_EQ(rep.n_scored, static_cast<int64_t>(kl.size()));
  // The base's 16-bit log-probs (step 6e-4 nats) shift KL by far less than its size here.
  EXPECT_NEAR(rep.kld_mean, mean_kl, 2e-3 * mean_kl + 1e-6);
  EXPECT_NEAR(rep.kld_p99, p99, 2e-3 * p99 + 1e-6);
  EXPECT_NEAR(rep.kld_max, kl.back(), 2e-3 * kl.back() + 1e-6);
  EXPECT_DOUBLE_EQ(rep.same_top1, static_cast<double>(same) / kl.size());
  EXPECT_NEAR(rep.ln_ratio, d / kl.size(), 1e-6);
  std::filesystem::remove(base);
}
