// `ember generate`: stream a continuation of a prompt (optionally through the chat template).
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "commands.hpp"
#include "common.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "engine/generator.hpp"
#include "tokenizer/chat_format.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::cli {
namespace {

struct GenerateFlags {
  EngineFlags engine;
  std::string prompt;
  std::string prompt_file;
  std::string system;
  std::string chat_template_file;  // instead of the model's template
  int n_predict = 128;
  bool chat = false;
  bool ignore_eos = false;
  bool no_echo = false;
  std::vector<std::string> stop;
  SamplingFlags sampling;
};

void run_generate(GenerateFlags& f) {
  if (!f.prompt_file.empty()) {
    std::ifstream in(f.prompt_file, std::ios::binary);
    EMBER_CHECK(in, "cannot read prompt file '{}'", f.prompt_file);
    std::stringstream ss;
    ss << in.rdbuf();
    f.prompt = ss.str();
  }
  double load_s = 0;
  auto model = load_model_logged(f.engine, &load_s);
  Tokenizer tok(*model->file);

  std::string text = f.prompt;
  if (f.chat) {
    std::vector<ChatMessage> messages;
    if (!f.system.empty()) messages.push_back({"system", f.system});
    messages.push_back({"user", f.prompt});
    text = model_chat_formatter(*model->file, chat_fallback_of(*model), tok, f.chat_template_file).render(messages, true);
  }
  std::vector<int32_t> prompt = tok.encode(text, /*add_special=*/true, /*parse_special=*/true);
  EMBER_CHECK(!prompt.empty(), "the prompt is empty: give one with -p or -f");

  Session session(*model, f.engine.session_params(*model));
  EMBER_CHECK(static_cast<int64_t>(prompt.size()) < session.n_ctx(),
              "the prompt has {} tokens but the context holds {}; use a larger -c", prompt.size(), session.n_ctx());
  const SamplerParams sp = f.sampling.resolve(*model);
  log_info("prompt: {} tokens; threads {}; context {}; seed {}", prompt.size(), session.n_threads(), session.n_ctx(),
           sp.seed);

  if (!f.chat && !f.no_echo) {
    std::fputs(f.prompt.c_str(), stdout);
    std::fflush(stdout);
  }

  GenerateParams gp;
  gp.sampling = sp;
  gp.max_tokens = f.n_predict;
  gp.stop = f.stop;
  gp.ignore_eos = f.ignore_eos;
  GenerateResult r = generate(session, tok, prompt, gp, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const double prompt_s = r.prompt_seconds, gen_s = r.gen_seconds;
  const int n_generated = static_cast<int>(r.n_generated);

  int n_evals = n_generated > 0 ? n_generated - 1 : 0;  // the last sampled token is not evaluated
  std::fprintf(stderr,
               "\nload: %.0f ms | prompt: %zu tokens in %.0f ms, %.2f tokens/s | generation: %d tokens in %.0f ms, "
               "%.2f tokens/s | peak RSS %.0f MiB\n",
               load_s * 1e3, prompt.size(), prompt_s * 1e3, prompt.size() / prompt_s, n_generated, gen_s * 1e3,
               n_evals > 0 ? n_evals / gen_s : 0.0, peak_rss_bytes() / 1048576.0);
  log_ffn_sparsity(session);
}

}  // namespace

void add_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt, streaming tokens as they come");
  f->engine.add_to(cmd);
  auto* p = cmd->add_option("-p,--prompt", f->prompt, "prompt text");
  auto* pf = cmd->add_option("-f,--file", f->prompt_file, "read the prompt from a file");
  p->excludes(pf);
  cmd->add_option("-n,--n-predict", f->n_predict, "tokens to generate (-1: until the context is full)")
      ->check(CLI::Range(-1, 1 << 24));
  cmd->add_flag("--chat", f->chat, "wrap the prompt in the model's chat template");
  cmd->add_option("--system", f->system, "system message (with --chat)");
  cmd->add_option("--chat-template-file", f->chat_template_file,
                  "with --chat: a Jinja chat template to use instead of the model's")
      ->check(CLI::ExistingFile);
  f->sampling.add_to(cmd);
  cmd->add_option("--stop", f->stop, "stop when the output contains this text (repeatable; the text is not printed)");
  cmd->add_flag("--ignore-eos", f->ignore_eos, "keep generating past end-of-generation tokens");
  cmd->add_flag("--no-echo", f->no_echo, "do not print the prompt");
  cmd->callback([f] {
    if (f->prompt.empty() && f->prompt_file.empty()) throw CLI::ValidationError("--prompt", "give a prompt with -p or -f");
    run_generate(*f);
  });
}

}  // namespace ember::cli
