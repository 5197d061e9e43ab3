// `ember profile`: runs a model over a corpus, records per layer and neuron how often it fires
// and the quantiles of |act(gate)| (sparse/profile.hpp), writes the profile GGUF
// (docs/sparse_formats.md), prints the power-law summary per layer and writes an SVG plot of the
// cumulative firing curves.
#include <cstdio>
#include <fstream>
#include <memory>

#include "commands.hpp"
#include "common.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "sparse/predictor_train.hpp"
#include "engine/profile_run.hpp"
#include "sparse/samples_file.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::cli {
namespace {

struct ProfileFlags {
  EngineFlags engine;
  std::string corpus, out, plot, samples;
  int64_t samples_max = 4000;
  ProfileOptions opts;
  bool threshold_given = false;
};

// --samples: the pass that counts also keeps an even spread of samples_max of the profiled tokens
// per layer (FFN input, firing neurons at the profile's per-layer thresholds, their activation
// mass) for `ember train-predictor --from-samples`.
void save_samples(const ProfileFlags& f, const Profile& p, FfnSampleRecorder& rec) {
  Timer timer;
  const std::vector<LayerSamples> samples = rec.take();
  write_samples_file(f.samples, p.model_name, samples);
  size_t firing = 0;
  for (const LayerSamples& s : samples) firing += s.idx.size();
  log_info("samples: {} tokens x {} layers ({} firing neurons) written to {} in {:.1f} s", samples[0].n,
           samples.size(), firing, f.samples, timer.seconds());
}

void run_profile_cmd(ProfileFlags& f) {
  auto model = load_model_logged(f.engine, nullptr, RepackScope::all);  // the dense FFN: its kernels' layout
  const std::vector<int32_t> tokens = read_corpus_tokens(*model, f.corpus);
  f.opts.sparsity = f.engine.sparsity;  // --sparsity: the per-layer firing thresholds' sparsity
  if (!f.threshold_given) f.opts.threshold = model->hp.act == cpu::Activation::relu ? 0.0f : -1.0f;
  if (f.engine.sparse_mode == "auto") f.engine.sparse_mode = "dense";  // whatever sparsity the file carries
  SessionParams sp = f.engine.session_params(*model);
  EMBER_CHECK(sp.sparse.mode == FfnMode::dense, "profile runs the dense FFN: drop --sparse-mode");
  sp.n_ctx = f.engine.ctx;
  Session session(*model, sp);
  Timer timer;
  const int64_t n_tok = f.opts.max_tokens > 0 ? std::min<int64_t>(f.opts.max_tokens, tokens.size()) : tokens.size();
  std::unique_ptr<FfnSampleRecorder> rec;
  if (!f.samples.empty() && n_tok > 0)
    rec = std::make_unique<FfnSampleRecorder>(model->hp.n_layer, model->hp.n_embd, model->hp.n_ff, n_tok,
                                              f.samples_max);
  Profile p = profile_corpus(session, tokens, f.opts, rec.get());
  write_profile(p, f.out);
  if (rec) save_samples(f, p, *rec);

  const bool moe = p.n_expert > 0;
  std::printf("layer  threshold  sparsity  hot80%%  hot95%%%s\n", moe ? "  experts80%  experts95%" : "");
  double sp_sum = 0, h80 = 0, h95 = 0, e80 = 0, e95 = 0;
  for (int64_t l = 0; l < p.n_layer; ++l) {
    const double s = layer_sparsity(p, l), a = hot_fraction(p.counts[l], 0.8), b = hot_fraction(p.counts[l], 0.95);
    sp_sum += s, h80 += a, h95 += b;
    std::printf("%5lld  %9.5f  %8.3f  %6.3f  %6.3f", static_cast<long long>(l), p.thresholds[l], s, a, b);
    if (moe) {
      const double c = hot_fraction(p.expert_counts[l], 0.8), d = hot_fraction(p.expert_counts[l], 0.95);
      e80 += c, e95 += d;
      std::printf("  %10.3f  %10.3f", c, d);
    }
    std::printf("\n");
  }
  std::printf("mean   %9.5f  %8.3f  %6.3f  %6.3f", p.threshold, sp_sum / p.n_layer, h80 / p.n_layer, h95 / p.n_layer);
  if (moe) std::printf("  %10.3f  %10.3f", e80 / p.n_layer, e95 / p.n_layer);
  std::printf("\n(hotNN: fraction of neurons, hottest first, that covers NN%% of the layer's firings%s)\n",
              moe ? fmt::format("; a neuron is one of an expert's, {} experts of {} neurons; expertsNN: fraction of "
                                "experts, most chosen first, that take NN% of the routings ({} a token)",
                                p.n_expert, p.n_ff / p.n_expert, p.n_expert_used).c_str()
                  : "");
  std::string plot = f.plot;
  if (plot.empty()) {
    plot = f.out;
    if (plot.size() > 5 && plot.compare(plot.size() - 5, 5, ".gguf") == 0) plot.resize(plot.size() - 5);
    plot += ".svg";
  }
  std::ofstream svg(plot);
  EMBER_CHECK(svg.good(), "cannot write the plot '{}'", plot);
  svg << profile_svg(p);
  log_info("profile of {} tokens written to {} ({:.1f} s); plot: {}", p.n_tokens, f.out, timer.seconds(), plot);
}

}  // namespace

void add_profile(CLI::App& app) {
  auto f = std::make_shared<ProfileFlags>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "run a model over a corpus and record how often each FFN neuron fires (profile GGUF + SVG plot)");
  f->engine.ctx = 512;
  f->engine.add_to(cmd);
  cmd->add_option("-f,--file", f->corpus, "corpus text (e.g. data/corpus/calib.txt)")->required();
  cmd->add_option("-o,--output", f->out, "profile file to write (GGUF)")->required();
  cmd->add_option("--plot", f->plot, "SVG plot of the cumulative firing curves (default: the output with .svg)");
  cmd->add_option("--threshold", f->opts.threshold,
                  "firing threshold on |act(gate)| for all layers (default: 0 for ReLU models; per layer at "
                  "--sparsity for SiLU/GELU models)")
      ->check(CLI::Range(0.0f, 1e30f))
      ->each([f](const std::string&) { f->threshold_given = true; });
  cmd->add_option("--max-tokens", f->opts.max_tokens, "profile at most this many corpus tokens (0 = all)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  cmd->add_option("--samples", f->samples,
                  "also save predictor training samples (layer inputs and firing neurons) to this GGUF, for "
                  "`ember train-predictor --from-samples`");
  cmd->add_option("--samples-max", f->samples_max, "tokens kept per layer in --samples (n_embd x 4 bytes each)")
      ->check(CLI::Range(int64_t{20}, int64_t{1} << 24))
      ->capture_default_str();
  cmd->callback([f] { run_profile_cmd(*f); });
}

}  // namespace ember::cli
