// What arrives on an HTTP/1.1 connection, as data (no sockets here, so all of it is unit-tested
// and fuzzed): a request's head (its line and headers) and how its body is framed (none, a
// Content-Length, or chunked). Strict where leniency lets a request mean two things to two
// servers (request smuggling behind a proxy): conflicting Content-Lengths, a Content-Length
// beside Transfer-Encoding, folded header lines, a malformed length are refused; a body that
// comes without a length is 411.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace ember::server::http {

constexpr size_t kMaxHeadBytes = 64 * 1024;  // a request's line and headers
constexpr size_t kMaxHeaders = 100;

struct Request {
  std::string method, target, path, query;  // target = path[?query]
  int minor_version = 1;                     // HTTP/1.x
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in order
  std::string body;
  // Filled by the server: the route pattern's captures ([0]: the whole path), the peer, and the
  // connection's socket (peer_closed).
  std::vector<std::string> matches;
  std::string remote_addr;
  int remote_port = 0;
  int fd = -1;

  // The first header of that name (any case), or null.
  const std::string* header(std::string_view name) const;
  std::string get_header_value(std::string_view name) const;
  bool has_header(std::string_view name) const { return header(name) != nullptr; }
  // Whether the connection stays open after the answer (HTTP/1.1 unless "Connection: close",
  // HTTP/1.0 only with "keep-alive").
  bool keep_alive() const;
};

// What was wrong with what a client sent: the status to answer (400, 411, 413, 431, 501, 505) and
// the message, after which the connection is closed.
struct ProtocolError {
  int status = 400;
  std::string message;
};

// One past the blank line that ends the head at the start of `buf`; nullopt while it is
// incomplete. A head longer than kMaxHeadBytes is a 431.
std::variant<std::optional<size_t>, ProtocolError> head_end(std::string_view buf);

// The request line and headers of a complete head (as head_end found it).
std::variant<Request, ProtocolError> parse_head(std::string_view head);

// How the body of `r` is framed. POST, PUT and PATCH need a Content-Length or chunked body
// (else 411); a body over max_body is a 413.
struct BodyFraming {
  enum class Kind { none, length, chunked } kind = Kind::none;
  uint64_t length = 0;
};
std::variant<BodyFraming, ProtocolError> body_framing(const Request& r, size_t max_body);

// A chunked body at the start of `buf`: the decoded data into *body and one past its end (after
// the trailers); nullopt while incomplete. More than max_body bytes of data is a 413.
std::variant<std::optional<size_t>, ProtocolError> decode_chunked(std::string_view buf, size_t max_body,
                                                                 std::string* body);

}  // namespace ember::server::http
