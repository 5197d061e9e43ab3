#include "server/server.hpp"

#include <httplib.h>
#include <malloc.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/generator.hpp"
#include "server/worker_pool.hpp"

namespace ember::server {

namespace {

constexpr size_t kMaxExtraWorkers = 512;

// The socket of the request this worker thread is handling (set before routing).
thread_local int t_request_fd = -1;

int64_t unix_now() {
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
}

// The routes' methods (install_routes), for 405's Allow; null for a path that is no route.
const char* allowed_methods(const std::string& path) {
  for (const char* p : {"/v1/chat/completions", "/v1/completions", "/chat/completions", "/completions"})
    if (path == p) return "POST";
  if (path == "/" || path == "/health" || path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) return "GET, HEAD";
  return nullptr;
}

const char* status_error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 405) return "invalid_request_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

std::string sse(const std::string& data) { return "data: " + data + "\n\n"; }

ApiError shutting_down_error() {
  return {503, "the server is shutting down; retry on another server or later", "server_error", "",
          "server_shutting_down"};
}
void send_shutting_down(httplib::Response& res) {
  res.set_header("Retry-After", "5");
  send_error(res, shutting_down_error());
}
// An answer cut off by the server's shutdown after n tokens.
ApiError cut_off_error(int64_t n) {
  return {503, fmt::format("the server shut down before the answer was complete ({} tokens generated); retry", n),
          "server_error", "", "server_shutting_down"};
}

// Whether binding host:port fails because something listens there (EADDRINUSE), tried with a
// socket of our own (httplib's bind does not say why it failed).
bool port_in_use(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return false;
  bool in_use = false;
  const int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd >= 0) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    in_use = ::bind(fd, res->ai_addr, res->ai_addrlen) != 0 && errno == EADDRINUSE;
    close(fd);
  }
  freeaddrinfo(res);
  return in_use;
}

}  // namespace

Server::Server(const Model& model, std::string model_path, const ServerOptions& options)
    : model_(model), opts_(options), tok_(*model.file), queue_(options.parallel, options.queue) {
  EMBER_CHECK(opts_.parallel >= 1 && opts_.parallel <= 256, "--parallel must be between 1 and 256, got {}", opts_.parallel);
  EMBER_CHECK(opts_.queue <= 100000, "--queue must be at most 100000, got {}", opts_.queue);
  SessionParams sp = opts_.session;
  sp.n_seq = static_cast<int64_t>(opts_.parallel);
  engine_ = std::make_unique<BatchEngine>(model_, tok_, sp, opts_.batch);
  served_.id = opts_.model_id;
  if (served_.id.empty()) {
    served_.id = std::filesystem::path(model_path).filename().string();
    if (served_.id.size() > 5 && served_.id.ends_with(".gguf")) served_.id.resize(served_.id.size() - 5);
  }
  served_.n_ctx = engine_->n_ctx();
  served_.chat_template = model_chat_template(*model_.file);
  served_.created = unix_now();
  served_.grammar_vocab = std::make_shared<TokenGrammar>(tok_);
  // Fail at start, not per request, when the chat template is unknown.
  parse_chat_template(served_.chat_template);
  id_salt_ = std::random_device{}();

  http_ = std::make_unique<httplib::Server>();
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port and the
  // kernel split the connections between the two: SO_REUSEADDR only, so a busy port is an error
  // (a restart still binds at once over connections in TIME_WAIT).
  http_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Worker threads: enough for every admitted request (running + queued) plus headroom for
  // /health, /v1/models, the page, turning requests away with 503 and idle keep-alive
  // connections. httplib's own queue behind these threads is unbounded, so admission control
  // must happen in our handlers, which needs a thread free to run them.
  // Beyond them a connection gets a thread of its own while every worker is busy (WorkerPool),
  // up to kMaxExtraWorkers more: slow readers (closed after --read-timeout) take those.
  const size_t n_workers = opts_.parallel + opts_.queue + 16;
  http_->new_task_queue = [n_workers] { return new WorkerPool(n_workers, n_workers + kMaxExtraWorkers); };
  EMBER_CHECK(opts_.read_timeout_s >= 1 && opts_.read_timeout_s <= 3600, "--read-timeout must be between 1 and 3600 "
              "seconds, got {}", opts_.read_timeout_s);
  http_->set_payload_max_length(opts_.max_body_bytes);
  // httplib's own timeout is per read; the whole request's deadline is the watchdog's (bind():
  // Connections), which answers 408 first, so httplib's comes a little later.
  http_->set_read_timeout(opts_.read_timeout_s + 5, 0);
  http_->set_write_timeout(10, 0);
  http_->set_keep_alive_timeout(5);
  // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm and delayed ACKs
  // hold them (and small keep-alive responses) back by up to 40 ms.
  http_->set_tcp_nodelay(true);
  install_routes();
}

Server::~Server() { stop(); }

int Server::bind() {
  if (opts_.port == 0) {
    int port = http_->bind_to_any_port(opts_.host);
    EMBER_CHECK(port > 0, "cannot listen on {}: no free port", opts_.host);
    opts_.port = port;
    conns_ = std::make_unique<Connections>(port, std::chrono::seconds(opts_.read_timeout_s));
    return port;
  }
  if (!http_->bind_to_port(opts_.host, opts_.port)) {
    EMBER_CHECK(!port_in_use(opts_.host, opts_.port), "cannot listen on {}:{}: the port is in use (another server, "
                "an `ember serve` perhaps, holds it); stop it or choose another with --port", opts_.host, opts_.port);
    fail("cannot listen on {}:{} (is the host an address of this machine?)", opts_.host, opts_.port);
  }
  conns_ = std::make_unique<Connections>(opts_.port, std::chrono::seconds(opts_.read_timeout_s));
  return opts_.port;
}

void Server::listen() {
  log_info("serving {} on http://{}:{} ({} sequences of {} tokens batched on {} threads, KV caches {:.0f} MiB; queue {})",
           served_.id, opts_.host, opts_.port, opts_.parallel, served_.n_ctx, engine_->n_threads(),
           static_cast<double>(engine_->kv_bytes()) / (1 << 20), opts_.queue);
  http_->listen_after_bind();
}

void Server::stop() {
  stopping_ = true;
  if (http_) http_->stop();
}

void Server::drain() { draining_ = true; }

bool Server::idle() const {
  const SlotQueue::Stats q = queue_.stats();
  return q.busy == 0 && q.waiting == 0;
}

void Server::install_routes() {
  httplib::Server& s = *http_;

  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg;
    // A path that exists under another method: 405 with the methods it takes.
    if (const char* allow = res.status == 404 ? allowed_methods(req.path) : nullptr) {
      res.status = 405;
      res.set_header("Allow", allow);
      msg = fmt::format("{} takes {}, not {}", req.path, allow, req.method);
    } else if (res.status == 404) {
      msg = fmt::format("no such endpoint: {} {}", req.method, req.path);
    } else if (res.status == 413) msg = "the request body is too large (see --max-body)";
    else if (res.status == 400) msg = "malformed HTTP request";
    else msg = fmt::format("HTTP error {}", res.status);
    send_error(res, ApiError{res.status, msg, status_error_type(res.status), "", ""});
  });
  s.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    ++n_errors_;
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::bad_alloc&) {
      msg = "out of memory";
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    log_warn("request failed: {}", msg);
    send_error(res, ApiError{500, msg, "server_error", "", ""});
  });

  // Every request's head (its body may still come) and answer restart the watchdog's clock of
  // its connection (server/connections.hpp).
  // A request is handled on the thread that read it: its socket, found once here, serves the
  // handler and the answer's end too (t_request_fd).
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response&) {
    t_request_fd = Connections::find(req.local_port, req.remote_addr, req.remote_port);
    if (conns_) conns_->request_begins(t_request_fd);
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_post_routing_handler([this](const httplib::Request&, httplib::Response&) {
    if (conns_) conns_->request_ends(t_request_fd);
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    SlotQueue::Stats q = queue_.stats();
    // Shutting down: 503, so that a load balancer sends no more.
    if (draining_ || stopping_) res.status = 503;
    json j = {{"status", draining_ || stopping_ ? "shutting_down" : "ok"},
              {"model", served_.id},
              {"slots_total", q.n_slots},
              {"slots_busy", q.busy},
              {"queued", q.waiting},
              {"queue_limit", q.max_waiting},
              {"requests", n_requests_.load()},
              {"completed", n_completed_.load()},
              {"cancelled", n_cancelled_.load()},
              {"rejected", q.rejected},
              {"timed_out_connections", conns_ ? conns_->timed_out() : 0},
              // Forward passes and the tokens they held: their ratio is the mean batch.
              {"engine_steps", engine_->steps()},
              {"engine_rows", engine_->step_rows()},
              // Bytes malloc has handed out and not got back (all arenas): a leak shows here
              // even when fragmentation hides it from the resident size.
              {"heap_in_use", mallinfo2().uordblks}};
    res.set_content(dump(j), "application/json");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump(models_json(served_)), "application/json");
  });
  s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != served_.id)
      return send_error(res, ApiError{404, fmt::format("The model '{}' does not exist", req.matches[1].str()),
                                      "invalid_request_error", "model", "model_not_found"});
    res.set_content(dump(models_json(served_)["data"][0]), "application/json");
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kChatPageHtml, "text/html; charset=utf-8");
  });

  auto completion = [this](bool chat) {
    return [this, chat](const httplib::Request& req, httplib::Response& res) {
      ++n_requests_;
      if (draining_ || stopping_) return send_shutting_down(res);
      // The request's connection, held while it is answered: the watchdog leaves it alone, and a
      // non-streaming request watches it for the client hanging up.
      auto hold = std::make_shared<Connections::Hold>(*conns_, t_request_fd);
      auto parsed = parse_completion_request(req.body, chat, served_);
      if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
      const CompletionRequest& creq = std::get<CompletionRequest>(parsed);
      auto prepared = prepare_request(creq, tok_, served_, std::random_device{}());
      if (auto* e = std::get_if<ApiError>(&prepared)) return send_error(res, *e);
      auto prep = std::make_shared<PreparedRequest>(std::move(std::get<PreparedRequest>(prepared)));

      // The prompt cache: the free session holding the longest prefix of this prompt serves it.
      std::unique_ptr<SlotQueue::Ticket> ticket = queue_.enqueue(
          [this, prep](size_t slot) { return static_cast<size_t>(engine_->cached_prefix(static_cast<int>(slot), prep->prompt)); });
      if (!ticket) {
        SlotQueue::Stats q = queue_.stats();
        res.set_header("Retry-After", "1");
        return send_error(res, ApiError{503,
                                        fmt::format("The server is busy: {} requests are generating and {} are waiting, "
                                                    "the most it takes (--parallel {}, --queue {}); retry later",
                                                    q.busy, q.waiting, q.n_slots, q.max_waiting),
                                        "server_error", "", "server_busy"});
      }
      ResponseMeta meta{fmt::format("{}{:08x}{:08x}", chat ? "chatcmpl-" : "cmpl-", id_salt_ & 0xffffffff, next_id_++),
                        unix_now(), served_.id, chat};

      // Runs the request on its sequence in the batch; `write` gets each piece of text and
      // returns false to stop, `logprobs` each sampled token's log-probabilities before the
      // piece that holds its text; `gone` (where set) is asked at least every 200 ms whether the
      // client has left (a non-streaming one writes nothing to find out).
      auto run = [this, prep](int slot, const PieceCallback& write, const LogprobCallback& logprobs,
                              const std::function<bool()>& gone) {
        Timer t;
        std::shared_ptr<BatchEngine::Job> job = engine_->start(slot, prep->prompt, prep->gen);
        std::vector<BatchEngine::Piece> pieces;
        bool writing = true;
        for (bool more = true; more;) {
          more = job->wait(pieces, std::chrono::milliseconds(200));
          for (BatchEngine::Piece& p : pieces) {
            if (!writing) break;
            for (const TokenLogprobs& lp : p.logprobs) logprobs(lp);
            if (!p.text.empty() && (stopping_.load() || !write(p.text))) writing = false;
          }
          pieces.clear();
          if (writing && more && gone && gone()) writing = false;
          if ((!writing || stopping_.load()) && more) job->cancel();  // the engine ends it at its next step
        }
        EMBER_CHECK(job->error().empty(), "{}", job->error());
        GenerateResult r = job->result();
        if (!writing || (stopping_.load() && r.finish == FinishReason::cancelled)) r.finish = FinishReason::cancelled;
        log_info("slot {}: prompt {} tokens ({} cached), generated {} ({}), {:.0f} ms, {:.1f} tokens/s", slot,
                 r.n_prompt, r.n_cached, r.n_generated, finish_reason_name(r.finish), t.seconds() * 1e3,
                 r.gen_seconds > 0 ? r.n_generated / r.gen_seconds : 0.0);
        if (r.finish == FinishReason::cancelled) ++n_cancelled_;
        else ++n_completed_;
        return r;
      };

      if (!creq.stream) {
        int slot = ticket->wait([&] { return stopping_ || draining_ || hold->peer_closed(); },
                                std::chrono::milliseconds(250));
        if (slot < 0) {
          if (hold->peer_closed()) ++n_cancelled_;
          return send_shutting_down(res);  // (a client that left reads nothing)
        }
        std::string text;
        std::vector<TokenLogprobs> lps;
        GenerateResult r = run(
            slot,
            [&](std::string_view piece) {
              text.append(piece);
              return !stopping_.load();
            },
            [&](const TokenLogprobs& t) { lps.push_back(t); }, [&] { return hold->peer_closed(); });
        ticket.reset();
        // Cut off by shutdown: an error, never a 200 that looks complete.
        if (r.finish == FinishReason::cancelled && stopping_)
          return send_error(res, cut_off_error(r.n_generated));
        const json lp = prep->gen.n_logprobs >= 0 ? logprobs_json(meta.chat, lps, tok_) : json(nullptr);
        res.set_content(dump(completion_json(meta, text, r.finish, {r.n_prompt, r.n_generated, r.n_cached}, lp)),
                        "application/json");
        return;
      }

      const bool include_usage = creq.include_usage;
      // httplib may copy the provider; the ticket lives in one shared place so that releasing
      // it from any copy frees the session.
      auto held = std::make_shared<std::unique_ptr<SlotQueue::Ticket>>(std::move(ticket));
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      res.set_chunked_content_provider(
          "text/event-stream", [this, held, meta, include_usage, run, prep, hold](size_t, httplib::DataSink& sink) {
            if (!*held) return false;  // already ran
            auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
            // While waiting, an SSE comment every half second finds clients that went away
            // (a write to a closed connection fails), so they leave the line.
            int slot = (*held)->wait(
                [&] { return stopping_ || draining_ || !write(": waiting for a free session\n\n"); },
                std::chrono::milliseconds(500));
            if (slot < 0) {
              held->reset();
              if (!(stopping_ || draining_)) {
                ++n_cancelled_;
                return false;
              }
              if (write(sse(error_body(shutting_down_error())))) sink.done();  // a whole response: its error
              return true;
            }
            try {
              if (meta.chat && !write(sse(dump(role_chunk_json(meta))))) {
                ++n_cancelled_;
                held->reset();
                return false;
              }
              // Log-probabilities of the tokens sampled since the last chunk ride on the next one
              // (text held back by a stop string or split UTF-8 arrives later than its token).
              const bool want_lp = prep->gen.n_logprobs >= 0;
              std::vector<TokenLogprobs> pending;
              int64_t offset = 0;
              const auto take_lp = [&]() -> json {
                if (!want_lp) return nullptr;
                json j = logprobs_json(meta.chat, pending, tok_, &offset);
                pending.clear();
                return j;
              };
              GenerateResult r = run(
                  slot,
                  [&](std::string_view piece) {
                    return !stopping_.load() &&
                           write(sse(dump(chunk_json(meta, std::string(piece), std::nullopt, take_lp()))));
                  },
                  [&](const TokenLogprobs& t) { pending.push_back(t); }, nullptr);
              held->reset();  // the session is free for the next request from here on
              // Cut off by shutdown: an error event ends the stream (no finish reason, no [DONE]).
              if (r.finish == FinishReason::cancelled && stopping_) {
                if (write(sse(error_body(cut_off_error(r.n_generated))))) sink.done();
                return true;
              }
              if (r.finish == FinishReason::cancelled) return false;
              bool ok = write(sse(dump(chunk_json(meta, "", r.finish, pending.empty() ? json(nullptr) : take_lp()))));
              if (ok && include_usage)
                ok = write(sse(dump(usage_chunk_json(meta, {r.n_prompt, r.n_generated, r.n_cached}))));
              if (ok) ok = write("data: [DONE]\n\n");
              if (ok) sink.done();
              return ok;
            } catch (const std::exception& e) {
              ++n_errors_;
              held->reset();
              log_warn("streaming request failed: {}", e.what());
              write(sse(error_body(ApiError{500, e.what(), "server_error", "", ""})));
              return false;
            }
          });
    };
  };
  s.Post("/v1/chat/completions", completion(true));
  s.Post("/v1/completions", completion(false));
  s.Post("/chat/completions", completion(true));  // clients configured without the /v1 prefix
  s.Post("/completions", completion(false));
}

}  // namespace ember::server
