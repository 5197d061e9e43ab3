#include "engine/profile_run.hpp"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "sparse/threshold.hpp"

namespace ember {

Profile run_profile(Session& session, const std::vector<int32_t>& tokens, const ProfileOptions& opts,
                    const std::function<void(int64_t, int64_t, int)>& progress, FfnSampleRecorder* samples) {
  const Model& model = session.model();
  const Hparams& hp = model.hp;
  EMBER_CHECK(opts.n_ctx >= 1 && opts.n_ctx <= session.n_ctx(), "profile chunk length {} must be in [1, {}]",
              opts.n_ctx, session.n_ctx());
  EMBER_CHECK(opts.threshold >= 0.0f || (opts.sparsity > 0.0f && opts.sparsity < 1.0f),
              "--sparsity must be in (0, 1), got {}", opts.sparsity);
  int64_t n_tok = static_cast<int64_t>(tokens.size());
  if (opts.max_tokens > 0) n_tok = std::min(n_tok, opts.max_tokens);
  EMBER_CHECK(n_tok >= 1, "the corpus has no tokens to profile");
  for (int64_t i = 0; i < n_tok; ++i)
    EMBER_CHECK(tokens[i] >= 0 && tokens[i] < hp.n_vocab, "token id {} out of the vocabulary ({})", tokens[i],
                hp.n_vocab);

  ProfileFfn ffn(model);
  ffn.set_sample_recorder(samples);
  session.set_ffn_executor(&ffn);
  session.set_projection_executor(&ffn);
  auto run_pass = [&](int pass) {
    for (int64_t done = 0; done < n_tok;) {
      const int64_t len = std::min(opts.n_ctx, n_tok - done);
      session.reset();
      session.eval(tokens.data() + done, len);
      done += len;
      if (progress) progress(done, n_tok, pass);
    }
  };
  Profile p;
  p.model_name = std::filesystem::path(model.file->path()).filename().string();
  p.n_layer = hp.n_layer;
  p.n_ff = profile_neurons(model, 0);
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const MoeWeights& moe = model.layers[static_cast<size_t>(l)].moe;
    EMBER_CHECK(profile_neurons(model, l) == p.n_ff && moe.n_expert() == model.layers[0].moe.n_expert(),
                "layer {} has {} neurons ({} experts) where layer 0 has {} ({}): a model whose layers differ so cannot "
                "be profiled yet", l, profile_neurons(model, l), moe.n_expert(), p.n_ff, model.layers[0].moe.n_expert());
  }
  p.n_expert = model.layers[0].moe.n_expert();
  p.n_expert_used = model.layers[0].moe.valid() ? model.layers[0].moe.n_used : 0;
  const bool counts = opts.threshold >= 0.0f || !opts.quantiles_only;
  std::unique_ptr<FiringRecord> firing;
  if (p.n_expert == 0 && counts && opts.cluster_tokens > 0) {
    firing = std::make_unique<FiringRecord>(hp.n_layer, p.n_ff, n_tok, opts.cluster_tokens);
    ffn.set_firing_record(firing.get());
  }
  try {
    if (opts.threshold >= 0.0f) {
      p.thresholds.assign(static_cast<size_t>(hp.n_layer), opts.threshold);
      ffn.set_count_thresholds(p.thresholds);
      run_pass(1);
    } else {
      ffn.set_count_thresholds({});
      run_pass(1);
      for (int64_t l = 0; l < hp.n_layer; ++l) {
        auto q = ffn.histogram(l).quantiles(kQuantiles);
        p.thresholds.push_back(quantile_at(q.data(), kQuantiles, opts.sparsity));
      }
      p.sparsity = opts.sparsity;
      if (!opts.quantiles_only) {
        ffn.set_record_histograms(false);
        ffn.set_count_thresholds(p.thresholds);
        run_pass(2);
      }
    }
  } catch (...) {
    session.set_ffn_executor(nullptr);
    session.set_projection_executor(nullptr);
    throw;
  }
  session.set_ffn_executor(nullptr);
  session.set_projection_executor(nullptr);
  p.n_tokens = opts.quantiles_only && opts.threshold < 0.0f ? ffn.tokens_recorded() : ffn.tokens_counted();
  EMBER_CHECK(p.n_tokens > 0, "the forward pass of architecture '{}' did not run the FFN executor: it cannot be "
              "profiled", hp.arch);
  double tsum = 0;
  for (float t : p.thresholds) tsum += t;
  p.threshold = opts.threshold >= 0.0f ? opts.threshold : static_cast<float>(tsum / static_cast<double>(hp.n_layer));
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    p.quantiles.push_back(ffn.histogram(l).quantiles(kQuantiles));
    std::vector<float> iq, ie;
    for (int s = 0; s < kInputSites; ++s) {
      const AbsHistogram& h = ffn.input_histogram(l, s);
      const std::vector<float> q = h.quantiles(kQuantiles), e = h.energy_fractions(kQuantiles);
      iq.insert(iq.end(), q.begin(), q.end());
      ie.insert(ie.end(), e.begin(), e.end());
    }
    p.input_quantiles.push_back(std::move(iq));
    p.input_energy.push_back(std::move(ie));
    const auto& c = ffn.counts(l);
    p.counts.emplace_back(c.begin(), c.end());
    const auto& e = ffn.expert_counts(l);
    if (p.n_expert > 0) p.expert_counts.emplace_back(e.begin(), e.end());
  }
  if (firing && firing->tokens() > 0) {
    Timer timer;
    CofireOrders c = cofire_orders(session.pool(), *firing, p.counts);
    p.cluster_orders = std::move(c.orders);
    const double tokens = static_cast<double>(firing->tokens() / 2 * hp.n_layer);
    log_info("profile: each layer's neurons ordered in bands of {} by firing together ({} tokens' firing, {:.1f} s); "
             "ordered by half of them, the other half's neurons past the hottest tenth ({:.0f} a token and layer) lie "
             "in {:.0f} runs of neighbours where hot-first order has {:.0f} ({:.2f}x fewer reads from a file)",
             kCofireBand, firing->tokens(), timer.seconds(),
             c.clustered.neurons / tokens, c.clustered.runs / tokens, c.hot_first.runs / tokens,
             c.clustered.runs > 0 ? static_cast<double>(c.hot_first.runs) / static_cast<double>(c.clustered.runs) : 1.0);
  }
  return p;
}

}  // namespace ember
