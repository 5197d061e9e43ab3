// The HTTP server (over server/http_server.hpp): OpenAI's API (routes_openai.cpp) and Ollama's
// (routes_ollama.cpp) on one engine, operations in server.cpp (health, metrics, the chat page, an
// API key, CORS). One Model is shared by all requests, and one BatchEngine
// (engine/batch_engine.hpp) generates for up to `parallel` of them at once: continuous batching,
// one forward pass per step over every running sequence (each its own KV cache), on one pool of
// `session.n_threads` threads. Requests wait for a sequence in FIFO order (SlotQueue); past the
// queue they get 503. A request goes to the free sequence whose cache holds the longest prefix
// of its prompt, and only the rest is evaluated (the prompt cache). Every API's route parses and
// prepares its request, then drive() takes it through the same steps (admit, wait for a
// sequence, generate, end), writing in the API's wire format (server/wire.hpp).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <semaphore>
#include <string>
#include <variant>
#include <vector>

#include "engine/batch_engine.hpp"
#include "engine/session.hpp"
#include "model/model.hpp"
#include "server/api.hpp"
#include "server/embeddings.hpp"
#include "server/metrics.hpp"
#include "server/slot_queue.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::server::http {
class HttpServer;
struct Request;
struct Response;
class DataSink;
}

namespace ember::server {

class Wire;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  size_t parallel = 2;              // sequences (KV caches) generating at once, batched
  size_t queue = 16;                // requests that may wait for a session
  size_t max_body_bytes = 1 << 20;  // larger request bodies get 413
  // A connection gets this long to deliver a whole request (its head and body) from its first
  // byte; then 408 and closed (server/http_server.hpp).
  int read_timeout_s = 10;
  // Requests must carry "Authorization: Bearer <api_key>" (all but GET /health and the page);
  // empty: none needed.
  std::string api_key;
  // Browser pages of these origins may call the server (CORS) besides the local ones (localhost,
  // 127.0.0.0/8, [::1]) and the server's own; "*": any. A request from any other origin is 403.
  std::vector<std::string> cors_origins;
  SessionParams session;  // its n_seq is set to `parallel`
  BatchEngineOptions batch;
  std::string model_id;  // the name clients use; default: the file name without .gguf
  std::optional<Pooling> pooling;  // embeddings' pooling; default: the file's, else mean
  std::string chat_template_file;  // a Jinja template used instead of the file's
};

class Server {
 public:
  static constexpr std::ptrdiff_t kParallelParses = 4;
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
  // The steps every API's generation takes (server.cpp).
  // A place in the queue (the prompt cache's affinity), or null when the queue is full.
  std::unique_ptr<SlotQueue::Ticket> admit(const std::shared_ptr<const PreparedRequest>& prep);
  ApiError busy_error() const;  // 503 server_busy, with the queue's numbers
  // Runs `parse` (a request's parsing, which compiles its grammars) while holding one of a few
  // slots: a grammar may take tens of MB and milliseconds to compile, so at most
  // kParallelParses compile at once whatever --parallel and --queue allow. A 503 where no slot
  // frees within the read timeout.
  template <class Parse>
  auto parse_gated(Parse&& parse) -> decltype(parse());
  // Waits for a sequence: >= 0, or -1 when the server is shutting down or `gone` says the client
  // left (every `poll`).
  int wait_for_sequence(SlotQueue::Ticket& t, const std::function<bool()>& gone, std::chrono::milliseconds poll);
  // Runs the request on its sequence: `write` gets each piece of text and returns false to stop,
  // `logprobs` each sampled token's log-probabilities before the piece holding its text; `gone`
  // (where set) is asked every 200 ms whether the client left. Counts it (health, metrics: the
  // time from `arrived` to the first text). Throws RequestFailed where the engine ended the job
  // with an error.
  GenerateResult generate(int slot, const PreparedRequest& prep, std::chrono::steady_clock::time_point arrived,
                          const PieceCallback& write, const LogprobCallback& logprobs,
                          const std::function<bool()>& gone);
  // generate for a whole (not streamed) answer: its text appended to `text`; the engine's error
  // as the answer to give (failed()).
  std::variant<GenerateResult, ApiError> generate_text(int slot, const PreparedRequest& prep,
                                                       std::chrono::steady_clock::time_point arrived, std::string& text,
                                                       const LogprobCallback& logprobs, const std::function<bool()>& gone);
  // A stream's wait for its sequence (drive.cpp): by the wire's comments or by watching its
  // connection `fd`, either finds a client that went away. Returns the slot, or -1 with the
  // ticket released and the stream ended as it must be (`provider_result`: the content
  // provider's return: false for a client that left, true after the shutdown's error event).
  int wait_for_stream_sequence(std::unique_ptr<SlotQueue::Ticket>& held, http::DataSink& sink, Wire& wire, int fd,
                               bool& provider_result);
  // An admitted request's answer in `wire`'s format (drive.cpp, server/wire.hpp): the choices
  // (completions' several prompts; one otherwise) whole, or the first as a stream.
  void drive(const http::Request& req, http::Response& res, std::shared_ptr<Wire> wire,
             std::vector<std::shared_ptr<const PreparedRequest>> choices, bool stream,
             std::chrono::steady_clock::time_point arrived);
  // Whether a finished generation was cut off by shutdown.
  bool cut_by_shutdown(const GenerateResult& r) const;
  // An admitted request's failure (generate's RequestFailed, or any other error: 500), counted
  // and logged; the answer to give, as a response or a stream's error event.
  ApiError failed(const std::exception& e);

  void install_routes();
  void install_openai_routes();  // routes_openai.cpp
  void install_ollama_routes();  // routes_ollama.cpp
  void install_embedding_routes();  // routes_embeddings.cpp
  void install_responses_routes();  // routes_responses.cpp
  void responses_route(const http::Request& req, http::Response& res);
  void embeddings(const http::Request& req, http::Response& res, EmbeddingApi api);
  void openai_completion(const http::Request& req, http::Response& res, bool chat);
  void ollama_completion(const http::Request& req, http::Response& res, bool chat);

  const Model& model_;
  ServerOptions opts_;
  ServedModel served_;
  Tokenizer tok_;
  std::unique_ptr<BatchEngine> engine_;
  SlotQueue queue_;
  std::unique_ptr<http::HttpServer> http_;
  std::atomic<bool> stopping_{false}, draining_{false};
  std::atomic<uint64_t> n_requests_{0}, n_completed_{0}, n_cancelled_{0}, n_errors_{0};
  std::counting_semaphore<> parse_slots_{kParallelParses};
  Metrics metrics_;
};

template <class Parse>
auto Server::parse_gated(Parse&& parse) -> decltype(parse()) {
  if (!parse_slots_.try_acquire_for(std::chrono::seconds(opts_.read_timeout_s))) return busy_error();
  struct Release {
    std::counting_semaphore<>& s;
    ~Release() { s.release(); }
  } release{parse_slots_};
  return parse();
}

// The built-in chat page served at "/" (HTML and JavaScript, no build step).
extern const char* const kChatPageHtml;

// What the served file is, for Ollama's /api/tags and /api/show (server.cpp).
ModelFileInfo model_file_info(const Model& model);

}  // namespace ember::server
