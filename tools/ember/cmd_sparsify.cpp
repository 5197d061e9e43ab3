// `ember sparsify -m MODEL -o OUT.gguf [--sparsity S]`: one command that makes a model sparse.
// [1/3] profiles it on a calibration text (or takes --profile), [2/3] writes the model with input
// sparsity's thresholds embedded (src/sparse/sparsify.hpp; every command then runs it in input
// mode with no flag), [3/3] measures the result against the dense model on held-out text:
// perplexity, KL divergence, same top-1, and the weight bytes a decode token reads.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.hpp"
#include "common.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/perplexity.hpp"
#include "engine/profile_run.hpp"
#include "sparse/sparsify.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::cli {
namespace {

struct SparsifyFlags {
  SparsifyOptions o;
  std::string allocation = "greedy";
  std::string corpus = "data/corpus/calib.txt", eval = "data/corpus/eval.txt";
  int64_t profile_tokens = 16384, eval_chunks = 4;
  int threads = 0;
};

struct Quality {
  PerplexityReport ppl;
  double dense_bytes = 0, sparse_bytes = 0;  // weight bytes per decode token
};

// Dense against sparse on held-out text (compute_perplexity with the dense run as KL base), then
// a short greedy decode in input mode for the bytes a token reads.
Quality evaluate(const SparsifyFlags& f, const Model& dense) {
  Quality q;
  const std::vector<int32_t> tokens = read_corpus_tokens(dense, f.eval);
  Tokenizer tok(*dense.file);
  const int32_t bos = tok.vocab().add_bos ? tok.bos() : -1;
  PerplexityOptions po;
  po.n_ctx = 512;
  po.max_chunks = f.eval_chunks;
  po.save_logits = (std::filesystem::temp_directory_path() / fmt::format("ember-sparsify-{}.lp", getpid())).string();
  SessionParams sp;
  sp.n_threads = f.threads;
  sp.n_ctx = po.n_ctx;
  {
    Session s(dense, sp);
    Timer t;
    compute_perplexity(s, tokens, bos, po, [&](int64_t c, int64_t n, double) {
      log_info("sparsify [3/3]: dense model, chunk {}/{} ({:.0f} s)", c + 1, n, t.seconds());
    });
  }
  auto sparse = load_model(f.o.output);
  repack_for_dense_kernels(*sparse, repack_scope_for(FfnMode::input, false), ResidentWeights::copy);
  sp.sparse.mode = FfnMode::input;
  Session s(*sparse, sp);
  po.kl_base = po.save_logits;
  po.save_logits.clear();
  Timer t;
  q.ppl = compute_perplexity(s, tokens, bos, po, [&](int64_t c, int64_t n, double) {
    log_info("sparsify [3/3]: sparse model, chunk {}/{} ({:.0f} s)", c + 1, n, t.seconds());
  });
  std::filesystem::remove(po.kl_base);
  s.reset();
  s.input_sparse()->reset_stats();
  s.eval(tokens.data(), std::min<int64_t>(64, static_cast<int64_t>(tokens.size())));
  for (int i = 0; i < 32 && s.pos() + 1 < s.n_ctx(); ++i) {
    const auto next = static_cast<int32_t>(std::max_element(s.logits(), s.logits() + sparse->hp.n_vocab) - s.logits());
    s.eval(&next, 1);
  }
  q.dense_bytes = static_cast<double>(dense.weight_bytes_per_token());
  q.sparse_bytes = s.input_sparse()->weight_bytes_per_token();
  return q;
}

void run_sparsify(SparsifyFlags& f) {
  Timer timer;
  f.o.allocation = parse_input_allocation(f.allocation);
  // The texts first: a missing one should not cost a profile.
  for (const auto& [path, needed] : {std::pair{f.corpus, f.o.profile.empty()}, std::pair{f.eval, f.eval_chunks > 0}})
    EMBER_CHECK(!needed || std::filesystem::is_regular_file(path),
                "cannot read the text '{}' (the project's corpus: scripts/get_corpus.sh)", path);
  EngineFlags ef;
  ef.model_path = f.o.model;
  ef.threads = f.threads;
  auto model = load_model_logged(ef, nullptr, RepackScope::attention_output);
  Profile profile;
  if (!f.o.profile.empty()) {
    profile = read_profile(f.o.profile);
    log_info("sparsify [1/3]: the profile {}", f.o.profile);
  } else {
    log_info("sparsify [1/3]: profiling {} tokens of {}", f.profile_tokens, f.corpus);
    const std::vector<int32_t> tokens = read_corpus_tokens(*model, f.corpus);
    ProfileOptions po;
    po.max_tokens = f.profile_tokens;
    po.threshold = model->hp.act == cpu::Activation::relu ? 0.0f : -1.0f;
    SessionParams sp;
    sp.n_threads = f.threads;
    sp.n_ctx = po.n_ctx;
    Session session(*model, sp);
    profile = profile_corpus(session, tokens, po);
    f.o.profile = std::filesystem::path(f.corpus).filename().string() + " (profiled by sparsify)";
  }
  log_info("sparsify [2/3]: thresholds for {:.0f}% of the layers' weights ({} allocation)", 100 * f.o.sparsity,
           f.allocation);
  const SparsifySummary s = sparsify_model(f.o, profile);
  std::printf("layer  attn_in  attn_out  ffn_in  ffn_hidden   (share of each input dropped on the calibration text)\n");
  for (size_t l = 0; l < s.plan.sparsity.size(); ++l) {
    const auto& v = s.plan.sparsity[l];
    std::printf("%5zu  %7.3f  %8.3f  %6.3f  %10.3f\n", l, v[0], v[1], v[2], v[3]);
  }
  fmt::print(stderr, "sparsify: wrote {} ({:.1f} MiB): {:.1f}% of the layers' weights skipped ({} allocation)\n",
             f.o.output, s.bytes / 1048576.0, 100.0 * s.plan.weighted_sparsity, f.allocation);
  if (f.eval_chunks > 0) {
    const Quality q = evaluate(f, *model);
    const PerplexityReport& r = q.ppl;
    std::printf("\non %lld held-out tokens of %s, sparse against dense:\n", static_cast<long long>(r.n_scored),
                f.eval.c_str());
    std::printf("  perplexity      %.3f -> %.3f (%+.1f%%)\n", r.base_ppl, r.ppl, 100.0 * (r.ppl / r.base_ppl - 1.0));
    std::printf("  KL divergence   %.4f +/- %.4f (mean), %.4f (99th percentile)\n", r.kld_mean, r.kld_err, r.kld_p99);
    std::printf("  same top token  %.1f%%\n", 100 * r.same_top1);
    if (q.sparse_bytes > 0)
      std::printf("  weights read per decode token  %.1f MB dense, %.1f MB sparse: up to %.2fx faster by bytes\n",
                  q.dense_bytes / 1e6, q.sparse_bytes / 1e6, q.dense_bytes / q.sparse_bytes);
  }
  fmt::print(stderr, "sparsify: done in {:.0f} s; `ember generate -m {}` runs it sparse\n", timer.seconds(), f.o.output);
}

}  // namespace

void add_sparsify(CLI::App& app) {
  auto f = std::make_shared<SparsifyFlags>();
  auto* cmd = app.add_subcommand(
      "sparsify", "make a model sparse in one command: profile it, embed input-sparsity thresholds (every matrix "
                  "skips its input's small entries, TEAL) for a target share of the layers' weights, and measure "
                  "the result against the dense model; every command then runs the output sparse");
  cmd->add_option("-m,--model", f->o.model, "GGUF model file")->required();
  cmd->add_option("-o,--output", f->o.output, "output GGUF file")->required();
  cmd->add_option("--sparsity", f->o.sparsity, "share of the layers' weights whose inputs are skipped")
      ->check(CLI::Range(0.0, 0.95))
      ->capture_default_str();
  cmd->add_option("--allocation", f->allocation,
                  "greedy (per layer, more sparsity at the inputs where the profile says it costs less error) or "
                  "uniform")
      ->check(CLI::IsMember({"greedy", "uniform"}))
      ->capture_default_str();
  cmd->add_option("--profile", f->o.profile,
                  "use this profile (`ember profile`, with input tables) instead of profiling on --corpus");
  cmd->add_option("--corpus", f->corpus, "calibration text to profile on")->capture_default_str();
  cmd->add_option("--profile-tokens", f->profile_tokens, "calibration tokens to profile (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--eval", f->eval, "held-out text to measure the result on")->capture_default_str();
  cmd->add_option("--eval-chunks", f->eval_chunks, "512-token chunks of --eval to measure on (0: skip the measurement)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "threads (0 = all cores)")->check(CLI::Range(0, 1024));
  cmd->callback([f] { run_sparsify(*f); });
}

}  // namespace ember::cli
