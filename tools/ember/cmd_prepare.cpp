// `ember prepare -m MODEL --profile P.gguf [--predictor PRED.gguf] [--sparsity S] -o OUT.gguf`:
// writes a sparse-ready model in PowerInfer's layout (src/sparse/prepare.hpp).
#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "core/timer.hpp"
#include "sparse/cofire.hpp"
#include "sparse/prepare.hpp"

namespace ember::cli {

void add_prepare(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "prepare", "Write a sparse-ready model: neurons hot first, neuron-major down, predictor and thresholds embedded "
                 "(PowerInfer's PWRI layout)");
  auto o = std::make_shared<PrepareOptions>();
  cmd->add_option("-m,--model", o->model, "GGUF model file")->required();
  cmd->add_option("--profile", o->profile, "activation profile of this model (`ember profile`)")->required();
  cmd->add_option("--predictor", o->predictor, "predictor file (`ember train-predictor`); default: the model's own, if any");
  cmd->add_option("--sparsity", o->sparsity, "target sparsity: embed per-layer gate thresholds from the profile's quantiles")
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--down-type", o->down_type, "type of ffn_down_t: same (down's), f32, f16, q8_0, q4_0, ...")
      ->capture_default_str();
  cmd->add_flag("--bundle", o->bundle,
                "bundle each neuron's gate, up and down rows into one row of blk.N.ffn_bundle (one read a neuron for a "
                "model larger than memory; Ember's layout, which PowerInfer does not read)");
  cmd->add_flag("!--no-cluster", o->cluster,
                "lay each layer's neurons out strictly hot first (by default, where the profile has them, in its "
                "clustered orders: hot first band by band, neurons that fire for the same tokens neighbours, so a "
                "model read from its file reads them together)");
  cmd->add_option("-o,--output", o->output, "output GGUF file")->required();
  cmd->add_option("-t,--threads", o->n_threads, "threads (0 = all cores)")->capture_default_str();
  cmd->callback([o] {
    Timer timer;
    const bool tty = ::isatty(STDERR_FILENO);
    PrepareSummary s = prepare_sparse_model(*o, [tty](int64_t done, int64_t total) {
      fmt::print(stderr, "{}prepare: layer {}/{}{}", tty ? "\r" : "", done, total, tty ? "" : "\n");
      std::fflush(stderr);
    });
    fmt::print(stderr, "{}prepare: wrote {} ({:.1f} MiB) in {:.1f} s: {} layers x {} neurons reordered hot first{} (the "
               "hottest 10% hold {:.1f}% of the profile's firings), ffn_down_t {} ({}){}, predictor {}, thresholds {}\n",
               tty ? "\n" : "", o->output, s.bytes / 1048576.0, timer.seconds(), s.n_layer, s.n_ff,
               s.clustered ? fmt::format(", in bands of {} neurons that fire together", kCofireBand) : "",
               100.0 * s.hot_share,
               dtype_name(s.down_t_type), s.down_t_from_down ? "from ffn_down" : "the model's own, permuted",
               s.bundle ? ", bundled by neuron with gate and up" : "",
               s.predictor_rank > 0 ? fmt::format("rank {}", s.predictor_rank) : std::string("none"),
               s.thresholds.empty() ? std::string("none") : fmt::format("for sparsity {}", o->sparsity));
  });
}

}  // namespace ember::cli
