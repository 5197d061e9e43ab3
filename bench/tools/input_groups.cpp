// Issue 23's open question, measured before any kernel is written for it: how much accuracy does
// input sparsity lose when input channels are kept or dropped in contiguous groups of G (one
// stream of weights per group, as a grouped kernel would read them) instead of one by one (TEAL)?
//
//   ember-input-groups MODEL TEXT SPARSITY[,SPARSITY...] G[,G...] [CHUNKS]      (G: a number, or cats)
//
// At every input of every layer (attention in, attention out, FFN in, FFN hidden) each token keeps
// the (1 - sparsity) share of its groups of largest L2 norm (G = 1: of its channels by |x|) and
// zeroes the rest: a per-token top-k, so every variant skips exactly the same share of weights
// and only the choice differs. Reports perplexity and the KL divergence to the dense model on
// CHUNKS chunks of 512 tokens of TEXT (llama.cpp's perplexity protocol, engine/perplexity.hpp).
//
// G = "cats" asks the other question, whether the down input is better chosen by the
// threshold rule (CATS): the FFN's neurons are kept by |act(gate)| of the masked input (the same
// share), and up is then read only for those, over the whole input. At equal shares both variants
// skip the same bytes (gate + attention at the share, up + down at the share), so again only the
// choice differs: TEAL's |act(gate) up| against CATS's |act(gate)|.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "engine/perplexity.hpp"
#include "engine/session.hpp"
#include "model/blocks.hpp"
#include "model/ffn.hpp"
#include "model/model.hpp"
#include "tokenizer/tokenizer.hpp"

using namespace ember;

namespace {

class GroupTopK : public ProjectionExecutor, public FfnExecutor {
 public:
  GroupTopK(double sparsity, int group, int64_t max_width, int64_t max_batch, bool cats = false)
      : sparsity_(sparsity), group_(group), cats_(cats), buf_(static_cast<size_t>(max_width * max_batch)) {}

  void qkv(ThreadPool& pool, int64_t, const LayerWeights& L, float* xn, int64_t n, Workspace& ws) override {
    mask(xn, n, L.wq.cols());
    dense_qkv(pool, L, xn, n, ws);
  }
  void out(ThreadPool& pool, int64_t, const LayerWeights& L, float* attn, int64_t n, float* o, Workspace& ws) override {
    mask(attn, n, L.wo.cols());
    dense_out(pool, L, attn, n, o, ws);
  }
  void run(ThreadPool& pool, int64_t, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n, float* out,
           Workspace& ws) override {
    std::copy(x, x + n * w.n_embd(), buf_.begin());
    mask(buf_.data(), n, w.n_embd());
    if (cats_) {  // neurons chosen by |act(gate)| of the masked input; up over the whole input
      EMBER_CHECK(w.gated(), "the cats variant needs a gated FFN (a gate to choose the neurons by)");
      float* a = ffn_firing_all(pool, w, act, buf_.data(), n, ws);
      mask(a, n, w.n_ff());
      float* h = ffn_values_all(pool, w, act, x, n, ws);
      ffn_down_all(pool, w, h, n, out, ws);
      return;
    }
    ffn_firing_all(pool, w, act, buf_.data(), n, ws);
    float* h = ffn_values_all(pool, w, act, buf_.data(), n, ws);
    mask(h, n, w.n_ff());
    ffn_down_all(pool, w, h, n, out, ws);
  }
  std::string refusal(const Model&) const override { return {}; }

 private:
  // Per row: zero all but the (1 - sparsity) share of groups of largest norm.
  void mask(float* x, int64_t n, int64_t width) {
    const int64_t g = group_, n_groups = (width + g - 1) / g;
    const auto keep = static_cast<int64_t>(std::llround((1.0 - sparsity_) * static_cast<double>(n_groups)));
    score_.resize(static_cast<size_t>(n_groups));
    for (int64_t t = 0; t < n; ++t) {
      float* row = x + t * width;
      for (int64_t j = 0; j < n_groups; ++j) {
        double s = 0;
        for (int64_t c = j * g; c < std::min(width, (j + 1) * g); ++c) s += static_cast<double>(row[c]) * row[c];
        score_[static_cast<size_t>(j)] = s;
      }
      if (keep >= n_groups) continue;
      std::vector<double> sorted = score_;
      std::nth_element(sorted.begin(), sorted.begin() + (n_groups - keep - 1), sorted.end());
      const double cut = sorted[static_cast<size_t>(n_groups - keep - 1)];  // groups at or below it are dropped
      int64_t dropped = 0;
      for (int64_t j = 0; j < n_groups; ++j) {
        // Ties at the cut: drop only as many as the share asks.
        if (score_[static_cast<size_t>(j)] > cut || dropped >= n_groups - keep) continue;
        for (int64_t c = j * g; c < std::min(width, (j + 1) * g); ++c) row[c] = 0.0f;
        ++dropped;
      }
    }
  }

  double sparsity_;
  int group_;
  bool cats_;
  std::vector<float> buf_;
  std::vector<double> score_;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    EMBER_CHECK(argc >= 5, "usage: {} MODEL TEXT SPARSITY[,...] GROUP[,...] [CHUNKS]", argv[0]);
    auto model = load_model(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    EMBER_CHECK(in.good(), "cannot read '{}'", argv[2]);
    std::stringstream text;
    text << in.rdbuf();
    Tokenizer tok(*model->file);
    const bool add_bos = tok.vocab().add_bos;
    const std::vector<int32_t> tokens = tok.encode(text.str(), add_bos);
    PerplexityOptions po;
    po.n_ctx = 512;
    po.max_chunks = argc > 5 ? std::stoll(argv[5]) : 8;
    SessionParams sp;
    sp.n_ctx = 512;
    Session session(*model, sp);
    const auto base = (std::filesystem::temp_directory_path() / "ember-input-groups-base.lp").string();
    po.save_logits = base;
    const PerplexityReport dense = compute_perplexity(session, tokens, add_bos ? tok.bos() : -1, po);
    std::printf("dense: PPL %.4f +/- %.4f (%lld tokens scored)\n", dense.ppl, dense.ppl_err,
                static_cast<long long>(dense.n_scored));
    po.save_logits.clear();
    po.kl_base = base;
    const int64_t wide = std::max({model->hp.n_embd, model->hp.n_ff, model->hp.n_head * model->hp.head_dim});
    std::printf("| sparsity | group | PPL | ln(PPL/PPL dense) | mean KLD | same top-1 |\n|---:|---:|---:|---:|---:|---:|\n");
    for (const std::string& s : split(argv[3])) {
      for (const std::string& g : split(argv[4])) {
        const bool cats = g == "cats";
        GroupTopK exec(std::stod(s), cats ? 1 : std::stoi(g), wide, session.max_batch(), cats);
        session.set_projection_executor(&exec);
        session.set_ffn_executor(&exec);
        const PerplexityReport r = compute_perplexity(session, tokens, add_bos ? tok.bos() : -1, po);
        session.set_projection_executor(nullptr);
        session.set_ffn_executor(nullptr);
        std::printf("| %s | %s | %.4f | %.4f +/- %.4f | %.4f +/- %.4f | %.1f %% |\n", s.c_str(), g.c_str(), r.ppl,
                    r.ln_ratio, r.ln_ratio_err, r.kld_mean, r.kld_err, 100 * r.same_top1);
        std::fflush(stdout);
      }
    }
    std::filesystem::remove(base);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
