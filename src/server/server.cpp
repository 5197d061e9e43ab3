#include "server/server.hpp"

#include "server/http_server.hpp"
#include <malloc.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/generator.hpp"
#include "engine/sampler.hpp"
#include "server/ollama.hpp"
#include "server/routes_common.hpp"
#include "server/worker_pool.hpp"

namespace ember::server {

int64_t unix_now() {
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

namespace {
// For 503s: when to come back.
void set_retry_after(http::Response& res, const ApiError& e) {
  if (e.code == "server_busy") res.set_header("Retry-After", "1");
  if (e.code == "server_shutting_down") res.set_header("Retry-After", "5");
}
}  // namespace

void send_error(http::Response& res, const ApiError& e) {
  res.status = e.status;
  set_retry_after(res, e);
  res.set_content(error_body(e), "application/json");
}

void send_ollama_error(http::Response& res, const ApiError& e) {
  res.status = e.status;
  set_retry_after(res, e);
  res.set_content(ollama::error_body(e), "application/json");
}

std::string sse(const std::string& data) { return "data: " + data + "\n\n"; }

ApiError shutting_down_error() {
  return {503, "the server is shutting down; retry on another server or later", "server_error", "",
          "server_shutting_down"};
}

ApiError cut_off_error(int64_t n) {
  return {503, fmt::format("the server shut down before the answer was complete ({} tokens generated); retry", n),
          "server_error", "", "server_shutting_down"};
}

namespace {

constexpr size_t kMaxExtraWorkers = 512;

const char* status_error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

// A constant-time comparison (an API key must not leak through timing).
bool same_secret(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0;
}

}  // namespace

ModelFileInfo model_file_info(const Model& model) {
  const gguf::Reader& r = *model.file;
  ModelFileInfo f;
  f.path = r.path();
  f.architecture = model.hp.arch;
  std::error_code ec;
  f.bytes = std::filesystem::file_size(f.path, ec);
  if (ec) f.bytes = r.file_size();
  const auto mtime = std::filesystem::last_write_time(f.path, ec);
  if (!ec)
    f.modified = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::file_clock::to_sys(mtime).time_since_epoch()).count();
  std::map<std::string, uint64_t> by_type;  // bytes of the matrices of each type
  for (const auto& t : r.tensors()) {
    f.parameters += static_cast<uint64_t>(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]);
    if (t.n_dims >= 2) by_type[std::string(dtype_name(t.type))] += t.nbytes;
  }
  uint64_t most = 0;
  for (const auto& [type, bytes] : by_type)
    if (bytes > most) most = bytes, f.quantization = type;
  const std::string stamp = fmt::format("{}:{}:{}", f.path, f.bytes, f.modified);
  // 64 hex digits as Ollama's digests have: four FNV-1a hashes of the stamp, each seeded by the last.
  const uint64_t h1 = fnv1a64(stamp), h2 = fnv1a64(stamp, h1), h3 = fnv1a64(stamp, h2), h4 = fnv1a64(stamp, h3);
  f.digest = fmt::format("{:016x}{:016x}{:016x}{:016x}", h1, h2, h3, h4);
  f.metadata = json::object();
  for (const std::string& key : r.keys()) {
    const gguf::Value& v = *r.find(key);
    if (v.type == gguf::ValueType::ARRAY) continue;
    if (v.type == gguf::ValueType::STRING) f.metadata[key] = v.s;
    else if (v.type == gguf::ValueType::BOOL) f.metadata[key] = v.i != 0;
    else if (v.type == gguf::ValueType::F32 || v.type == gguf::ValueType::F64) f.metadata[key] = v.f;
    else if (v.type == gguf::ValueType::U64) f.metadata[key] = v.u();
    else f.metadata[key] = v.i;
  }
  return f;
}

Server::Server(const Model& model, std::string model_path, const ServerOptions& options)
    : model_(model), opts_(options), tok_(*model.file), queue_(options.parallel, options.queue) {
  EMBER_CHECK(opts_.parallel >= 1 && opts_.parallel <= 256, "--parallel must be between 1 and 256, got {}", opts_.parallel);
  EMBER_CHECK(opts_.queue <= 100000, "--queue must be at most 100000, got {}", opts_.queue);
  EMBER_CHECK(opts_.read_timeout_s >= 1 && opts_.read_timeout_s <= 3600, "--read-timeout must be between 1 and 3600 "
              "seconds, got {}", opts_.read_timeout_s);
  SessionParams sp = opts_.session;
  sp.n_seq = static_cast<int64_t>(opts_.parallel);
  engine_ = std::make_unique<BatchEngine>(model_, tok_, sp, opts_.batch);
  served_.id = opts_.model_id;
  if (served_.id.empty()) {
    served_.id = std::filesystem::path(model_path).filename().string();
    if (served_.id.size() > 5 && served_.id.ends_with(".gguf")) served_.id.resize(served_.id.size() - 5);
  }
  served_.n_ctx = engine_->n_ctx();
  served_.n_vocab = model_.hp.n_vocab;
  served_.chat = std::make_shared<const ChatFormatter>(model_chat_formatter(*model_.file, chat_fallback_of(model_), tok_, opts_.chat_template_file));
  served_.chat_template = served_.chat->source();
  served_.created = unix_now();
  served_.grammar_vocab = std::make_shared<TokenGrammar>(tok_);
  served_.sampling = default_sampling(model_);
  served_.file = model_file_info(model_);
  served_.n_embd = model_.hp.n_embd;
  served_.pooling = opts_.pooling ? *opts_.pooling : default_pooling(model_);
  served_.stopping = &stopping_;

  http::ServerOptions h;
  h.max_body = opts_.max_body_bytes;
  h.read_timeout = std::chrono::seconds(opts_.read_timeout_s);
  // Worker threads: enough for every admitted request (running + queued) plus headroom for
  // /health, /v1/models, the page, turning requests away with 503 and idle keep-alive
  // connections; beyond them a connection gets a thread of its own while every worker is busy,
  // up to kMaxExtraWorkers more: slow readers (closed after --read-timeout) take those.
  h.base_threads = opts_.parallel + opts_.queue + 16;
  h.max_threads = h.base_threads + kMaxExtraWorkers;
  http_ = std::make_unique<http::HttpServer>(h);
  install_routes();
}

Server::~Server() { stop(); }

int Server::bind() {
  opts_.port = http_->bind(opts_.host, opts_.port);
  return opts_.port;
}

void Server::listen() {
  log_info("serving {} on http://{}:{} ({} sequences of {} tokens batched on {} threads, KV caches {:.0f} MiB; queue {})"
           "{}", served_.id, opts_.host, opts_.port, opts_.parallel, served_.n_ctx, engine_->n_threads(),
           static_cast<double>(engine_->kv_bytes()) / (1 << 20), opts_.queue,
           opts_.api_key.empty() ? "" : "; an API key is required");
  http_->listen();
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

// ---- the steps of every generation ------------------------------------------------------------

std::unique_ptr<SlotQueue::Ticket> Server::admit(const std::shared_ptr<const PreparedRequest>& prep) {
  // The prompt cache: the free sequence holding the longest prefix of this prompt serves it.
  return queue_.enqueue(
      [this, prep](size_t slot) { return static_cast<size_t>(engine_->cached_prefix(static_cast<int>(slot), prep->prompt)); });
}

ApiError Server::busy_error() const {
  const SlotQueue::Stats q = queue_.stats();
  return {503,
          fmt::format("The server is busy: {} requests are generating and {} are waiting, the most it takes "
                      "(--parallel {}, --queue {}); retry later", q.busy, q.waiting, q.n_slots, q.max_waiting),
          "server_error", "", "server_busy"};
}

int Server::wait_for_sequence(SlotQueue::Ticket& t, const std::function<bool()>& gone,
                              std::chrono::milliseconds poll) {
  return t.wait([&] { return stopping_ || draining_ || (gone && gone()); }, poll);
}

ApiError Server::failed(const std::exception& e) {
  ++n_errors_;
  log_warn("request failed: {}", e.what());
  if (const auto* r = dynamic_cast<const RequestFailed*>(&e)) return r->api;
  return ApiError{500, e.what(), "server_error", "", ""};
}

bool Server::cut_by_shutdown(const GenerateResult& r) const {
  return r.finish == FinishReason::cancelled && stopping_;
}

GenerateResult Server::generate(int slot, const PreparedRequest& prep, std::chrono::steady_clock::time_point arrived,
                                const PieceCallback& write, const LogprobCallback& logprobs,
                                const std::function<bool()>& gone) {
  Timer t;
  std::shared_ptr<BatchEngine::Job> job = engine_->start(slot, prep.prompt, prep.gen);
  std::vector<BatchEngine::Piece> pieces;
  bool writing = true, first = true;
  for (bool more = true; more;) {
    more = job->wait(pieces, std::chrono::milliseconds(200));
    for (BatchEngine::Piece& p : pieces) {
      if (!writing) break;
      for (const TokenLogprobs& lp : p.logprobs) logprobs(lp);
      if (p.text.empty()) continue;
      if (first) {
        metrics_.first_token(std::chrono::duration<double>(std::chrono::steady_clock::now() - arrived).count());
        first = false;
      }
      if (stopping_.load() || !write(p.text)) writing = false;
    }
    pieces.clear();
    if (writing && more && gone && gone()) writing = false;
    if ((!writing || stopping_.load()) && more) job->cancel();  // the engine ends it at its next step
  }
  if (!job->error().empty()) {
    if (job->request_error()) throw RequestFailed(ApiError{400, job->error(), "invalid_request_error", "", ""});
    throw RequestFailed(ApiError{500, job->error(), "server_error", "", ""});
  }
  GenerateResult r = job->result();
  if (!writing) r.finish = FinishReason::cancelled;
  log_info("slot {}: prompt {} tokens ({} cached), generated {} ({}), {:.0f} ms, {:.1f} tokens/s", slot, r.n_prompt,
           r.n_cached, r.n_generated, finish_reason_name(r.finish), t.seconds() * 1e3,
           r.gen_seconds > 0 ? r.n_generated / r.gen_seconds : 0.0);
  if (r.finish == FinishReason::cancelled) ++n_cancelled_;
  else ++n_completed_;
  metrics_.generated(r.n_prompt, r.n_cached, r.n_generated);
  return r;
}

// ---- routes: operations ---------------------------------------------------------------------------

void Server::install_routes() {
  http::HttpServer& s = *http_;

  s.set_error_handler([this](const http::Request& req, http::Response& res) {
    if (!res.body.empty()) return;
    std::string msg;
    // A path that exists under another method: 405 with the methods its routes take.
    if (const std::string allow = res.status == 404 ? http_->allowed_methods(req.path) : std::string(); !allow.empty()) {
      res.status = 405;
      res.set_header("Allow", allow);
      msg = fmt::format("{} takes {}, not {}", req.path, allow, req.method);
    } else if (res.status == 404) {
      msg = fmt::format("no such endpoint: {} {}", req.method, req.path);
    } else if (!res.reason.empty()) {  // what the HTTP layer refused, and why
      msg = res.reason;
    } else {
      msg = fmt::format("HTTP error {}", res.status);
    }
    send_error(res, ApiError{res.status, msg, status_error_type(res.status), "", res.status == 408 ? "timeout" : ""});
  });
  s.set_exception_handler([this](const http::Request&, http::Response& res, std::exception_ptr ep) {
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

  // Before every route: a browser page's origin (one that may not call the server is 403, so
  // that no web page drives it: a "simple" cross-origin POST runs without a preflight), and the
  // API key where one is required (all but /health and the page; a browser's CORS preflight
  // carries none).
  s.set_pre_routing_handler([this](const http::Request& req, http::Response& res) {
    if (const std::string* origin = req.header("origin"); origin && !origin_allowed(opts_.cors_origins, *origin, req.get_header_value("host"))) {
      send_error(res, ApiError{403, fmt::format("pages of the origin '{}' may not call this server (local pages may; "
                                                "others with --cors ORIGIN)", origin->substr(0, 100)),
                               "permission_error", "", "origin_not_allowed"});
      return http::HttpServer::Routing::handled;
    }
    if (opts_.api_key.empty() || req.method == "OPTIONS" || req.path == "/health" || req.path == "/") {
      return http::HttpServer::Routing::unhandled;
    }
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0 && same_secret(auth.substr(7), opts_.api_key))
      return http::HttpServer::Routing::unhandled;
    send_error(res, ApiError{401,
                             auth.empty() ? "an API key is required: send the header 'Authorization: Bearer <key>'"
                                          : "the API key is not valid",
                             "authentication_error", "", "invalid_api_key"});
    return http::HttpServer::Routing::handled;
  });
  // After every route: CORS headers for an allowed page's origin, the metrics' count by status.
  s.set_post_routing_handler([this](const http::Request& req, http::Response& res) {
    if (const std::string* origin = req.header("origin"); origin && origin_allowed(opts_.cors_origins, *origin, req.get_header_value("host"))) {
      res.set_header("Access-Control-Allow-Origin", *origin);
      res.set_header("Vary", "Origin");
    }
    metrics_.request(res.status);
  });
  // CORS preflight (of an allowed origin: others were refused before): every route takes these
  // methods and headers.
  s.Options(R"(.*)", [](const http::Request&, http::Response& res) {
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers", "Content-Type, Authorization");
    res.set_header("Access-Control-Max-Age", "86400");
  });

  s.Get("/health", [this](const http::Request&, http::Response& res) {
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
              {"timed_out_connections", http_->timed_out()},
              // Forward passes and the tokens they held: their ratio is the mean batch.
              {"engine_steps", engine_->steps()},
              {"engine_rows", engine_->step_rows()},
              // Bytes malloc has handed out and not got back (all arenas): a leak shows here
              // even when fragmentation hides it from the resident size.
              {"heap_in_use", mallinfo2().uordblks}};
    res.set_content(dump(j), "application/json");
  });
  s.Get("/metrics", [this](const http::Request&, http::Response& res) {
    const SlotQueue::Stats q = queue_.stats();
    MetricsGauges g;
    g.slots_total = q.n_slots, g.slots_busy = q.busy, g.queued = q.waiting, g.queue_limit = q.max_waiting;
    g.rejected = q.rejected;
    g.timed_out = http_->timed_out();
    g.kv_tokens = static_cast<uint64_t>(engine_->kv_tokens());
    g.kv_capacity = static_cast<uint64_t>(engine_->n_ctx()) * static_cast<uint64_t>(engine_->n_seq());
    if (const auto ex = engine_->expert_stats()) {
      g.expert_cache = true;
      g.expert_hits = ex->hits, g.expert_misses = ex->misses, g.expert_bytes_read = ex->bytes_read;
      g.expert_read_seconds = ex->read_seconds;
      g.expert_read_ahead = ex->read_ahead, g.expert_read_ahead_used = ex->read_ahead_used;
    }
    if (const auto mr = engine_->map_read_stats()) {
      g.map_reads = true;
      g.map_read_pages = mr->pages, g.map_read_seconds = mr->seconds;
      g.map_read_rows = mr->rows, g.map_read_kept_rows = mr->kept_rows;
    }
    res.set_content(metrics_.prometheus(g, served_.id), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/", [](const http::Request&, http::Response& res) {
    res.set_content(kChatPageHtml, "text/html; charset=utf-8");
  });
  install_openai_routes();
  install_ollama_routes();
  install_embedding_routes();
  install_responses_routes();
}

}  // namespace ember::server
