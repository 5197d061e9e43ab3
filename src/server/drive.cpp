// The steps every generating route takes (server/wire.hpp): admit, wait for a sequence,
// generate, the tool-call holdback, the end or the cut at shutdown; whole answers and streams.
#include <memory>
#include <optional>

#include "server/http_server.hpp"
#include "server/routes_common.hpp"
#include "server/server.hpp"
#include "server/wire.hpp"

namespace ember::server {

std::variant<GenerateResult, ApiError> Server::generate_text(int slot, const PreparedRequest& prep,
                                                             std::chrono::steady_clock::time_point arrived, std::string& text,
                                                             const LogprobCallback& logprobs,
                                                             const std::function<bool()>& gone) {
  try {
    return generate(
        slot, prep, arrived,
        [&](std::string_view piece) {
          text.append(piece);
          return !stopping_.load();
        },
        logprobs, gone);
  } catch (const std::exception& e) {
    return failed(e);
  }
}

int Server::wait_for_stream_sequence(std::unique_ptr<SlotQueue::Ticket>& held, http::DataSink& sink, Wire& wire,
                                     int fd, bool& provider_result) {
  const auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
  // A comment every half second finds a client that went away (a write to a closed connection
  // fails); without comments, its connection says so.
  const int slot = wire.waits_by_comments()
                       ? wait_for_sequence(*held, [&] { return !write(": waiting for a free session\n\n"); },
                                           std::chrono::milliseconds(500))
                       : wait_for_sequence(*held, [&] { return http::peer_closed(fd); }, std::chrono::milliseconds(500));
  if (slot >= 0) return slot;
  held.reset();
  provider_result = stopping_ || draining_;
  if (!provider_result) ++n_cancelled_;
  else if (write(wire.error_event(shutting_down_error()))) sink.done();  // a whole response: its error
  return -1;
}

void Server::drive(const http::Request& req, http::Response& res, std::shared_ptr<Wire> wire,
                   std::vector<std::shared_ptr<const PreparedRequest>> choices, bool stream,
                   std::chrono::steady_clock::time_point arrived) {
  std::unique_ptr<SlotQueue::Ticket> ticket = admit(choices.front());
  if (!ticket) return wire->error(res, busy_error());
  const int fd = req.fd;  // the request's connection: a client that hangs up is seen there

  if (!stream) {  // several choices (completions' prompts) run in turn on one sequence
    const int slot = wait_for_sequence(*ticket, [&] { return http::peer_closed(fd); }, std::chrono::milliseconds(250));
    if (slot < 0) {
      if (http::peer_closed(fd)) ++n_cancelled_;  // (a client that left reads nothing)
      return wire->error(res, shutting_down_error());
    }
    std::vector<WholeChoice> whole;
    for (const auto& prep : choices) {
      WholeChoice c;
      c.prep = prep.get();
      std::string text;
      const auto done = generate_text(
          slot, *prep, arrived, text, [&](const TokenLogprobs& t) { c.logprobs.push_back(t); },
          [&] { return http::peer_closed(fd); });
      if (const auto* e = std::get_if<ApiError>(&done)) return wire->error(res, *e);
      c.result = std::get<GenerateResult>(done);
      // Cut off by shutdown: an error, never a 200 that looks complete.
      if (cut_by_shutdown(c.result)) return wire->error(res, cut_off_error(c.result.n_generated));
      c.out = prep->tools ? parse_tool_output(prep->tool_format, *prep->tools, text, wire->call_id_prefix())
                          : ToolOutput{std::move(text), {}};
      whole.push_back(std::move(c));
    }
    ticket.reset();
    return wire->whole(res, whole);
  }

  // The provider may be copied; the ticket lives in one shared place so that releasing it from
  // any copy frees the sequence.
  auto held = std::make_shared<std::unique_ptr<SlotQueue::Ticket>>(std::move(ticket));
  std::shared_ptr<const PreparedRequest> prep = choices.front();
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(wire->stream_type(), [this, held, wire, prep, arrived, fd](size_t, http::DataSink& sink) {
    if (!*held) return false;  // already ran
    const Wire::Write write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
    bool waited = false;
    const int slot = wait_for_stream_sequence(*held, sink, *wire, fd, waited);
    if (slot < 0) return waited;
    try {
      if (!wire->begin(write)) {
        ++n_cancelled_;
        held->reset();
        return false;
      }
      // With tools, text that may be a call waits (server/tool_calls.hpp): all of it where the
      // call is forced, from where one may start otherwise; the end decides.
      std::optional<HeldToolText> held_text;
      if (prep->tools) held_text.emplace(prep->tool_format, *prep->tools);
      const GenerateResult r = generate(
          slot, *prep, arrived,
          [&](std::string_view piece) {
            if (stopping_.load()) return false;
            const std::string out = held_text ? held_text->add(piece) : std::string(piece);
            return out.empty() || wire->text(write, out);
          },
          [&](const TokenLogprobs& t) { wire->logprobs(t); }, nullptr);
      held->reset();  // the sequence is free for the next request from here on
      // Cut off by shutdown: an error event ends the stream (no finish, no end marker).
      if (cut_by_shutdown(r)) {
        if (write(wire->error_event(cut_off_error(r.n_generated)))) sink.done();
        return true;
      }
      if (r.finish == FinishReason::cancelled) return false;
      HeldToolText::End end;
      if (held_text) end = held_text->finish(wire->call_id_prefix());  // the held-back text: calls, and what is left
      const bool ok = wire->end(write, r, end.content, end.calls);
      if (ok) sink.done();
      return ok;
    } catch (const std::exception& e) {
      held->reset();
      if (write(wire->error_event(failed(e)))) sink.done();  // a whole response: its error
      return true;
    }
  });
}

}  // namespace ember::server
