// `ember perplexity`: perplexity of a text in llama.cpp's manner (chunks of -c tokens, second
// half of each scored), with --save-logits / --kl-base for KL divergence against a base run
// (engine/perplexity.hpp). Works with every --sparse-mode.
#include <cstdio>

#include "commands.hpp"
#include "common.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/perplexity.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::cli {
namespace {

struct PerplexityFlags {
  EngineFlags engine;
  std::string text_file;
  PerplexityOptions opts;
};

void run_perplexity(PerplexityFlags& f) {
  auto model = load_model_logged(f.engine, nullptr);
  Tokenizer tok(*model->file);
  const bool add_bos = tok.vocab().add_bos;
  const std::vector<int32_t> tokens = read_corpus_tokens(*model, f.text_file);
  SessionParams sp = f.engine.session_params(*model);
  sp.n_ctx = f.engine.ctx;
  Session session(*model, sp);
  f.opts.n_ctx = std::min<int64_t>(f.engine.ctx, session.n_ctx());
  const int64_t n_chunk_all = static_cast<int64_t>(tokens.size()) / f.opts.n_ctx;
  log_info("perplexity: {} tokens, {} chunks of {} (using {}), {} threads, FFN {}", tokens.size(), n_chunk_all,
           f.opts.n_ctx, f.opts.max_chunks > 0 ? std::min(n_chunk_all, f.opts.max_chunks) : n_chunk_all,
           session.n_threads(), ffn_mode_name(sp.sparse.mode));
  if (sp.sparse.mode != FfnMode::dense && session.max_batch() > 1)
    log_info("perplexity: in sparse mode {} a batch computes what its tokens decode up to the order of float sums; "
             "a prediction or firing test at its threshold can flip on that rounding, so the measure may differ "
             "slightly from -b 1's, which is exactly what decode computes (at the same -t)", ffn_mode_name(sp.sparse.mode));
  Timer timer;
  auto rep = compute_perplexity(session, tokens, add_bos ? tok.bos() : -1, f.opts,
                                [&](int64_t c, int64_t n, double ppl) {
                                  if (c == 0)
                                    log_info("perplexity: {:.2f} s per chunk, about {:.0f} s in all", timer.seconds(),
                                             timer.seconds() * static_cast<double>(n));
                                  std::printf("[%lld]%.4f,", static_cast<long long>(c + 1), ppl);
                                  std::fflush(stdout);
                                });
  const double secs = timer.seconds();
  std::printf("\n");
  std::printf("Final estimate: PPL = %.4f +/- %.5f\n", rep.ppl, rep.ppl_err);
  std::printf("chunks %lld, scored tokens %lld, %.1f tokens/s\n", static_cast<long long>(rep.n_chunks),
              static_cast<long long>(rep.n_scored), static_cast<double>(rep.n_chunks * f.opts.n_ctx) / secs);
  if (rep.has_base) {
    std::printf("Mean PPL(Q)          : %10.6f +/- %10.6f\n", rep.ppl, rep.ppl_err);
    std::printf("Mean PPL(base)       : %10.6f +/- %10.6f\n", rep.base_ppl, rep.base_ppl_err);
    std::printf("Mean ln(PPL(Q)/PPL(base)): %10.6f +/- %10.6f\n", rep.ln_ratio, rep.ln_ratio_err);
    std::printf("Mean    KLD          : %10.6f +/- %10.6f\n", rep.kld_mean, rep.kld_err);
    std::printf("Median  KLD          : %10.6f\n", rep.kld_median);
    std::printf("99.0%%   KLD          : %10.6f\n", rep.kld_p99);
    std::printf("Maximum KLD          : %10.6f\n", rep.kld_max);
    std::printf("Same top p           : %6.3f +/- %6.3f %%\n", 100 * rep.same_top1, 100 * rep.same_top1_err);
  }
  log_ffn_sparsity(session);
  if (!f.opts.save_logits.empty()) log_info("log-probs saved to {}", f.opts.save_logits);
}

}  // namespace

void add_perplexity(CLI::App& app) {
  auto f = std::make_shared<PerplexityFlags>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity", "perplexity of a text (llama.cpp's method: chunks of -c tokens, second half scored); "
                    "KL divergence against a saved base run");
  f->engine.ctx = 512;
  f->engine.add_to(cmd);
  cmd->add_option("-f,--file", f->text_file, "text file (e.g. data/corpus/eval.txt)")->required();
  cmd->add_option("--chunks", f->opts.max_chunks, "use at most this many chunks (0 = all)")->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--save-logits", f->opts.save_logits,
                  "write the run's log-probs (16-bit, n_vocab per scored token) to this file, as a base for --kl-base");
  cmd->add_option("--kl-base", f->opts.kl_base,
                  "compare with a base run's log-prob file: mean/median/p99 KL divergence, same top-1 rate");
  cmd->callback([f] { run_perplexity(*f); });
}

}  // namespace ember::cli
