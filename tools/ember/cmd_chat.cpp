// `ember chat -m MODEL`: a conversation in the terminal, in the model's chat template. Replies
// stream as they come; the conversation stays in the KV cache (each turn re-renders the whole
// conversation and generate_cached evaluates only what the cache does not hold: the new
// message). Ctrl-C stops a reply and returns to the prompt; Ctrl-C at the prompt, Ctrl-D or /bye
// quits. A line ending in \ continues on the next; """ opens and closes a block of lines. /clear
// forgets the conversation, /system TEXT sets the system message (and clears), /help lists the
// commands. When the context fills, the oldest turns are dropped with a notice. A pasted text of
// any length, newlines included, is one message (line_reader.hpp).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "engine/generator.hpp"
#include "line_reader.hpp"
#include "tokenizer/chat_format.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::cli {
namespace {

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

struct ChatFlags {
  EngineFlags engine;
  SamplingFlags sampling;
  std::string system;
  std::string chat_template_file;  // instead of the model's template
  int n_predict = -1;  // per reply; -1: until the model ends it or the context is full
};

const char* const kHelp =
    "  /clear          forget the conversation\n"
    "  /system TEXT    set the system message (and forget the conversation)\n"
    "  /help           this list\n"
    "  /bye            quit (also Ctrl-D, or Ctrl-C at the prompt)\n"
    "  a line ending in \\ continues on the next; \"\"\" starts and ends a block of lines\n"
    "  Ctrl-C during a reply stops it\n";

// Reads one message (continuation lines and blocks joined; a paste of any length, newlines
// included, arrives whole: line_reader.hpp). False at end of input or Ctrl-C.
bool read_message(LineReader& in, std::string& out) {
  out.clear();
  bool block = false;
  for (bool first = true;; first = false) {
    std::string line;
    if (!in.read(first ? ">>> " : "... ", line) || g_interrupted) return false;
    if (line == "\"\"\"") {
      if (block) return true;
      block = true;
      continue;
    }
    if (block) {
      out += line + "\n";
      continue;
    }
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      out += line + "\n";
      continue;
    }
    out += line;
    return true;
  }
}

void run_chat(ChatFlags& f) {
  auto model = load_model_logged(f.engine, nullptr);
  Tokenizer tok(*model->file);
  const ChatFormatter format = model_chat_formatter(*model->file, chat_fallback_of(*model), tok, f.chat_template_file);
  Session session(*model, f.engine.session_params(*model));
  GenerateParams gp;
  gp.sampling = f.sampling.resolve(*model);
  // Ctrl-C interrupts the terminal read and the reply, not the process (no SA_RESTART).
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  set_log_level(f.engine.verbose ? LogLevel::debug : LogLevel::warn);
  std::fprintf(stdout, "ember chat: %s, context %lld tokens. /help for commands, Ctrl-D to quit.\n",
               f.engine.model_path.c_str(), static_cast<long long>(session.n_ctx()));

  std::vector<ChatMessage> turns;  // user and assistant messages, oldest first
  std::string system = f.system;
  // The conversation's tokens with a reply to come, dropping the oldest turns while they leave
  // less than a quarter of the context for the reply.
  auto render = [&](std::vector<int32_t>& prompt) {
    for (;;) {
      std::vector<ChatMessage> all;
      if (!system.empty()) all.push_back({"system", system});
      all.insert(all.end(), turns.begin(), turns.end());
      prompt = tok.encode(format.render(all, true), true, true);
      if (static_cast<int64_t>(prompt.size()) + session.n_ctx() / 4 <= session.n_ctx() || turns.size() <= 1) return;
      const size_t drop = turns.size() >= 3 ? 2 : 1;  // a user message and its reply
      turns.erase(turns.begin(), turns.begin() + static_cast<std::ptrdiff_t>(drop));
      std::fputs("[context full: the oldest turn was dropped]\n", stdout);
    }
  };

  LineReader input;
  for (std::string msg;;) {
    g_interrupted = false;
    if (!read_message(input, msg)) {
      std::fputs("\n", stdout);
      break;
    }
    if (msg.empty()) continue;
    if (msg == "/bye" || msg == "/exit" || msg == "/quit") break;
    if (msg == "/help" || msg == "/?") {
      std::fputs(kHelp, stdout);
      continue;
    }
    if (msg == "/clear") {
      turns.clear();
      session.reset();
      std::fputs("[conversation cleared]\n", stdout);
      continue;
    }
    if (msg.rfind("/system", 0) == 0 && (msg.size() == 7 || msg[7] == ' ')) {
      system = msg.size() > 8 ? msg.substr(8) : "";
      turns.clear();
      session.reset();
      std::fputs(system.empty() ? "[system message removed]\n" : "[system message set; conversation cleared]\n", stdout);
      continue;
    }
    if (msg[0] == '/') {
      std::fprintf(stdout, "unknown command %s (/help lists them)\n", msg.c_str());
      continue;
    }
    turns.push_back({"user", msg});
    std::vector<int32_t> prompt;
    render(prompt);
    if (static_cast<int64_t>(prompt.size()) >= session.n_ctx()) {
      std::fprintf(stdout, "[the message is too long: %zu tokens, the context holds %lld; use a larger -c]\n",
                   prompt.size(), static_cast<long long>(session.n_ctx()));
      turns.pop_back();
      continue;
    }
    gp.max_tokens = f.n_predict;
    std::string reply;
    GenerateResult r;
    try {
      r = generate_cached(session, tok, prompt, gp, [&](std::string_view piece) {
        if (g_interrupted) return false;
        reply.append(piece);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        return true;
      });
    } catch (const Error& e) {
      std::fprintf(stdout, "\n[error: %s]\n", e.what());
      turns.pop_back();
      continue;
    }
    if (r.finish == FinishReason::cancelled) std::fputs(" [stopped]", stdout);
    if (r.finish == FinishReason::context) std::fputs(" [the context is full]", stdout);
    std::fputs("\n", stdout);
    turns.push_back({"assistant", reply});
  }
}

}  // namespace

void add_chat(CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  CLI::App* cmd = app.add_subcommand("chat", "talk to a model in the terminal (its chat template, history in the KV cache)");
  f->engine.add_to(cmd);
  f->sampling.add_to(cmd);
  cmd->add_option("--system", f->system, "system message");
  cmd->add_option("--chat-template-file", f->chat_template_file, "a Jinja chat template to use instead of the model's")
      ->check(CLI::ExistingFile);
  cmd->add_option("-n,--n-predict", f->n_predict, "most tokens per reply (-1: until the model ends it)")
      ->check(CLI::Range(-1, 1 << 24));
  cmd->callback([f] { run_chat(*f); });
}

}  // namespace ember::cli
