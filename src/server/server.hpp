// The HTTP server: OpenAI-compatible endpoints over cpp-httplib. One Model is shared by all
// requests, and one BatchEngine (engine/batch_engine.hpp) generates for up to `parallel` of
// them at once: continuous batching, one forward pass per step over every running sequence
// (each its own KV cache), on one pool of `session.n_threads` threads. Requests wait for a
// sequence in FIFO order (SlotQueue); past the queue they get 503. A request goes to the free
// sequence whose cache holds the longest prefix of its prompt, and only the rest is evaluated
// (the prompt cache).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/batch_engine.hpp"
#include "engine/session.hpp"
#include "model/model.hpp"
#include "server/api.hpp"
#include "server/connections.hpp"
#include "server/slot_queue.hpp"
#include "tokenizer/tokenizer.hpp"

namespace httplib {
class Server;
}

namespace ember::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  size_t parallel = 2;              // sequences (KV caches) generating at once, batched
  size_t queue = 16;                // requests that may wait for a session
  size_t max_body_bytes = 1 << 20;  // larger request bodies get 413
  // A connection gets this long to deliver a whole request (its header and body) after it
  // opens or after its last answer; then 408 and closed (server/connections.hpp).
  int read_timeout_s = 10;
  SessionParams session;  // its n_seq is set to `parallel`
  BatchEngineOptions batch;
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
  // Stops accepting, cancels running generations and makes listen() return. An answer cut off
  // by it says so: a 503 error, or an error event that ends the stream (no [DONE]).
  void stop();
  // Graceful shutdown, first step: new requests and those still waiting for a sequence get 503
  // (`server_shutting_down`), /health says so with 503, running ones go on. idle() says when
  // none runs (then stop()).
  void drain();
  bool idle() const;

  const ServedModel& served() const { return served_; }

 private:
  void install_routes();

  const Model& model_;
  ServerOptions opts_;
  ServedModel served_;
  Tokenizer tok_;
  std::unique_ptr<BatchEngine> engine_;
  SlotQueue queue_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> stopping_{false}, draining_{false};
  std::unique_ptr<Connections> conns_;  // made by bind(), when the port is known
  std::atomic<uint64_t> n_requests_{0}, n_completed_{0}, n_cancelled_{0}, n_errors_{0};
  std::atomic<uint64_t> next_id_{0};
  uint64_t id_salt_ = 0;
};

// The built-in chat page served at "/" (HTML and JavaScript, no build step).
extern const char* const kChatPageHtml;

}  // namespace ember::server
