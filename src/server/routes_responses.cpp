// OpenAI's Responses API route (server/responses.hpp): POST /v1/responses (and /responses), a
// response object or its stream of events, on the steps every route takes (server.hpp).
#include "server/http_server.hpp"

#include <optional>
#include <random>

#include "server/responses.hpp"
#include "server/routes_common.hpp"
#include "server/server.hpp"

namespace ember::server {

void Server::responses_route(const http::Request& req, http::Response& res) {
  const auto arrived = std::chrono::steady_clock::now();
  ++n_requests_;
  if (draining_ || stopping_) {
    set_retry_after(res, shutting_down_error());
    return send_error(res, shutting_down_error());
  }
  const int fd = req.fd;
  auto parsed = parse_gated([&] { return responses::parse_request(req.body, served_); });
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  auto rreq = std::make_shared<const responses::Request>(std::move(std::get<responses::Request>(parsed)));
  auto prepared = prepare_request(rreq->chat, tok_, served_, std::random_device{}());
  if (auto* e = std::get_if<ApiError>(&prepared)) return send_error(res, *e);
  auto prep = std::make_shared<const PreparedRequest>(std::move(std::get<PreparedRequest>(prepared)));
  std::unique_ptr<SlotQueue::Ticket> ticket = admit(prep);
  if (!ticket) {
    set_retry_after(res, busy_error());
    return send_error(res, busy_error());
  }
  const responses::Meta meta{"resp_" + unguessable_id(), unix_now(), served_.id};

  if (!rreq->chat.stream) {
    const int slot = wait_for_sequence(*ticket, [&] { return http::peer_closed(fd); }, std::chrono::milliseconds(250));
    if (slot < 0) {
      if (http::peer_closed(fd)) ++n_cancelled_;
      set_retry_after(res, shutting_down_error());
      return send_error(res, shutting_down_error());
    }
    std::string text;
    const auto done = generate_text(slot, *prep, arrived, text, [](const TokenLogprobs&) {}, [&] { return http::peer_closed(fd); });
    ticket.reset();
    if (const auto* e = std::get_if<ApiError>(&done)) return send_error(res, *e);
    const GenerateResult& r = std::get<GenerateResult>(done);
    if (cut_by_shutdown(r)) return send_error(res, cut_off_error(r.n_generated));
    ToolOutput out{text, {}};
    if (prep->tools) out = parse_tool_output(prep->tool_format, *prep->tools, text, meta.id.substr(5));
    res.set_content(dump(responses::response_json(meta, *rreq, responses::output_items(meta, out.content, out.calls),
                                                  r.finish, {r.n_prompt, r.n_generated, r.n_cached})),
                    "application/json");
    return;
  }

  auto held = std::make_shared<std::unique_ptr<SlotQueue::Ticket>>(std::move(ticket));
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider("text/event-stream", [this, held, meta, rreq, prep, arrived](size_t, http::DataSink& sink) {
    if (!*held) return false;
    auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
    int64_t seq = 0;
    bool waited = false;
    const int slot = wait_for_stream_sequence(*held, sink, waited);
    if (slot < 0) return waited;
    try {
      json started = responses::response_json(meta, *rreq, json::array(), FinishReason::eog, {});
      started["status"] = "in_progress";
      started["usage"] = nullptr;
      if (!write(responses::event("response.created", {{"response", started}}, seq)) ||
          !write(responses::event("response.in_progress", {{"response", started}}, seq))) {
        held->reset();
        ++n_cancelled_;
        return false;
      }
      // The message item opens with the first text; text that may be a call waits (HeldToolText).
      const std::string msg_id = "msg_" + meta.id.substr(5);
      bool opened = false;
      std::string sent;
      const auto open = [&] {
        if (opened) return true;
        opened = true;
        json item = {{"type", "message"}, {"id", msg_id}, {"status", "in_progress"}, {"role", "assistant"},
                     {"content", json::array()}};
        return write(responses::event("response.output_item.added", {{"output_index", 0}, {"item", item}}, seq)) &&
               write(responses::event("response.content_part.added",
                                      {{"item_id", msg_id}, {"output_index", 0}, {"content_index", 0},
                                       {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}},
                                      seq));
      };
      const auto send_text = [&](const std::string& piece) {
        if (piece.empty()) return true;
        sent += piece;
        return open() && write(responses::event("response.output_text.delta",
                                                {{"item_id", msg_id}, {"output_index", 0}, {"content_index", 0},
                                                 {"delta", piece}},
                                                seq));
      };
      std::optional<HeldToolText> held_text;
      if (prep->tools) held_text.emplace(prep->tool_format, *prep->tools);
      const GenerateResult r = generate(
          slot, *prep, arrived,
          [&](std::string_view piece) {
            if (stopping_.load()) return false;
            return send_text(held_text ? held_text->add(piece) : std::string(piece));
          },
          [](const TokenLogprobs&) {}, nullptr);
      held->reset();
      if (cut_by_shutdown(r)) {
        if (write(responses::event("error", {{"message", cut_off_error(r.n_generated).message}}, seq))) sink.done();
        return true;
      }
      if (r.finish == FinishReason::cancelled) return false;
      std::vector<ToolCall> calls;
      bool ok = true;
      if (held_text) {
        HeldToolText::End end = held_text->finish(meta.id.substr(5));
        calls = std::move(end.calls);
        ok = send_text(end.content);
      }
      const json output = responses::output_items(meta, sent, calls);
      size_t index = 0;
      if (ok && (!sent.empty() || calls.empty())) {  // the message item closes
        const json part = output[0]["content"][0];
        ok = open() &&
             write(responses::event("response.output_text.done",
                                    {{"item_id", msg_id}, {"output_index", 0}, {"content_index", 0}, {"text", sent}}, seq)) &&
             write(responses::event("response.content_part.done",
                                    {{"item_id", msg_id}, {"output_index", 0}, {"content_index", 0}, {"part", part}}, seq)) &&
             write(responses::event("response.output_item.done", {{"output_index", 0}, {"item", output[0]}}, seq));
        index = 1;
      }
      for (; ok && index < output.size(); ++index) {  // each call: added with no arguments, then them
        json item = output[index];
        const std::string id = item["id"], args = item["arguments"];
        json opening = item;
        opening["arguments"] = "";
        opening["status"] = "in_progress";
        ok = write(responses::event("response.output_item.added", {{"output_index", index}, {"item", opening}}, seq)) &&
             write(responses::event("response.function_call_arguments.delta",
                                    {{"item_id", id}, {"output_index", index}, {"delta", args}}, seq)) &&
             write(responses::event("response.function_call_arguments.done",
                                    {{"item_id", id}, {"output_index", index}, {"arguments", args}}, seq)) &&
             write(responses::event("response.output_item.done", {{"output_index", index}, {"item", item}}, seq));
      }
      const json final = responses::response_json(meta, *rreq, output, r.finish, {r.n_prompt, r.n_generated, r.n_cached});
      if (ok)
        ok = write(responses::event(final["status"] == "completed" ? "response.completed" : "response.incomplete",
                                    {{"response", final}}, seq));
      if (ok) sink.done();
      return ok;
    } catch (const std::exception& e) {
      held->reset();
      if (write(responses::event("error", {{"message", failed(e).message}}, seq))) sink.done();
      return true;
    }
  });
}

void Server::install_responses_routes() {
  for (const char* path : {"/v1/responses", "/responses"})
    http_->Post(path, [this](const http::Request& req, http::Response& res) { responses_route(req, res); });
  http_->Get(R"(/v1/responses/(.+))", [](const http::Request&, http::Response& res) {
    send_error(res, ApiError{404, "responses are not stored on this server: each answer is returned only once",
                             "invalid_request_error", "", "not_found"});
  });
}

}  // namespace ember::server
