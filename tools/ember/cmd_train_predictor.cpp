// `ember train-predictor -m MODEL (-f CORPUS | --synthetic-tokens N) -o OUT.gguf`: runs the model
// densely over a text (or random token ids, for synthetic models), then trains one activation
// predictor per layer with the rank searched per layer (src/sparse/predictor_train.hpp), and
// writes the predictor GGUF (docs/sparse_formats.md).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "commands.hpp"
#include "common.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "sparse/predictor_train.hpp"
#include "sparse/samples_file.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::cli {
namespace {

struct TrainArgs {
  EngineFlags engine;
  std::string corpus, out, from_samples, type = "auto";
  int64_t synthetic_tokens = 0, samples = 4000, seq = 512;
  double recall = 0.99;
  int64_t min_rank = 16, max_rank = 1024;
  int epochs = 4;
  int patience = 2;
  int64_t train_batch = 32;
  float lr = 2e-3f, pos_weight = 4.0f, threshold = 0.0f;
  uint64_t seed = 1;
  bool random_init = false;
};

// Runs the model over the corpus (or random token ids) and keeps the training samples.
std::vector<LayerSamples> collect_samples(const TrainArgs& a, const Model& model, ThreadPool& pool) {
  const Hparams& hp = model.hp;
  std::vector<int32_t> tokens;
  if (!a.corpus.empty()) {
    std::ifstream in(a.corpus, std::ios::binary);
    EMBER_CHECK(in, "cannot read corpus '{}'", a.corpus);
    std::stringstream ss;
    ss << in.rdbuf();
    Tokenizer tok(*model.file);
    tokens = tok.encode(ss.str(), false, false);
    log_info("corpus: {} ({} tokens)", a.corpus, tokens.size());
  } else {
    std::mt19937 rng(static_cast<uint32_t>(a.seed));
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(hp.n_vocab - 1));
    tokens.resize(static_cast<size_t>(a.synthetic_tokens));
    for (auto& t : tokens) t = pick(rng);
    log_info("{} random token ids", tokens.size());
  }
  SampleOptions so;
  so.max_tokens = a.samples, so.n_ctx = a.seq, so.threshold = a.threshold, so.seed = a.seed;
  so.batch = std::min<int64_t>(a.engine.batch, 64);
  return collect_ffn_samples(model, pool, tokens, so, [](const std::string& m) { log_info("samples: {}", m); });
}

void run_train(const TrainArgs& a) {
  EMBER_CHECK((a.corpus.empty() ? 0 : 1) + (a.synthetic_tokens == 0 ? 0 : 1) + (a.from_samples.empty() ? 0 : 1) == 1,
              "train-predictor: give exactly one of -f CORPUS (a text file), --synthetic-tokens N or --from-samples "
              "FILE (from `ember profile --samples`)");
  auto dir = std::filesystem::absolute(a.out).parent_path();
  EMBER_CHECK(std::filesystem::is_directory(dir), "cannot write '{}': directory '{}' does not exist", a.out,
              dir.string());
  auto model = load_model_logged(a.engine, nullptr, RepackScope::attention_output);
  const Hparams& hp = model->hp;
  const DType type = a.type == "f32"    ? DType::F32
                     : a.type == "f16"  ? DType::F16
                     : a.type == "q8_0" ? DType::Q8_0
                                        : auto_predictor_type(hp, a.max_rank);
  EMBER_CHECK(type != DType::Q8_0 || hp.n_embd % 32 == 0,
              "--type q8_0 needs n_embd to be a multiple of 32 (this model's is {}); use f16", hp.n_embd);
  log_info("predictor weights: {}{}", dtype_name(type),
           type == DType::Q8_0 ? " (ranks are multiples of 32)" : "");
  ThreadPool pool(a.engine.threads > 0 ? a.engine.threads : default_thread_count());
  Timer timer;
  std::vector<LayerSamples> samples;
  if (!a.from_samples.empty()) {
    samples = read_samples_file(a.from_samples, hp);
    log_info("samples: {} tokens per layer read from {}", samples[0].n, a.from_samples);
  } else {
    samples = collect_samples(a, *model, pool);
    log_info("samples: {} tokens per layer collected in {:.1f} s", samples[0].n, timer.seconds());
  }

  PredictorTrainOptions to;
  to.recall = a.recall, to.min_rank = a.min_rank, to.max_rank = a.max_rank;
  to.epochs = a.epochs, to.patience = a.patience, to.batch = a.train_batch, to.lr = a.lr, to.pos_weight = a.pos_weight, to.type = type, to.seed = a.seed;
  Timer lt;
  const std::vector<LayerPredictor> layers =
      train_predictors(pool, *model, samples, to, !a.random_init, [&](int64_t il, const std::string& m) {
        log_info("layer {}/{}: {} ({:.1f} s)", il + 1, hp.n_layer, m, lt.seconds());
      });
  write_predictor_file(a.out, std::filesystem::path(a.engine.model_path).filename().string(), layers, type);

  const size_t total = print_predictor_table(layers);
  std::printf("wrote %s: %zu layers, %.2f MiB of predictors, in %.1f s\n", a.out.c_str(), layers.size(),
              total / 1048576.0, timer.seconds());
}

}  // namespace

void add_train_predictor(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train-predictor", "train per-layer activation predictors (fc1/fc2) for a model");
  a->engine.add_to(cmd);
  cmd->add_option("-f,--file", a->corpus, "training text")->check(CLI::ExistingFile);
  cmd->add_option("--from-samples", a->from_samples, "train on samples saved by `ember profile --samples`")
      ->check(CLI::ExistingFile);
  cmd->add_option("--synthetic-tokens", a->synthetic_tokens, "train on this many random token ids instead of a text")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("-o,--output", a->out, "predictor GGUF to write")->required();
  cmd->add_option("--recall", a->recall, "target recall of activation mass on held-out tokens")
      ->check(CLI::Range(0.5, 1.0))->capture_default_str();
  cmd->add_option("--min-rank", a->min_rank, "smallest rank tried")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  cmd->add_option("--max-rank", a->max_rank, "largest rank tried")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  cmd->add_option("--samples", a->samples, "tokens kept per layer for training (bounds memory)")
      ->check(CLI::Range(int64_t{20}, int64_t{1} << 24))->capture_default_str();
  cmd->add_option("--seq", a->seq, "tokens per sequence run through the model")->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--epochs", a->epochs, "training epochs per rank")->check(CLI::Range(0, 10000))->capture_default_str();
  cmd->add_option("--patience", a->patience,
                  "stop training a rank after this many epochs that predict no fewer neurons than the best so far "
                  "(0: run all epochs)")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  cmd->add_option("--train-batch", a->train_batch, "tokens per Adam step")->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--lr", a->lr, "Adam learning rate")->check(CLI::Range(1e-6f, 1.0f))->capture_default_str();
  cmd->add_option("--pos-weight", a->pos_weight, "loss weight of a firing neuron of mean mass (silent: 1)")
      ->check(CLI::Range(0.01f, 1e4f))->capture_default_str();
  cmd->add_option("--fire-threshold", a->threshold, "a neuron fires when |act(gate)| > this (0 for ReLU models)")
      ->check(CLI::Range(0.0f, 1e30f))->capture_default_str();
  cmd->add_option("--type", a->type, "type of fc1/fc2: f16, f32, q8_0, or auto (q8_0 where n_embd and the ranks allow)")
      ->check(CLI::IsMember({"auto", "f16", "f32", "q8_0"}))
      ->capture_default_str();
  cmd->add_flag("--random-init", a->random_init,
               "start from random weights instead of the best low-rank linear fit of the gate's pre-activations on the sample tokens");
  cmd->add_option("--seed", a->seed, "random seed")->capture_default_str();
  cmd->callback([a] { run_train(*a); });
}

}  // namespace ember::cli
