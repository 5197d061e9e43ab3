// The HTTP server: OpenAI-compatible endpoints over cpp-httplib. One Model is shared by all
// requests; each of `parallel` sessions owns its KV cache and its thread pool of
// `session.n_threads` threads, so up to parallel * n_threads threads compute at once (on a
// small machine pass -t so that this product does not exceed the cores). Requests wait for a
// session in FIFO order (SlotQueue); past the queue they get 503. A request goes to the free
// session whose cache holds the longest prefix of its prompt, and only the rest is evaluated
// (the prompt cache: generate_cached).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/session.hpp"
#include "model/model.hpp"
#include "server/api.hpp"
#include "server/slot_queue.hpp"
#include "tokenizer/tokenizer.hpp"

namespace httplib {
class Server;
}

namespace ember::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  size_t parallel = 2;              // sessions (KV caches) generating at once
  size_t queue = 16;                // requests that may wait for a session
  size_t max_body_bytes = 1 << 20;  // larger request bodies get 413
  int read_timeout_s = 30;          // a client that sends nothing this long is dropped
  SessionParams session;
  std::string model_id;  // the name clients use; default: the file name without .gguf
};

// The /health payload's counters, also used by tests.
struct ServerStats {
  uint64_t requests = 0, completed = 0, cancelled = 0, errors = 0;
};

class Server {
 public:
  Server(const Model& model, std::string model_path, const ServerOptions& options);
  ~Server();

  // Binds the address; throws ember::Error when it cannot (port in use, bad host). Returns the
  // bound port (useful with port 0).
  int bind();
  // Serves until stop() is called (from any thread). Call bind() first.
  void listen();
  // Stops accepting, cancels running generations and makes listen() return.
  void stop();

  const ServedModel& served() const { return served_; }

 private:
  void install_routes();

  const Model& model_;
  ServerOptions opts_;
  ServedModel served_;
  Tokenizer tok_;
  std::vector<std::unique_ptr<Session>> sessions_;
  SlotQueue queue_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> n_requests_{0}, n_completed_{0}, n_cancelled_{0}, n_errors_{0};
  std::atomic<uint64_t> next_id_{0};
  uint64_t id_salt_ = 0;
};

// The built-in chat page served at "/" (HTML and JavaScript, no build step).
extern const char* const kChatPageHtml;

}  // namespace ember::server
