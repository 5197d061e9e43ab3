// `ember serve`: OpenAI- and Ollama-compatible HTTP APIs (see src/server/server.hpp).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>

#include "commands.hpp"
#include "common.hpp"
#include "core/huge_pages.hpp"
#include "core/log.hpp"
#include "model/kv_cache.hpp"
#include "server/server.hpp"

namespace ember::cli {
namespace {

struct ServeFlags {
  EngineFlags engine;
  server::ServerOptions server;
  size_t max_body_kib = 1024;
  double shutdown_grace_s = 30;
  std::string pooling = "auto";
  const CLI::Option* ctx_option = nullptr;  // -c: given or not
};

// Without -c, each sequence gets the model's training context (a client's long tool list or
// conversation fits, as the model was trained for it) where every sequence's KV cache fits in a
// quarter of the free memory; else the largest power-of-two share of it that does, never below
// the engine's default. Says what it chose.
int64_t serve_context(const Model& model, const SessionParams& p, int parallel, int64_t fallback) {
  const Hparams& hp = model.hp;
  const int64_t train = hp.n_ctx_train > 0 ? hp.n_ctx_train : fallback;
  const size_t per_token = KvCache::bytes_for(hp.n_layer, 1, hp.n_head_kv * hp.head_dim, p.kv_type) *
                           static_cast<size_t>(parallel);
  const size_t room = available_memory_bytes() / 4;
  int64_t ctx = train;
  while (ctx > fallback && room > 0 && per_token * static_cast<size_t>(ctx) > room) ctx /= 2;
  ctx = std::max(ctx, std::min(fallback, train));
  log_info("serve: a context of {} tokens per sequence ({}; -c sets another), KV caches {:.0f} MiB for {} sequences",
           ctx, ctx == train ? "the model's training context" : fmt::format("of its {} trained: what fits a quarter of the free memory", train),
           static_cast<double>(per_token) * static_cast<double>(ctx) / 1048576.0, parallel);
  return ctx;
}

void run_serve(ServeFlags& f) {
  // SIGINT/SIGTERM are taken by one thread with sigwait, which stops the server cleanly. Block
  // them before any thread exists so that all threads inherit the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that goes away must not kill the server

  // Without -t, one core is left to the HTTP threads and the clients (a chat page or tools on the
  // same machine): on 2 cores with 4 local streaming clients that serves 1.3x the tokens of using
  // both (docs/benchmarks.md).
  if (f.engine.threads == 0 && default_thread_count() > 1) {
    f.engine.threads = default_thread_count() - 1;
    log_info("serve: {} compute threads, one core left for HTTP and clients (-t to choose)", f.engine.threads);
  }
  auto model = load_model_logged(f.engine, nullptr);
  f.server.session = f.engine.session_params(*model);
  if (f.ctx_option && f.ctx_option->count() == 0)
    f.server.session.n_ctx = serve_context(*model, f.server.session, f.server.parallel, f.engine.ctx);
  f.server.max_body_bytes = f.max_body_kib * 1024;
  if (f.pooling != "auto") f.server.pooling = parse_pooling(f.pooling);
  if (f.server.api_key.empty())
    if (const char* key = std::getenv("EMBER_API_KEY")) f.server.api_key = key;
  server::Server srv(*model, f.engine.model_path, f.server);
  srv.bind();
  // The first signal drains: no new requests (503), the running ones finish for up to
  // --shutdown-grace seconds; a second signal, or the grace's end, stops at once (answers cut
  // off then say so).
  std::atomic<bool> listened{false};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (srv.idle() || f.shutdown_grace_s <= 0) {
      log_info("signal {}: shutting down", sig);
    } else {
      log_info("signal {}: shutting down once the running requests finish (at most {:.0f} s; a second signal stops "
               "now)", sig, f.shutdown_grace_s);
      srv.drain();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(f.shutdown_grace_s);
      while (!srv.idle() && std::chrono::steady_clock::now() < deadline) {
        timespec tick{0, 100 * 1000 * 1000};
        if (sigtimedwait(&sigs, nullptr, &tick) > 0) {
          log_info("second signal: stopping now");
          break;
        }
      }
      if (!srv.idle()) log_warn("stopping with requests still running: their answers end with an error");
    }
    srv.stop();
    // listen() returns once every handler has; one that does not (nothing should run for long
    // after stop(), but a process must always be stoppable) is left behind after kStopWait or at
    // a further signal.
    constexpr int kStopWait = 10;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(kStopWait);
    while (!listened && std::chrono::steady_clock::now() < until) {
      timespec tick{0, 100 * 1000 * 1000};
      if (sigtimedwait(&sigs, nullptr, &tick) > 0) break;
    }
    if (!listened) {
      log_warn("a request is still being handled {} s after the stop; exiting without it", kStopWait);
      std::fflush(nullptr);
      std::_Exit(1);
    }
  });
  srv.listen();
  listened = true;
  kill(getpid(), SIGTERM);  // wakes the signal thread when listen() returned on its own
  signal_thread.join();
}

}  // namespace

void add_serve(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "serve a model over OpenAI- and Ollama-compatible HTTP APIs (with a chat page at /, metrics at /metrics)");
  f->engine.add_to(cmd);
  f->ctx_option = cmd->get_option("-c");
  cmd->add_option("--host", f->server.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", f->server.port, "port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--parallel", f->server.parallel,
                  "sequences generating at once (continuous batching: one forward pass for all of them, each with "
                  "its own KV cache of -c tokens)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--prompt-chunk", f->server.batch.prompt_chunk,
                  "most prompt tokens a starting request evaluates per step while others generate (0: the batch size)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--queue", f->server.queue, "requests that may wait for a sequence; more get 503")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--max-body", f->max_body_kib, "largest request body in KiB; larger ones get 413")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--read-timeout,--timeout", f->server.read_timeout_s,
                  "seconds a connection has to deliver a whole request (header and body); then 408 and closed")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", f->shutdown_grace_s,
                  "on SIGTERM / SIGINT, seconds the running requests may take to finish (new ones get 503); 0: stop at once")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--alias", f->server.model_id, "model name clients use (default: the file name without .gguf)");
  cmd->add_option("--api-key", f->server.api_key,
                  "require 'Authorization: Bearer KEY' on every route but GET /health and the chat page (also "
                  "EMBER_API_KEY)");
  cmd->add_option("--cors", f->server.cors_origins,
                  "origins whose browser pages may call the server besides local ones (http://localhost:*, "
                  "127.0.0.0/8, [::1]) and its own: repeat it or give a list; '*' for any. Pages of other origins get 403");
  cmd->add_option("--chat-template-file", f->server.chat_template_file,
                  "a Jinja chat template to use instead of the model's (as llama.cpp's --chat-template-file)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--pooling", f->pooling,
                  "embeddings (/v1/embeddings, /api/embed): how the tokens' final hidden states are pooled: mean, "
                  "last (the last token's), cls (the first's), or auto (the file's pooling_type, else mean)")
      ->check(CLI::IsMember({"auto", "mean", "last", "cls"}))
      ->capture_default_str();
  cmd->callback([f] { run_serve(*f); });
}

}  // namespace ember::cli
