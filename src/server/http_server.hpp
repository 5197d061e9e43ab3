// Ember's HTTP/1.1 server: sockets, connections and routing under the APIs (server.cpp and the
// routes). A connection has a thread of the WorkerPool while it is open; it reads requests one
// after another (keep-alive, pipelined ones in order), each head and body within the read
// timeout (then 408 and closed, so a slow client holds a thread for that long at most), and
// writes each answer whole or as a chunked stream (a route's content provider). What a client
// sends is parsed by http_parse.hpp, strictly: 400, 411, 413, 431, 501 or 505 end the
// connection. Ranges, forms and other HTTP features the APIs do not use are not implemented:
// a Range header is ignored, a body is the bytes its Content-Length counts.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "server/http_parse.hpp"

namespace ember::server {
class WorkerPool;
}

namespace ember::server::http {

// Where a streamed answer writes: each write() is a chunk; done() ends the answer.
class DataSink {
 public:
  virtual ~DataSink() = default;
  virtual bool write(const char* data, size_t n) = 0;  // false once the client is gone
  virtual void done() = 0;
};

struct Response {
  int status = -1;  // unset: 200 once a handler ran
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // A streamed answer (chunked): called until it returns false or calls sink.done(); false
  // before done() cuts the connection off.
  std::function<bool(size_t offset, DataSink& sink)> provider;
  // Why the server itself answered an error (a ProtocolError's message), for the error handler.
  std::string reason;

  void set_content(std::string content, const std::string& content_type);
  void set_header(const std::string& name, std::string value);  // replaces one of that name
  bool has_header(std::string_view name) const;
  std::string get_header_value(std::string_view name) const;
  void set_chunked_content_provider(const std::string& content_type,
                                    std::function<bool(size_t offset, DataSink& sink)> p);
};

// Whether the peer of socket fd has closed its end (pipelined bytes waiting do not count).
bool peer_closed(int fd);

struct ServerOptions {
  size_t max_body = 1 << 20;
  std::chrono::milliseconds read_timeout{10000};   // a whole request, from its first byte
  std::chrono::milliseconds write_timeout{10000};  // each write
  std::chrono::milliseconds keep_alive{5000};      // idle between requests
  size_t base_threads = 16, max_threads = 512;     // WorkerPool: connections served at once
  size_t max_connections = 2048;                   // open at once; more are answered 503
};

class HttpServer {
 public:
  using Handler = std::function<void(const Request&, Response&)>;
  enum class Routing { handled, unhandled };

  explicit HttpServer(const ServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes: `pattern` is a regular expression the whole path must match (captures in
  // Request::matches). GET routes answer HEAD too, without the body.
  void route(const std::string& method, const std::string& pattern, Handler h);
  void Get(const std::string& pattern, Handler h) { route("GET", pattern, std::move(h)); }
  void Post(const std::string& pattern, Handler h) { route("POST", pattern, std::move(h)); }
  void Options(const std::string& pattern, Handler h) { route("OPTIONS", pattern, std::move(h)); }
  // The methods the routes take for `path` ("GET, HEAD, POST": GET brings HEAD; OPTIONS, which
  // answers every path for CORS, is not counted), for 405's Allow; empty where no route takes it.
  std::string allowed_methods(const std::string& path) const;
  // Before routing (handled: answered there); after every answer; for an error answer without a
  // body (no route: 404; a ProtocolError: its status and reason); for a handler's exception.
  void set_pre_routing_handler(std::function<Routing(const Request&, Response&)> h) { pre_ = std::move(h); }
  void set_post_routing_handler(Handler h) { post_ = std::move(h); }
  void set_error_handler(Handler h) { error_ = std::move(h); }
  void set_exception_handler(std::function<void(const Request&, Response&, std::exception_ptr)> h) {
    exception_ = std::move(h);
  }

  // Binds host:port (0: any free port) with SO_REUSEADDR; returns the port. Throws ember::Error
  // naming why it cannot (the port in use, not an address of this machine).
  int bind(const std::string& host, int port);
  // Accepts and serves until stop(); returns once every connection has ended.
  void listen();
  // Stops accepting, wakes idle connections to close them, and makes listen() return once the
  // running handlers have (they look at their own stop flag).
  void stop();

  // Connections closed for not delivering a whole request within the read timeout.
  uint64_t timed_out() const { return timed_out_.load(); }

 private:
  struct Route {
    std::string method;
    std::regex pattern;
    Handler handler;
  };
  // A connection's requests, one serve_one at a time, then its close.
  void serve(int fd, std::string remote_addr, int remote_port);
  // Reads, routes and answers one request; false when the connection is to close.
  bool serve_one(int fd, std::string& buf, bool first, const std::string& remote_addr, int remote_port);
  // Routes a parsed request into res (pre-routing, the route or 404, the error handler).
  void dispatch(Request& req, Response& res);
  // Writes an answer (whole or streamed); false when the connection must close.
  bool respond(int fd, const Request& req, Response& res, bool keep_alive);
  // Answers a ProtocolError (the error handler's body); false: the connection is to close.
  bool refuse(int fd, const ProtocolError& e);

  ServerOptions opts_;
  std::vector<Route> routes_;
  std::function<Routing(const Request&, Response&)> pre_;
  Handler post_, error_;
  std::function<void(const Request&, Response&, std::exception_ptr)> exception_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> timed_out_{0};
  std::unique_ptr<WorkerPool> pool_;
  std::mutex mu_;
  std::set<int> open_;  // connections' sockets, to wake at stop()
};

}  // namespace ember::server::http
