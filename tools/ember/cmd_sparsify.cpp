// `ember sparsify -m MODEL --profile P.gguf --sparsity S [--allocation greedy|uniform] -o OUT.gguf`:
// the model with input sparsity's thresholds embedded (src/sparse/sparsify.hpp); run it with
// `--sparse-mode input`.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "core/timer.hpp"
#include "sparse/sparsify.hpp"

namespace ember::cli {

void add_sparsify(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "sparsify", "Embed input-sparsity thresholds (every matrix skips its input's small entries, TEAL) for a target "
                  "share of the layers' weights; run the result with --sparse-mode input");
  auto o = std::make_shared<SparsifyOptions>();
  auto allocation = std::make_shared<std::string>("greedy");
  cmd->add_option("-m,--model", o->model, "GGUF model file")->required();
  cmd->add_option("--profile", o->profile, "profile of this model with input tables (`ember profile`)")->required();
  cmd->add_option("--sparsity", o->sparsity, "share of the layers' weights whose inputs are skipped")
      ->check(CLI::Range(0.0, 0.95))
      ->capture_default_str();
  cmd->add_option("--allocation", *allocation,
                  "greedy (per layer, more sparsity at the inputs where the profile says it costs less error) or "
                  "uniform")
      ->check(CLI::IsMember({"greedy", "uniform"}))
      ->capture_default_str();
  cmd->add_option("-o,--output", o->output, "output GGUF file")->required();
  cmd->callback([o, allocation] {
    Timer timer;
    o->allocation = parse_input_allocation(*allocation);
    const SparsifySummary s = sparsify_model(*o);
    std::printf("layer  attn_in  attn_out  ffn_in  ffn_hidden   (share of each input dropped on the profile's corpus)\n");
    for (size_t l = 0; l < s.plan.sparsity.size(); ++l) {
      const auto& v = s.plan.sparsity[l];
      std::printf("%5zu  %7.3f  %8.3f  %6.3f  %10.3f\n", l, v[0], v[1], v[2], v[3]);
    }
    fmt::print(stderr, "sparsify: wrote {} ({:.1f} MiB) in {:.1f} s: {:.1f}% of the layers' weights skipped ({} "
               "allocation); run it with --sparse-mode input\n",
               o->output, s.bytes / 1048576.0, timer.seconds(), 100.0 * s.plan.weighted_sparsity, *allocation);
  });
}

}  // namespace ember::cli
