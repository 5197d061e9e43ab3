// The `ember` command-line program: dispatches to one subcommand per file.
#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "core/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"ember: fast local LLM inference exploiting activation sparsity"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ember 0.1.0");
  ember::cli::add_generate(app);
  ember::cli::add_chat(app);
  ember::cli::add_inspect(app);
  ember::cli::add_synth(app);
  ember::cli::add_bench(app);
  ember::cli::add_serve(app);
  ember::cli::add_perplexity(app);
  ember::cli::add_profile(app);
  ember::cli::add_prepare(app);
  ember::cli::add_sparsify(app);
  ember::cli::add_plan(app);
  ember::cli::add_train_predictor(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ember::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
