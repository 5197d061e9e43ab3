// The server's HTTP/1.1 parsing (server/http_parse.hpp), without sockets: heads, body framing and
// chunked bodies, each refusal with its status; what a hostile client sent in issue 51 (no
// Content-Length, a negative or 20-digit one, two that differ, a length beside chunked); and
// random bytes and mutations of valid requests, which parse or are refused, never crash.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "server/http_parse.hpp"

using namespace ember::server::http;

namespace {

Request head_of(const std::string& text) {
  auto r = parse_head(text);
  if (auto* e = std::get_if<ProtocolError>(&r)) ADD_FAILURE() << text << " -> " << e->status << " " << e->message;
  return std::holds_alternative<Request>(r) ? std::get<Request>(r) : Request{};
}

int refused(const std::string& text) {
  auto r = parse_head(text);
  return std::holds_alternative<ProtocolError>(r) ? std::get<ProtocolError>(r).status : 0;
}

int framing_status(const std::string& head, size_t max_body = 1000) {
  const auto f = body_framing(head_of(head), max_body);
  return std::holds_alternative<ProtocolError>(f) ? std::get<ProtocolError>(f).status : 0;
}

}  // namespace

TEST(HttpParse, HeadsEndAtTheirBlankLine) {
  const auto end = [](const std::string& buf) {
    auto e = head_end(buf);
    return std::holds_alternative<ProtocolError>(e) ? -std::get<ProtocolError>(e).status
                                                     : static_cast<int>(std::get<std::optional<size_t>>(e).value_or(0));
  };
  EXPECT_EQ(end("GET / HTTP/1.1\r\nHost: x\r\n"), 0);  // incomplete
  EXPECT_EQ(end("GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"), 27);
  EXPECT_EQ(end("GET / HTTP/1.1\nHost: x\n\nnext"), 24);  // bare line feeds
  EXPECT_EQ(end("\r\n\r\nGET / HTTP/1.1\r\n\r\n"), 22);    // blank lines before the request line skipped
  EXPECT_EQ(end("GET / HTTP/1.1\r\nX: " + std::string(kMaxHeadBytes, 'a')), -431);
  EXPECT_EQ(end(std::string(kMaxHeadBytes + 10, '\n')), -431);
}

TEST(HttpParse, RequestLineAndHeaders) {
  const Request r = head_of("POST /v1/chat?stream=1 HTTP/1.1\r\nHost: a\r\nContent-TYPE:  application/json \r\n\r\n");
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.path, "/v1/chat");
  EXPECT_EQ(r.query, "stream=1");
  EXPECT_EQ(r.get_header_value("content-type"), "application/json");
  EXPECT_EQ(r.headers[1].first, "content-type");
  EXPECT_TRUE(r.keep_alive());
  EXPECT_FALSE(head_of("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive());
  EXPECT_FALSE(head_of("GET / HTTP/1.0\r\n\r\n").keep_alive());
  EXPECT_TRUE(head_of("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive());
  EXPECT_EQ(head_of("GET http://host:8080/health?x HTTP/1.1\r\n\r\n").path, "/health");  // absolute form
  EXPECT_EQ(refused("GET / HTTP/1.1\r\nX: a\r\n  folded\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET / HTTP/1.1\r\nX : a\r\n\r\n"), 400);  // a space before ':'
  EXPECT_EQ(refused("GET / HTTP/1.1\r\nno colon\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(refused("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 505);
  EXPECT_EQ(refused("GET relative HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(refused("G(T / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET /a\x01 HTTP/1.1\r\n\r\n"), 400);
  std::string many = "GET / HTTP/1.1\r\n";
  for (size_t i = 0; i <= kMaxHeaders; ++i) many += "X: 1\r\n";
  EXPECT_EQ(refused(many + "\r\n"), 431);
}

// The framing a hostile client probed: a body needs a length (411), a length is digits only, two
// lengths must agree, and a length never stands beside chunked (request smuggling).
TEST(HttpParse, BodyFramingIsStrict) {
  const auto f = body_framing(head_of("POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n"), 100);
  ASSERT_TRUE(std::holds_alternative<BodyFraming>(f));
  EXPECT_EQ(std::get<BodyFraming>(f).kind, BodyFraming::Kind::length);
  EXPECT_EQ(std::get<BodyFraming>(f).length, 12u);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\nContent-Length: 7\r\ncontent-length: 7\r\n\r\n"), 0);
  EXPECT_EQ(framing_status("GET / HTTP/1.1\r\n\r\n"), 0);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), 0);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), 0);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\n\r\n"), 411);
  EXPECT_EQ(framing_status("PUT / HTTP/1.1\r\n\r\n"), 411);
  for (const char* bad : {"-1", "abc", "12345678901234567890", "1, 1", "+5", "0x10", ""})
    EXPECT_EQ(framing_status(std::string("POST / HTTP/1.1\r\nContent-Length: ") + bad + "\r\n\r\n"), 400) << bad;
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\nContent-Length: 7\r\nContent-Length: 8\r\n\r\n"), 400);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\nContent-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), 501);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), 501);
  EXPECT_EQ(framing_status("POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 1000), 413);
}

TEST(HttpParse, ChunkedBodies) {
  const auto decode = [](const std::string& buf, size_t max, std::string* body) -> long {
    auto r = decode_chunked(buf, max, body);
    if (auto* e = std::get_if<ProtocolError>(&r)) return -e->status;
    return static_cast<long>(std::get<std::optional<size_t>>(r).value_or(0));
  };
  std::string body;
  const std::string whole = "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
  EXPECT_EQ(decode(whole, 100, &body), static_cast<long>(whole.size() - 4));
  EXPECT_EQ(body, "hello world");
  for (size_t cut = 0; cut < whole.size() - 4; ++cut) EXPECT_EQ(decode(whole.substr(0, cut), 100, &body), 0) << cut;
  EXPECT_EQ(decode("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", 10, &body), -413);
  EXPECT_EQ(decode("zz\r\nhello\r\n0\r\n\r\n", 100, &body), -400);
  EXPECT_EQ(decode("5\r\nhelloXX0\r\n\r\n", 100, &body), -400);
  EXPECT_EQ(decode("ffffffffffffffffff\r\n", 100, &body), -400);
}

// Random bytes, and random edits of a valid request: each parses or is refused with a status.
TEST(HttpParse, RandomInputNeverCrashes) {
  std::mt19937 rng(51);
  const std::string base =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n0\r\n\r\n";
  const std::string alphabet = "\r\n :;-0123456789abcdefHTP/.\t\x01\xff";
  for (int i = 0; i < 20000; ++i) {
    std::string s = base;
    for (int e = 1 + static_cast<int>(rng() % 4); e > 0; --e) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: s.erase(at, rng() % 8); break;
        default: s.insert(at, s.substr(rng() % s.size(), rng() % 8)); break;
      }
    }
    auto end = head_end(s);
    if (auto* at = std::get_if<std::optional<size_t>>(&end); at && *at) {
      auto r = parse_head(s.substr(0, **at));
      if (auto* req = std::get_if<Request>(&r)) {
        (void)body_framing(*req, 1000);
        std::string body;
        (void)decode_chunked(s.substr(**at), 1000, &body);
      }
    }
  }
}
