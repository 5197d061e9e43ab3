// `ember sparsify -m MODEL -o OUT.gguf`: one command that makes a model sparse, by the path its
// activation calls for (--method auto):
//  - SiLU / GELU models (input sparsity, TEAL): [1/3] profile on a calibration text (or take
//    --profile), [2/3] allocate --sparsity over each layer's inputs (by default TEAL's block
//    allocation, which runs each layer on calibration tokens: src/sparse/input_allocation.hpp) and
//    write the model with the thresholds embedded (src/sparse/sparsify.hpp), [3/3] measure;
//  - ReLU models (PowerInfer): [1/4] profile the neurons' firing (every matrix repacked for the
//    dense kernels), keeping samples of the same run, [2/4] train a predictor per layer on them
//    (src/sparse/predictor_train.hpp), [3/4] write the model in
//    PowerInfer's layout with the predictors embedded (src/sparse/prepare.hpp), [4/4] measure.
// The measurement: perplexity, KL divergence and same top-1 against the dense model on held-out
// text, and the weight bytes a decode token reads. Every command then runs the output sparse with
// no flag (--sparse-mode auto).
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
#include "sparse/predictor_train.hpp"
#include "sparse/prepare.hpp"
#include "sparse/input_sparse.hpp"
#include "sparse/sparsify.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::cli {
namespace {

struct SparsifyFlags {
  SparsifyOptions o;
  std::string method = "auto", allocation = "block";
  int64_t samples = 4000;   // predictor path: training tokens per layer
  double recall = 0.99;     // predictor path: target recall of activation mass
  std::string corpus = "data/corpus/calib.txt", eval = "data/corpus/eval.txt";
  int64_t profile_tokens = -1, eval_chunks = 4;  // -1: the path's default (below)
  BlockAllocationOptions block;
  int threads = 0;
};

// The seconds each step took, for the closing line: "load 2 s, profile 70 s, ...".
struct Stages {
  Timer lap;
  std::string text;
  void done(const char* name) {
    text += fmt::format("{}{} {:.0f} s", text.empty() ? "" : ", ", name, lap.seconds());
    lap.reset();
  }
};

struct Quality {
  PerplexityReport ppl;
  double dense_bytes = 0, sparse_bytes = 0;  // weight bytes per decode token
};

// Dense against sparse (in `mode`) on held-out text (compute_perplexity with the dense run as KL
// base), then a short greedy decode for the bytes a token reads. Predictor mode runs one token
// at a time: decode's own path (batches of 16 or more run its FFN dense).
Quality evaluate(const SparsifyFlags& f, const Model& dense, FfnMode mode, const std::string& step) {
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
      log_info("sparsify {}: dense model, chunk {}/{} ({:.0f} s)", step, c + 1, n, t.seconds());
    });
  }
  auto sparse = load_model(f.o.output);
  repack_for_session(*sparse, mode, repack_scope_for(mode, false), ResidentWeights::copy);
  sp.sparse.mode = mode;
  sp.sparse.down_type = default_copy_type(mode);  // the copies a session of the file makes by default
  if (mode == FfnMode::predictor) sp.n_batch = 1;
  Session s(*sparse, sp);
  po.kl_base = po.save_logits;
  po.save_logits.clear();
  Timer t;
  q.ppl = compute_perplexity(s, tokens, bos, po, [&](int64_t c, int64_t n, double) {
    log_info("sparsify {}: sparse model, chunk {}/{} ({:.0f} s)", step, c + 1, n, t.seconds());
  });
  std::filesystem::remove(po.kl_base);
  s.reset();
  if (s.input_sparse()) s.input_sparse()->reset_stats();
  if (s.sparse_ffn()) s.sparse_ffn()->reset_stats();
  s.eval(tokens.data(), std::min<int64_t>(64, static_cast<int64_t>(tokens.size())));
  for (int i = 0; i < 32 && s.pos() + 1 < s.n_ctx(); ++i) {
    const auto next = static_cast<int32_t>(std::max_element(s.logits(), s.logits() + sparse->hp.n_vocab) - s.logits());
    s.eval(&next, 1);
  }
  q.dense_bytes = static_cast<double>(dense.weight_bytes_per_token());
  q.sparse_bytes = s.input_sparse() ? s.input_sparse()->weight_bytes_per_token() : s.sparse_ffn()->weight_bytes_per_token();
  return q;
}

void print_quality(const SparsifyFlags& f, const Quality& q) {
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

// A temporary file of this process, removed when it goes out of scope.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& what)
      : path((std::filesystem::temp_directory_path() / fmt::format("ember-sparsify-{}-{}.gguf", getpid(), what))
                 .string()) {}
  ~TempFile() { std::filesystem::remove(path); }
};

// ReLU models: the profile's firing counts order the neurons, predictors trained on samples of
// the same run name the active ones, prepare writes both into PowerInfer's layout.
void predictor_path(SparsifyFlags& f, const Model& model, Profile& profile, std::vector<LayerSamples> samples,
                    Stages& stages) {
  const Hparams& hp = model.hp;
  TempFile profile_file("profile"), predictor_file("predictor");
  write_profile(profile, profile_file.path);
  log_info("sparsify [2/4]: predictors, trained on {} of the profiled tokens", samples.empty() ? 0 : samples[0].n);
  ThreadPool pool(f.threads > 0 ? f.threads : default_thread_count());
  PredictorTrainOptions to;
  to.recall = f.recall;
  to.patience = 1;  // a rank's training ends at the first epoch that predicts no fewer neurons
  to.type = auto_predictor_type(hp, to.max_rank);
  Timer t;
  const std::vector<LayerPredictor> layers =
      train_predictors(pool, model, samples, to, true, [&](int64_t il, const std::string& m) {
        log_info("sparsify [2/4]: layer {}/{}: {} ({:.0f} s)", il + 1, hp.n_layer, m, t.seconds());
      });
  write_predictor_file(predictor_file.path, std::filesystem::path(f.o.model).filename().string(), layers, to.type);
  stages.done("predictors");
  log_info("sparsify [3/4]: writing {} in PowerInfer's layout (neurons hot first, neuron-major down, predictors)",
           f.o.output);
  PrepareOptions po;
  po.model = f.o.model;
  po.profile = profile_file.path;
  po.predictor = predictor_file.path;
  po.output = f.o.output;
  po.n_threads = f.threads;
  const PrepareSummary ps = prepare_sparse_model(po, [](int64_t done, int64_t total) {
    log_info("sparsify [3/4]: layer {}/{}", done, total);
  });
  std::printf("predictors (held-out tokens of the calibration text; sparsity = neurons not computed):\n");
  const size_t pred_bytes = print_predictor_table(layers);
  fmt::print(stderr, "sparsify: wrote {} ({:.1f} MiB, predictors {:.1f} MiB)\n", f.o.output, ps.bytes / 1048576.0,
             pred_bytes / 1048576.0);
  stages.done("layout");
  if (f.eval_chunks > 0) {
    print_quality(f, evaluate(f, model, FfnMode::predictor, "[4/4]"));
    stages.done("measurement");
  }
}

void run_sparsify(SparsifyFlags& f) {
  Timer timer;
  Stages stages;
  f.o.allocation = parse_input_allocation(f.allocation);
  bool relu = false, moe = false;
  {
    const auto mapped = load_model(f.o.model);  // a mapped load: nothing copied
    relu = mapped->hp.act == cpu::Activation::relu;
    moe = model_has_moe(*mapped);
  }
  // A mixture's experts take input sparsity (the router already says which experts run); the
  // predictors choose neurons of dense FFNs only.
  EMBER_CHECK(!moe || f.method != "predictor", "--method predictor: this model's FFNs are mixtures of experts, whose "
              "neurons the predictors do not choose; use --method input (or auto), which thresholds the inputs "
              "inside each chosen expert");
  // The texts first: a missing one should not cost a profile.
  const bool block = f.o.allocation == InputAllocation::block;
  EMBER_CHECK(!f.block.paying_sites_only || block, "--paying-sites is for --allocation block (the {} allocation "
              "does not run the model to choose sites)", f.allocation);
  EMBER_CHECK(!f.block.every_candidate || block, "--every-candidate is for --allocation block (the {} allocation "
              "runs no candidates)", f.allocation);
  for (const auto& [path, needed] :
       {std::pair{f.corpus, f.o.profile.empty() || block}, std::pair{f.eval, f.eval_chunks > 0}})
    EMBER_CHECK(!needed || std::filesystem::is_regular_file(path),
                "cannot read the text '{}' (the project's corpus: scripts/get_corpus.sh)", path);
  // Sites pay, or not, with the copies a session of the output makes by default.
  f.block.copy_type = default_copy_type(FfnMode::input);
  EngineFlags ef;
  ef.model_path = f.o.model;
  ef.threads = f.threads;
  const bool predictors = f.method == "predictor" || (f.method == "auto" && relu && !moe);
  // Every matrix repacked for the dense kernels: the predictor path runs the model dense only
  // (profile, training's gate products, the dense side of the measurement), the input path's
  // block allocation runs the dense kernels on masked inputs; it also keeps the file's layout
  // (Model::file_layers), by which a site's copy is judged.
  ef.sparse_mode = predictors ? "dense" : "input";
  auto model = load_model_logged(ef, nullptr, RepackScope::all);
  stages.done("load");
  EMBER_CHECK(!predictors || relu,
              "--method predictor: the model's FFN activation is not ReLU, so its neurons rarely are exactly silent "
              "and a predictor has little to skip; use --method input (or auto)");
  EMBER_CHECK(!predictors || f.o.profile.empty(),
              "--profile: the predictor path trains on the calibration text itself (drop --profile, or give "
              "--method input)");
  log_info("sparsify: {} FFN: {}", relu ? "a ReLU" : "a non-ReLU",
           predictors ? "activation predictors in PowerInfer's layout (4 steps)"
                      : "input sparsity on every matrix (TEAL, 3 steps)");
  const char* first = predictors ? "[1/4]" : "[1/3]";
  Profile profile;
  std::vector<int32_t> calib;
  std::unique_ptr<FfnSampleRecorder> samples;  // the predictor path's, recorded while profiling
  if (!f.o.profile.empty()) {
    profile = read_profile(f.o.profile);
    log_info("sparsify {}: the profile {}", first, f.o.profile);
  } else {
    calib = read_corpus_tokens(*model, f.corpus);
    // Predictors train on the profiled tokens' samples; input sparsity reads only each site's
    // quantiles of |x|, which 4096 tokens fix to well within a thousandth.
    const int64_t want = f.profile_tokens >= 0 ? f.profile_tokens : predictors ? 8192 : 4096;
    if (want > 0 && static_cast<int64_t>(calib.size()) > want) calib.resize(want);
    log_info("sparsify {}: profiling {} tokens of {}{}", first, calib.size(), f.corpus,
             predictors ? fmt::format(", keeping {} of them to train the predictors on",
                                      std::min<int64_t>(f.samples, calib.size()))
                        : "");
    ProfileOptions po;
    po.threshold = relu ? 0.0f : -1.0f;
    po.quantiles_only = !predictors;  // input sparsity reads the input tables alone
    SessionParams sp;
    sp.n_threads = f.threads;
    sp.n_ctx = po.n_ctx;
    Session session(*model, sp);
    if (predictors && !calib.empty())
      samples = std::make_unique<FfnSampleRecorder>(model->hp.n_layer, model->hp.n_embd, model->hp.n_ff,
                                                    static_cast<int64_t>(calib.size()), f.samples);
    profile = profile_corpus(session, calib, po, samples.get());
    f.o.profile = std::filesystem::path(f.corpus).filename().string() + " (profiled by sparsify)";
  }
  stages.done("profile");
  if (predictors) {
    predictor_path(f, *model, profile, samples->take(), stages);
  } else {
    log_info("sparsify [2/3]: thresholds for {:.0f}% of the layers' weights ({} allocation)", 100 * f.o.sparsity,
             f.allocation);
    InputSparsityPlan plan;
    if (block) {
      if (calib.empty()) calib = read_corpus_tokens(*model, f.corpus);
      ThreadPool pool(f.threads > 0 ? f.threads : default_thread_count());
      Tokenizer tok(*model->file);
      f.block.bos = tok.vocab().add_bos ? tok.bos() : -1;
      log_info("sparsify [2/3]: each layer's output error on {} calibration tokens, steps of {:.0f}%{}{}",
               std::min<int64_t>(f.block.tokens, calib.size()), 100 * f.block.step,
               f.block.paying_sites_only ? ", shares only where a copy pays" : "",
               f.block.every_candidate ? ", every input tried at each step" : "");
      plan = allocate_input_sparsity_by_block(profile, *model, f.o.sparsity, pool, calib, f.block,
                                              [&](int64_t l, const std::string& m) {
                                                log_info("sparsify [2/3]: layer {}/{}: {}", l + 1, model->hp.n_layer, m);
                                              });
    } else {
      plan = allocate_input_sparsity(profile, *model, f.o.sparsity, f.o.allocation);
    }
    stages.done("allocation");
    const SparsifySummary s = sparsify_model(f.o, std::move(plan));
    stages.done("writing");
    std::printf("layer  attn_in  attn_out  ffn_in  ffn_hidden%s   (share of each input dropped on the calibration text%s)\n",
                block ? "  output error" : "", block ? "; the layer's output error relative to its update" : "");
    for (size_t l = 0; l < s.plan.sparsity.size(); ++l) {
      const auto& v = s.plan.sparsity[l];
      std::printf("%5zu  %7.3f  %8.3f  %6.3f  %10.3f", l, v[0], v[1], v[2], v[3]);
      if (block) std::printf("  %12.4f", s.plan.block_error[l]);
      std::printf("\n");
    }
    fmt::print(stderr, "sparsify: wrote {} ({:.1f} MiB): {:.1f}% of the layers' weights skipped ({} allocation)\n",
               f.o.output, s.bytes / 1048576.0, 100.0 * s.plan.weighted_sparsity, f.allocation);
    int64_t sparse_sites = 0;
    for (const LayerWeights& L : model->layers)
      for (int site = 0; site < kInputSites; ++site)
        sparse_sites += input_site_dense(L, site, f.block.copy_type) ? 0 : 1;
    if (sparse_sites == 0)
      fmt::print(stderr,
                 "sparsify: note: no matrix of this model has input rows of {} bytes or more, so every site decodes "
                 "with the dense kernels on its zeroed inputs: the sparse file reads every weight and will not "
                 "decode faster than the dense one (input sparsity pays on larger models: a 7B's rows are "
                 "2.3-16 KiB)\n",
                 kInputMinRowBytes);
    if (f.eval_chunks > 0) {
      print_quality(f, evaluate(f, *model, FfnMode::input, "[3/3]"));
      stages.done("measurement");
    }
  }
  fmt::print(stderr, "sparsify: done in {:.0f} s ({}); `ember generate -m {}` runs it sparse\n", timer.seconds(),
             stages.text, f.o.output);
}

}  // namespace

void add_sparsify(CLI::App& app) {
  auto f = std::make_shared<SparsifyFlags>();
  auto* cmd = app.add_subcommand(
      "sparsify", "make a model sparse in one command: profile it, then for a ReLU model train activation "
                  "predictors and write it in PowerInfer's layout, otherwise embed input-sparsity thresholds (every "
                  "matrix skips its input's small entries, TEAL) for a target share of the layers' weights; then "
                  "measure the result against the dense model. Every command runs the output sparse");
  cmd->add_option("-m,--model", f->o.model, "GGUF model file")->required();
  cmd->add_option("-o,--output", f->o.output, "output GGUF file")->required();
  cmd->add_option("--method", f->method,
                  "auto (predictor for ReLU models, input otherwise), input, or predictor")
      ->check(CLI::IsMember({"auto", "input", "predictor"}))
      ->capture_default_str();
  cmd->add_option("--sparsity", f->o.sparsity, "input method: share of the layers' weights whose inputs are skipped")
      ->check(CLI::Range(0.0, 0.95))
      ->capture_default_str();
  cmd->add_option("--allocation", f->allocation,
                  "input method, per layer: block (TEAL's: more sparsity at the inputs whose sparsity moves the "
                  "layer's output least, measured by running each layer on calibration tokens), greedy (the same "
                  "from the profile's input energies alone: no run), or uniform (every input at --sparsity)")
      ->check(CLI::IsMember({"greedy", "uniform", "block"}))
      ->capture_default_str();
  cmd->add_option("--block-tokens", f->block.tokens,
                  "block allocation: calibration tokens each layer runs (in sequences of 128)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_flag("--paying-sites", f->block.paying_sites_only,
                "block allocation: give a share only to the inputs whose input-channel-major copy then reads faster "
                "than the dense kernels (the others decode every weight anyway): faster decode for more error, "
                "where a model has such inputs (docs/agreement.md)");
  cmd->add_flag("--every-candidate", f->block.every_candidate,
                "block allocation: each step runs the layer for every input (TEAL's greedy), not only for the "
                "input that was cheapest when last tried until one tried at the step stays cheapest (the "
                "default: several times fewer runs, close to the same plan)");
  cmd->add_option("--profile", f->o.profile,
                  "use this profile (`ember profile`, with input tables) instead of profiling on --corpus");
  cmd->add_option("--corpus", f->corpus, "calibration text to profile on")->capture_default_str();
  cmd->add_option("--profile-tokens", f->profile_tokens,
                  "calibration tokens to profile (0: all; default 8192 for predictors, 4096 for input sparsity)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--samples", f->samples, "predictor method: calibration tokens per layer to train on")
      ->check(CLI::Range(int64_t{20}, int64_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--recall", f->recall, "predictor method: target recall of activation mass on held-out tokens")
      ->check(CLI::Range(0.5, 1.0))
      ->capture_default_str();
  cmd->add_option("--eval", f->eval, "held-out text to measure the result on")->capture_default_str();
  cmd->add_option("--eval-chunks", f->eval_chunks, "512-token chunks of --eval to measure on (0: skip the measurement)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "threads (0 = all cores)")->check(CLI::Range(0, 1024));
  cmd->callback([f] { run_sparsify(*f); });
}

}  // namespace ember::cli
