#include "server/http_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "server/worker_pool.hpp"

namespace ember::server::http {

namespace {

using Clock = std::chrono::steady_clock;

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
  }
}

int ms_until(Clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

// Sends all of `data` (each wait for room bounded by `timeout`); false when the peer is gone or
// too slow.
bool send_all(int fd, std::string_view data, std::chrono::milliseconds timeout) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
  }
  return true;
}

// Reads what is there into buf, waiting until `deadline`: > 0 bytes read, 0 the peer closed,
// -1 the deadline passed (or an error).
ssize_t read_some(int fd, std::string& buf, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, ms_until(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    char chunk[65536];
    const ssize_t n = recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n > 0) {
      buf.append(chunk, static_cast<size_t>(n));
      return n;
    }
    if (n == 0) return 0;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 0;
    if (Clock::now() >= deadline) return -1;
  }
}

// Closes after the last answer: the write side first, then what the client still sends is read
// and dropped for a moment, so that the answer is not lost to a reset (a 413 while the client is
// still sending its body).
void close_gracefully(int fd) {
  shutdown(fd, SHUT_WR);
  const auto until = Clock::now() + std::chrono::milliseconds(500);
  std::string sink;
  for (size_t drained = 0; drained < (4u << 20);) {
    sink.clear();
    const ssize_t n = read_some(fd, sink, until);
    if (n <= 0) break;
    drained += static_cast<size_t>(n);
  }
  close(fd);
}

// A chunked answer's sink (HTTP/1.0: the bytes as they are, the connection's end ends them).
class ChunkSink final : public DataSink {
 public:
  ChunkSink(int fd, bool chunked, std::chrono::milliseconds timeout) : fd_(fd), chunked_(chunked), timeout_(timeout) {}
  bool write(const char* data, size_t n) override {
    if (failed_ || done_) return false;
    if (n == 0) return true;
    std::string out = chunked_ ? fmt::format("{:x}\r\n", n) : std::string();
    out.append(data, n);
    if (chunked_) out += "\r\n";
    failed_ = !send_all(fd_, out, timeout_);
    written_ += n;
    return !failed_;
  }
  void done() override {
    if (done_ || failed_) return;
    done_ = true;
    if (chunked_) failed_ = !send_all(fd_, "0\r\n\r\n", timeout_);
  }
  bool is_done() const { return done_; }
  bool failed() const { return failed_; }
  size_t written() const { return written_; }

 private:
  int fd_;
  bool chunked_;
  std::chrono::milliseconds timeout_;
  bool done_ = false, failed_ = false;
  size_t written_ = 0;
};

std::string address_of(const sockaddr_storage& a, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, buf, sizeof buf);
    *port = ntohs(in.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof buf);
    *port = ntohs(in6.sin6_port);
  }
  return buf;
}

}  // namespace

// ---- Response ------------------------------------------------------------------------------------

void Response::set_content(std::string content, const std::string& content_type) {
  body = std::move(content);
  set_header("Content-Type", content_type);
}

void Response::set_header(const std::string& name, std::string value) {
  for (auto& [k, v] : headers)
    if (strcasecmp(k.c_str(), name.c_str()) == 0) {
      v = std::move(value);
      return;
    }
  headers.emplace_back(name, std::move(value));
}

bool Response::has_header(std::string_view name) const {
  return std::any_of(headers.begin(), headers.end(), [&](const auto& h) {
    return h.first.size() == name.size() && strncasecmp(h.first.c_str(), name.data(), name.size()) == 0;
  });
}

std::string Response::get_header_value(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k.size() == name.size() && strncasecmp(k.c_str(), name.data(), name.size()) == 0) return v;
  return {};
}

void Response::set_chunked_content_provider(const std::string& content_type,
                                            std::function<bool(size_t, DataSink&)> p) {
  set_header("Content-Type", content_type);
  provider = std::move(p);
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return true;
  if (!(p.revents & POLLIN)) return false;
  char c;  // readable: data (a pipelined request), or the end of the stream
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// ---- HttpServer ----------------------------------------------------------------------------------

HttpServer::HttpServer(const ServerOptions& options) : opts_(options) {}

HttpServer::~HttpServer() {
  stop();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void HttpServer::route(const std::string& method, const std::string& pattern, Handler h) {
  routes_.push_back({method, std::regex(pattern), std::move(h)});
}

std::string HttpServer::allowed_methods(const std::string& path) const {
  bool get = false, post = false;
  for (const Route& r : routes_) {
    if ((r.method != "GET" && r.method != "POST") || !std::regex_match(path, r.pattern)) continue;
    get = get || r.method == "GET";
    post = post || r.method == "POST";
  }
  std::string allow = get ? "GET, HEAD" : "";
  if (post) allow += allow.empty() ? "POST" : ", POST";
  return allow;
}

int HttpServer::bind(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    fail("cannot listen on {}:{}: the host is not an address of this machine", host, port);
  int err = 0;
  for (addrinfo* a = res; a && listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR only (not SO_REUSEPORT, which would let a second server share the port): a
    // restart binds at once over connections in TIME_WAIT, a busy port is an error.
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 512) == 0) {
      listen_fd_ = fd;
    } else {
      err = errno;
      close(fd);
    }
  }
  freeaddrinfo(res);
  EMBER_CHECK(err != EADDRINUSE || listen_fd_ >= 0, "cannot listen on {}:{}: the port is in use (another server, an "
              "`ember serve` perhaps, holds it); stop it or choose another with --port", host, port);
  EMBER_CHECK(listen_fd_ >= 0, "cannot listen on {}:{}: {} (is the host an address of this machine?)", host, port,
              std::strerror(err));
  sockaddr_storage bound{};
  socklen_t n = sizeof bound;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &n);
  int bound_port = port;
  address_of(bound, &bound_port);
  return bound_port;
}

void HttpServer::listen() {
  EMBER_CHECK(listen_fd_ >= 0, "HttpServer::listen before bind");
  pool_ = std::make_unique<WorkerPool>(opts_.base_threads, opts_.max_threads);
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    sockaddr_storage peer{};
    socklen_t n = sizeof peer;
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &n, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int yes = 1;
    // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm and delayed ACKs
    // hold them back by up to 40 ms.
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    int port = 0;
    std::string addr = address_of(peer, &port);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (open_.size() >= opts_.max_connections) {
        static constexpr std::string_view kFull =
            "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\nRetry-After: 1\r\n\r\n";
        send(fd, kFull.data(), kFull.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        close(fd);
        continue;
      }
      open_.insert(fd);
    }
    pool_->enqueue([this, fd, addr = std::move(addr), port] { serve(fd, addr, port); });
  }
  close(listen_fd_);
  listen_fd_ = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : open_) shutdown(fd, SHUT_RD);  // idle connections wake and close
  }
  pool_->shutdown();  // the running handlers end on their own (their stop flags)
  pool_.reset();
}

void HttpServer::stop() { stopping_ = true; }

void HttpServer::serve(int fd, std::string remote_addr, int remote_port) {
  std::string buf;
  for (bool first = true; !stopping_ && serve_one(fd, buf, first, remote_addr, remote_port); first = false) {
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_.erase(fd);
  }
  close_gracefully(fd);
}

bool HttpServer::serve_one(int fd, std::string& buf, bool first, const std::string& remote_addr, int remote_port) {
  // The head: a new connection has the read timeout for its first request; between requests an
  // idle connection waits for keep_alive, and a request that has begun has the read timeout.
  Clock::time_point deadline = Clock::now() + (first || !buf.empty() ? opts_.read_timeout : opts_.keep_alive);
  bool begun = first || !buf.empty();
  const auto timed_out = [&] {
    ++timed_out_;
    return refuse(fd, {408, "the request did not arrive in time (see --read-timeout)"});
  };
  size_t head_len = 0;
  for (;;) {
    auto end = head_end(buf);
    if (auto* e = std::get_if<ProtocolError>(&end)) return refuse(fd, *e);
    if (const auto& at = std::get<std::optional<size_t>>(end)) {
      head_len = *at;
      break;
    }
    const ssize_t n = read_some(fd, buf, deadline);
    if (n == 0 || (n < 0 && !begun) || stopping_) return false;
    if (n < 0) return timed_out();
    if (!begun) begun = true, deadline = Clock::now() + opts_.read_timeout;
  }
  auto parsed = parse_head(std::string_view(buf).substr(0, head_len));
  if (auto* e = std::get_if<ProtocolError>(&parsed)) return refuse(fd, *e);
  Request req = std::move(std::get<Request>(parsed));
  req.remote_addr = remote_addr;
  req.remote_port = remote_port;
  req.fd = fd;
  auto framing = body_framing(req, opts_.max_body);
  if (auto* e = std::get_if<ProtocolError>(&framing)) return refuse(fd, *e);
  const BodyFraming f = std::get<BodyFraming>(framing);
  buf.erase(0, head_len);
  // The body, within the same deadline as its head ("Expect: 100-continue" answered first).
  bool tell_continue =
      f.kind != BodyFraming::Kind::none && strcasecmp(req.get_header_value("expect").c_str(), "100-continue") == 0;
  while (f.kind != BodyFraming::Kind::none) {
    size_t used = 0;
    if (f.kind == BodyFraming::Kind::length && buf.size() >= f.length) {
      req.body = buf.substr(0, f.length);
      used = f.length;
    } else if (f.kind == BodyFraming::Kind::chunked) {
      auto done = decode_chunked(buf, opts_.max_body, &req.body);
      if (auto* e = std::get_if<ProtocolError>(&done)) return refuse(fd, *e);
      if (const auto& at = std::get<std::optional<size_t>>(done)) used = *at;
    }
    if (used) {
      buf.erase(0, used);
      break;
    }
    if (tell_continue && !send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", opts_.write_timeout)) return false;
    tell_continue = false;
    const ssize_t n = read_some(fd, buf, deadline);
    if (n == 0 || stopping_) return false;
    if (n < 0) return timed_out();
  }
  Response res;
  dispatch(req, res);
  const bool keep = req.keep_alive() && !stopping_;
  return respond(fd, req, res, keep) && keep;
}

void HttpServer::dispatch(Request& req, Response& res) {
  try {
    bool handled = pre_ && pre_(req, res) == Routing::handled;
    for (size_t i = 0; i < routes_.size() && !handled; ++i) {
      const Route& r = routes_[i];
      if (r.method != req.method && !(req.method == "HEAD" && r.method == "GET")) continue;
      std::smatch m;
      if (!std::regex_match(req.path, m, r.pattern)) continue;
      req.matches.assign(m.begin(), m.end());
      r.handler(req, res);
      handled = true;
      if (res.status < 0) res.status = 200;
    }
    if (!handled) res.status = 404;
    if (res.status < 0) res.status = 200;
  } catch (...) {
    res = Response();
    res.status = 500;
    if (exception_) exception_(req, res, std::current_exception());
  }
  if (res.status >= 400 && res.body.empty() && !res.provider && error_) error_(req, res);
  if (post_) post_(req, res);
}

bool HttpServer::respond(int fd, const Request& req, Response& res, bool keep_alive) {
  const bool head_only = req.method == "HEAD";
  const bool stream = res.provider && !head_only;
  const bool chunked = stream && req.minor_version >= 1;
  if (stream && !chunked) keep_alive = false;  // HTTP/1.0: the end of the connection ends the body
  std::string out = fmt::format("HTTP/1.{} {} {}\r\n", req.minor_version >= 1 ? 1 : 0, res.status, reason_phrase(res.status));
  for (const auto& [k, v] : res.headers) {
    if (strcasecmp(k.c_str(), "content-length") == 0 || strcasecmp(k.c_str(), "transfer-encoding") == 0 ||
        strcasecmp(k.c_str(), "connection") == 0)
      continue;
    out += k + ": " + v + "\r\n";
  }
  if (chunked) out += "Transfer-Encoding: chunked\r\n";
  else if (!stream) out += fmt::format("Content-Length: {}\r\n", res.body.size());
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  if (!stream && !head_only) out += res.body;
  if (!send_all(fd, out, opts_.write_timeout)) return false;
  if (!stream) return true;
  ChunkSink sink(fd, chunked, opts_.write_timeout);
  while (!sink.is_done() && !sink.failed()) {
    const size_t before = sink.written();
    if (!res.provider(before, sink) || sink.written() == before) break;  // (a provider that writes nothing: cut)
  }
  return sink.is_done() && !sink.failed() && keep_alive;
}

bool HttpServer::refuse(int fd, const ProtocolError& e) {
  Request req;
  req.fd = fd;
  Response res;
  res.status = e.status;
  res.reason = e.message;
  if (error_) error_(req, res);
  if (post_) post_(req, res);
  respond(fd, req, res, false);
  return false;
}

}  // namespace ember::server::http
