// One function per subcommand; each adds its CLI11 subcommand and the callback that runs it.
#pragma once
#include <CLI/CLI.hpp>

namespace ember::cli {

void add_generate(CLI::App& app);
void add_chat(CLI::App& app);
void add_inspect(CLI::App& app);
void add_synth(CLI::App& app);
void add_bench(CLI::App& app);
void add_serve(CLI::App& app);
void add_perplexity(CLI::App& app);
void add_profile(CLI::App& app);
void add_prepare(CLI::App& app);
void add_sparsify(CLI::App& app);
void add_plan(CLI::App& app);
void add_train_predictor(CLI::App& app);

}  // namespace ember::cli
