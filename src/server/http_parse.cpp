#include "server/http_parse.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace ember::server::http {

namespace {

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y)); });
}

// RFC 9110's tchar: what a method or a header name is made of.
bool token_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  return std::isalnum(u) || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_token(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), token_char); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The next line of `s` from *pos (CRLF or a bare LF ends it), without its end.
std::optional<std::string_view> next_line(std::string_view s, size_t* pos) {
  const size_t nl = s.find('\n', *pos);
  if (nl == std::string_view::npos) return std::nullopt;
  std::string_view line = s.substr(*pos, nl - *pos);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  *pos = nl + 1;
  return line;
}

ProtocolError bad(std::string message) { return {400, std::move(message)}; }

// 1*DIGIT, at most 19 of them (no sign, no spaces, no list).
std::optional<uint64_t> decimal(std::string_view s) {
  if (s.empty() || s.size() > 19 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  uint64_t v = 0;
  for (char c : s) v = v * 10 + static_cast<uint64_t>(c - '0');
  return v;
}

}  // namespace

const std::string* Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (same_name(k, name)) return &v;
  return nullptr;
}

std::string Request::get_header_value(std::string_view name) const {
  const std::string* v = header(name);
  return v ? *v : std::string();
}

bool Request::keep_alive() const {
  const std::string c = get_header_value("connection");
  if (same_name(c, "close")) return false;
  return minor_version >= 1 || same_name(c, "keep-alive");
}

std::variant<std::optional<size_t>, ProtocolError> head_end(std::string_view buf) {
  // Blank lines before a request line are skipped (RFC 9112 2.2); the head ends at the first
  // empty line after it.
  size_t pos = 0;
  bool started = false;
  while (pos <= kMaxHeadBytes) {
    const auto line = next_line(buf, &pos);
    if (!line) break;
    if (!line->empty()) started = true;
    else if (started) return std::optional<size_t>(pos);
  }
  if (buf.size() > kMaxHeadBytes)
    return ProtocolError{431, fmt::format("the request's head is longer than {} bytes", kMaxHeadBytes)};
  return std::optional<size_t>();
}

std::variant<Request, ProtocolError> parse_head(std::string_view head) {
  Request r;
  size_t pos = 0;
  std::optional<std::string_view> line;
  do line = next_line(head, &pos);
  while (line && line->empty());
  if (!line) return bad("no request line");
  // METHOD SP target SP HTTP/1.x
  const size_t sp1 = line->find(' '), sp2 = line->rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) return bad("a malformed request line");
  const std::string_view method = line->substr(0, sp1), target = line->substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line->substr(sp2 + 1);
  if (!is_token(method)) return bad("a malformed method");
  if (version.size() != 8 || version.substr(0, 7) != "HTTP/1." || (version[7] != '0' && version[7] != '1'))
    return ProtocolError{505, fmt::format("HTTP version '{}' is not supported (HTTP/1.0 and 1.1 are)",
                                          std::string(version.substr(0, 16)))};
  if (target.empty() || target.find(' ') != std::string_view::npos ||
      std::any_of(target.begin(), target.end(), [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; }))
    return bad("a malformed request target");
  r.method = std::string(method);
  r.minor_version = version[7] - '0';
  r.target = std::string(target);
  std::string_view path = target;
  if (path.rfind("http://", 0) == 0 || path.rfind("https://", 0) == 0) {  // absolute form: its path
    const size_t slash = path.find('/', path.find("//") + 2);
    path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
  }
  if (path != "*" && path.front() != '/') return bad("a request target must be a path");
  const size_t q = path.find('?');
  r.path = std::string(path.substr(0, q));
  if (q != std::string_view::npos) r.query = std::string(path.substr(q + 1));

  while ((line = next_line(head, &pos)) && !line->empty()) {
    if (line->front() == ' ' || line->front() == '\t') return bad("a folded header line (obsolete line folding)");
    const size_t colon = line->find(':');
    if (colon == std::string_view::npos) return bad("a header line without ':'");
    const std::string_view name = line->substr(0, colon);
    if (!is_token(name)) return bad("a malformed header name");  // (a space before ':' too)
    const std::string_view value = trim(line->substr(colon + 1));
    if (std::any_of(value.begin(), value.end(), [](char c) { return c == '\0' || c == '\r' || c == '\n'; }))
      return bad("a control character in a header value");
    if (r.headers.size() >= kMaxHeaders)
      return ProtocolError{431, fmt::format("more than {} header lines", kMaxHeaders)};
    std::string lower(name);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers.emplace_back(std::move(lower), std::string(value));
  }
  return r;
}

std::variant<BodyFraming, ProtocolError> body_framing(const Request& r, size_t max_body) {
  BodyFraming f;
  std::optional<uint64_t> length;
  bool chunked = false;
  for (const auto& [name, value] : r.headers) {
    if (name == "content-length") {
      const auto v = decimal(value);
      if (!v) return bad(fmt::format("Content-Length must be a decimal number of bytes, got '{}'", value.substr(0, 24)));
      if (length && *length != *v) return bad("two different Content-Length headers");
      length = v;
    } else if (name == "transfer-encoding") {
      if (chunked || !same_name(trim(value), "chunked"))
        return ProtocolError{501, fmt::format("Transfer-Encoding '{}' is not supported (only chunked)", value.substr(0, 24))};
      chunked = true;
    }
  }
  if (chunked && length) return bad("both Content-Length and Transfer-Encoding");
  if (chunked) {
    f.kind = BodyFraming::Kind::chunked;
    return f;
  }
  if (length) {
    if (*length > max_body)
      return ProtocolError{413, fmt::format("the request body has {} bytes, more than {} (see --max-body)", *length, max_body)};
    f.kind = *length ? BodyFraming::Kind::length : BodyFraming::Kind::none;
    f.length = *length;
    return f;
  }
  if (r.method == "POST" || r.method == "PUT" || r.method == "PATCH")
    return ProtocolError{411, fmt::format("a {} needs a Content-Length header (or a chunked body)", r.method)};
  return f;
}

std::variant<std::optional<size_t>, ProtocolError> decode_chunked(std::string_view buf, size_t max_body,
                                                                 std::string* body) {
  body->clear();
  size_t pos = 0;
  for (;;) {
    const auto line = next_line(buf, &pos);
    if (!line) return std::optional<size_t>();
    const std::string_view size_text = trim(line->substr(0, line->find(';')));  // (extensions ignored)
    if (size_text.empty() || size_text.size() > 15 ||
        !std::all_of(size_text.begin(), size_text.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
      return bad("a malformed chunk size");
    const uint64_t n = std::stoull(std::string(size_text), nullptr, 16);
    if (n > max_body - body->size())
      return ProtocolError{413, fmt::format("the request body has more than {} bytes (see --max-body)", max_body)};
    if (n == 0) {  // the last chunk, then trailers up to an empty line
      for (;;) {
        const auto trailer = next_line(buf, &pos);
        if (!trailer) return std::optional<size_t>();
        if (trailer->empty()) return std::optional<size_t>(pos);
      }
    }
    if (buf.size() - pos < n + 1) return std::optional<size_t>();
    body->append(buf.substr(pos, n));
    pos += n;
    if (buf[pos] == '\r') ++pos;
    if (pos >= buf.size()) return std::optional<size_t>();
    if (buf[pos] != '\n') return bad("a chunk not followed by its line end");
    ++pos;
  }
}

}  // namespace ember::server::http
