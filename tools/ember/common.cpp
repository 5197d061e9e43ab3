#include "common.hpp"

#include <sys/resource.h>

#include "core/cpu_features.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"

namespace ember::cli {

void EngineFlags::add_to(CLI::App* app, bool model_required) {
  auto* m = app->add_option("-m,--model", model_path, "GGUF model file");
  if (model_required) m->required();
  app->add_option("-t,--threads", threads, "threads (0 = all cores)")->check(CLI::Range(0, 1024));
  app->add_option("-c,--ctx-size", ctx, "context size in tokens (capped at the model's)")->check(CLI::Range(1, 1 << 20));
  app->add_option("-b,--batch-size", batch, "prompt tokens per forward pass")->check(CLI::Range(1, 8192));
  app->add_flag("-v,--verbose", verbose, "more log output");
}

std::unique_ptr<Model> load_model_logged(const EngineFlags& flags, double* load_seconds) {
  if (flags.verbose) set_log_level(LogLevel::debug);
  Timer timer;
  auto model = load_model(flags.model_path);
  if (load_seconds) *load_seconds = timer.seconds();
  const Hparams& hp = model->hp;
  log_info("model: {} ({}), {} layers, n_embd {}, n_ff {}, heads {}/{} (KV), vocab {}, {:.1f} MiB", flags.model_path,
           hp.arch, hp.n_layer, hp.n_embd, hp.n_ff, hp.n_head, hp.n_head_kv, hp.n_vocab,
           model->file_bytes() / 1048576.0);
  log_debug("kernels: {}", simd_level_name(simd_level()));
  return model;
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

}  // namespace ember::cli
