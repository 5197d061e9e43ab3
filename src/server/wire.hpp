// A wire format: how one API spells an admitted request's answer, whole or as a stream.
// Server::drive (drive.cpp) takes every generating route (OpenAI's completions, Ollama's chat
// and generate, OpenAI's Responses) through the same steps: admit, wait for a sequence, generate,
// hold back text that may be a tool call (HeldToolText), end the answer or cut it off at
// shutdown, count it. A Wire only writes what each step produces; the routes parse and prepare.
// One Wire serves one request (it may keep the stream's state: an event counter, logprobs
// waiting for their text).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "server/api.hpp"
#include "server/tool_calls.hpp"

namespace ember::server {

namespace http {
struct Response;
}

// One choice of a whole answer: its request, what it generated and how it ended.
struct WholeChoice {
  const PreparedRequest* prep = nullptr;
  ToolOutput out;                      // the text, read for tool calls where the request offers tools
  std::vector<TokenLogprobs> logprobs;
  GenerateResult result;
};

class Wire {
 public:
  using Write = std::function<bool(const std::string&)>;  // false: the client is gone
  virtual ~Wire() = default;

  // An error answered as a whole response (before a stream starts, or instead of a whole answer).
  virtual void error(http::Response& res, const ApiError& e) const = 0;
  // The prefix of the ids of the calls read from this answer.
  virtual std::string call_id_prefix() const = 0;
  // A whole answer: the choices in order.
  virtual void whole(http::Response& res, const std::vector<WholeChoice>& choices) const = 0;

  // A stream: its content type; whether it waits for a sequence by writing comments (server-sent
  // events) or by watching the connection (NDJSON has no comments).
  virtual const char* stream_type() const = 0;
  virtual bool waits_by_comments() const = 0;
  // Its opening (role, echoed prompt, created events); false: the client is gone.
  virtual bool begin(const Write&) { return true; }
  // A sampled token's log-probabilities, before the text holding it.
  virtual void logprobs(const TokenLogprobs&) {}
  // Content (never empty).
  virtual bool text(const Write& w, const std::string& piece) = 0;
  // The end: the held-back text that was no call (`rest`, maybe empty), the calls, the finish.
  virtual bool end(const Write& w, const GenerateResult& r, const std::string& rest,
                   const std::vector<ToolCall>& calls) = 0;
  // The event that ends a stream with an error (the stream's whole answer is then that error).
  virtual std::string error_event(const ApiError& e) = 0;
};

}  // namespace ember::server
