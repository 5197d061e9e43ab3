// What the server knows of its clients' connections beyond what cpp-httplib (Debian 12's 0.11)
// tells a handler, which is the request's addresses and not its socket:
//   - the socket a request arrived on, found by its addresses among the process's descriptors
//     (find), so that a handler can ask whether the client has hung up (peer_closed) while it
//     generates an answer nobody would read;
//   - a watchdog: a connection that has not delivered a whole request within the read timeout
//     (a client sending a header line every half second, a body shorter than its Content-Length)
//     gets 408 and is shut down, so that slow clients cannot hold every worker thread. A handler
//     holds its connection (hold) while it runs; an idle keep-alive connection counts from its
//     last answer.
// Descriptors are never used after they may have been reused: the watchdog dup()s a socket and
// checks its inode before it writes or shuts down.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace ember::server {

class Connections {
 public:
  // port: the server's own (connections to other ports are not looked at).
  Connections(int port, std::chrono::milliseconds read_timeout);
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  // The descriptor of this process's TCP socket with these addresses, or -1.
  static int find(int local_port, const std::string& remote_addr, int remote_port);
  // Whether the peer of socket fd has closed its end (or the socket is gone).
  static bool peer_closed(int fd);

  // A request's connection, held from here to the end of its handling (the watchdog leaves it
  // alone, and counts its idleness from the release on).
  class Hold {
   public:
    Hold(Connections& c, int fd);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    int fd() const { return fd_; }
    bool peer_closed() const { return fd_ >= 0 && Connections::peer_closed(fd_); }

   private:
    Connections& c_;
    int fd_;
    uint64_t inode_ = 0;
  };

  // A request's head arrived on socket fd (its body may still come), and its answer was given:
  // the watchdog's clock starts again at each; between the two it answers 408, after the
  // second it just closes an idle connection.
  void request_begins(int fd);
  void request_ends(int fd);
  // Connections the watchdog closed so far.
  uint64_t timed_out() const;

 private:
  struct Seen {
    std::chrono::steady_clock::time_point since;  // first seen, or last released
    int held = 0;
    bool answered = false;  // its last request was answered (idle since)
    bool closed = false;    // shut down by the watchdog
  };
  void watch();
  void sweep();
  void mark(int fd, bool answered);

  const int port_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Seen> seen_;  // by socket inode
  uint64_t timed_out_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ember::server
