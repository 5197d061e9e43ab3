#include "server/connections.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/log.hpp"

namespace ember::server {

namespace {

// The process's descriptors that are sockets, with their inodes.
std::vector<std::pair<int, uint64_t>> socket_fds() {
  std::vector<std::pair<int, uint64_t>> out;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return out;
  const int own = dirfd(d);
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end || fd == own) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    out.push_back({static_cast<int>(fd), static_cast<uint64_t>(st.st_ino)});
  }
  closedir(d);
  return out;
}

// The port of a socket address (IPv4 or IPv6), and its address as text.
int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}
std::string addr_of(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof(buf));
  if (a.ss_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof(buf));
  return buf;
}

// A connected TCP socket's local and peer ports (false for others: the listener, pipes, ...).
bool ports(int fd, sockaddr_storage& local, sockaddr_storage& peer) {
  socklen_t n = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &n) != 0) return false;
  if (local.ss_family != AF_INET && local.ss_family != AF_INET6) return false;
  n = sizeof(peer);
  return getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &n) == 0;
}

uint64_t inode_of(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

const char kTimeoutResponse[] =
    "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 141\r\n\r\n"
    "{\"error\":{\"message\":\"the request did not arrive in time (see --read-timeout)\",\"type\":\"invalid_request_error\","
    "\"param\":null,\"code\":\"timeout\"}}\n";

}  // namespace

Connections::Connections(int port, std::chrono::milliseconds read_timeout) : port_(port), timeout_(read_timeout) {
  thread_ = std::thread([this] { watch(); });
}

Connections::~Connections() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int Connections::find(int local_port, const std::string& remote_addr, int remote_port) {
  for (const auto& [fd, inode] : socket_fds()) {
    sockaddr_storage local{}, peer{};
    if (!ports(fd, local, peer)) continue;
    if (port_of(local) == local_port && port_of(peer) == remote_port && addr_of(peer) == remote_addr) return fd;
  }
  return -1;
}

bool Connections::peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return true;
  if (!(p.revents & POLLIN)) return false;
  char c;  // readable: data (a pipelined request), or the end of the stream
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

Connections::Hold::Hold(Connections& c, int fd) : c_(c), fd_(fd) {
  if (fd_ < 0) return;
  inode_ = inode_of(fd_);
  std::lock_guard<std::mutex> lock(c_.mu_);
  ++c_.seen_[inode_].held;
}

Connections::Hold::~Hold() {
  if (fd_ < 0) return;
  std::lock_guard<std::mutex> lock(c_.mu_);
  Seen& s = c_.seen_[inode_];
  if (--s.held <= 0) s.held = 0, s.since = std::chrono::steady_clock::now();
}

void Connections::mark(int fd, bool answered) {
  if (fd < 0) return;
  const uint64_t inode = inode_of(fd);
  std::lock_guard<std::mutex> lock(mu_);
  Seen& s = seen_[inode];
  s.since = std::chrono::steady_clock::now();
  s.answered = answered;
}
void Connections::request_begins(int fd) { mark(fd, false); }
void Connections::request_ends(int fd) { mark(fd, true); }

uint64_t Connections::timed_out() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timed_out_;
}

void Connections::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(250));
    if (stop_) break;
    lock.unlock();
    sweep();
    lock.lock();
  }
}

void Connections::sweep() {
  const auto now = std::chrono::steady_clock::now();
  std::set<uint64_t> live;
  std::vector<std::pair<int, uint64_t>> due;
  {
    const auto fds = socket_fds();
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [fd, inode] : fds) {
      sockaddr_storage local{}, peer{};
      if (!ports(fd, local, peer) || port_of(local) != port_) continue;
      live.insert(inode);
      auto [it, fresh] = seen_.try_emplace(inode);
      if (fresh) it->second.since = now;
      Seen& s = it->second;
      if (s.held == 0 && !s.closed && now - s.since > timeout_) {
        s.closed = true;
        due.push_back({fd, inode});
      }
    }
    for (auto it = seen_.begin(); it != seen_.end();)  // sockets closed since
      it = live.count(it->first) || it->second.held > 0 ? std::next(it) : seen_.erase(it);
  }
  for (const auto& [fd, inode] : due) {
    // The descriptor may have been closed and reused since it was listed: a duplicate keeps the
    // socket it names, checked by its inode.
    const int d = dup(fd);
    if (d < 0) continue;
    if (inode_of(d) == inode) {
      bool answered = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = seen_.find(inode);
        answered = it != seen_.end() && it->second.answered;
      }
      // A connection in the middle of a request (or that never sent one) is told why; an idle
      // keep-alive one after its answer is just closed (httplib's keep-alive timeout is
      // shorter, so that is rare).
      if (!answered) send(d, kTimeoutResponse, sizeof(kTimeoutResponse) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      shutdown(d, SHUT_RDWR);
      std::lock_guard<std::mutex> lock(mu_);
      ++timed_out_;
    }
    close(d);
  }
  if (!due.empty()) log_info("server: closed {} connection(s) that sent no whole request in {} ms", due.size(), timeout_.count());
}

}  // namespace ember::server
