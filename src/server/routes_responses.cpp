// OpenAI's Responses API route (server/responses.hpp): POST /v1/responses (and /responses), a
// response object or its stream of events, on the steps every route takes (server.hpp).
#include "server/http_server.hpp"

#include <optional>
#include <random>

#include "server/responses.hpp"
#include "server/routes_common.hpp"
#include "server/server.hpp"
#include "server/wire.hpp"

namespace ember::server {

namespace {

// The Responses API: a response object, or its stream of events (created, the message item's
// text deltas, each call's item, completed).
class ResponsesWire final : public Wire {
 public:
  ResponsesWire(responses::Meta meta, std::shared_ptr<const responses::Request> req)
      : meta_(std::move(meta)), req_(std::move(req)), msg_id_("msg_" + meta_.id.substr(5)) {}

  void error(http::Response& res, const ApiError& e) const override { send_error(res, e); }
  std::string call_id_prefix() const override { return meta_.id.substr(5); }
  void whole(http::Response& res, const std::vector<WholeChoice>& choices) const override {
    const WholeChoice& c = choices.front();
    const GenerateResult& r = c.result;
    res.set_content(dump(responses::response_json(meta_, *req_, responses::output_items(meta_, c.out.content, c.out.calls),
                                                  r.finish, {r.n_prompt, r.n_generated, r.n_cached})),
                    "application/json");
  }

  const char* stream_type() const override { return "text/event-stream"; }
  bool waits_by_comments() const override { return true; }
  bool begin(const Write& w) override {
    json started = responses::response_json(meta_, *req_, json::array(), FinishReason::eog, {});
    started["status"] = "in_progress";
    started["usage"] = nullptr;
    return w(event("response.created", {{"response", started}})) &&
           w(event("response.in_progress", {{"response", started}}));
  }
  // The message item opens with the first text.
  bool text(const Write& w, const std::string& piece) override {
    sent_ += piece;
    return open(w) && w(event("response.output_text.delta",
                              {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0}, {"delta", piece}}));
  }
  bool end(const Write& w, const GenerateResult& r, const std::string& rest,
           const std::vector<ToolCall>& calls) override {
    bool ok = rest.empty() || text(w, rest);
    const json output = responses::output_items(meta_, sent_, calls);
    size_t index = 0;
    if (ok && (!sent_.empty() || calls.empty())) {  // the message item closes
      const json part = output[0]["content"][0];
      ok = open(w) &&
           w(event("response.output_text.done",
                   {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0}, {"text", sent_}})) &&
           w(event("response.content_part.done",
                   {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0}, {"part", part}})) &&
           w(event("response.output_item.done", {{"output_index", 0}, {"item", output[0]}}));
      index = 1;
    }
    for (; ok && index < output.size(); ++index) {  // each call: added with no arguments, then them
      json item = output[index];
      const std::string id = item["id"], args = item["arguments"];
      json opening = item;
      opening["arguments"] = "";
      opening["status"] = "in_progress";
      ok = w(event("response.output_item.added", {{"output_index", index}, {"item", opening}})) &&
           w(event("response.function_call_arguments.delta", {{"item_id", id}, {"output_index", index}, {"delta", args}})) &&
           w(event("response.function_call_arguments.done",
                   {{"item_id", id}, {"output_index", index}, {"arguments", args}})) &&
           w(event("response.output_item.done", {{"output_index", index}, {"item", item}}));
    }
    const json final = responses::response_json(meta_, *req_, output, r.finish, {r.n_prompt, r.n_generated, r.n_cached});
    return ok && w(event(final["status"] == "completed" ? "response.completed" : "response.incomplete",
                         {{"response", final}}));
  }
  std::string error_event(const ApiError& e) override { return event("error", {{"message", e.message}}); }

 private:
  std::string event(const std::string& type, json data) { return responses::event(type, std::move(data), seq_); }
  bool open(const Write& w) {
    if (opened_) return true;
    opened_ = true;
    json item = {{"type", "message"}, {"id", msg_id_}, {"status", "in_progress"}, {"role", "assistant"},
                 {"content", json::array()}};
    return w(event("response.output_item.added", {{"output_index", 0}, {"item", item}})) &&
           w(event("response.content_part.added",
                   {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0},
                    {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}}));
  }

  const responses::Meta meta_;
  const std::shared_ptr<const responses::Request> req_;
  const std::string msg_id_;
  int64_t seq_ = 0;
  bool opened_ = false;
  std::string sent_;
};

}  // namespace

void Server::responses_route(const http::Request& req, http::Response& res) {
  const auto arrived = std::chrono::steady_clock::now();
  ++n_requests_;
  if (draining_ || stopping_) return send_error(res, shutting_down_error());
  auto parsed = parse_gated([&] { return responses::parse_request(req.body, served_); });
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  auto rreq = std::make_shared<const responses::Request>(std::move(std::get<responses::Request>(parsed)));
  auto prepared = prepare_request(rreq->chat, tok_, served_, std::random_device{}());
  if (auto* e = std::get_if<ApiError>(&prepared)) return send_error(res, *e);
  const bool stream = rreq->chat.stream;
  drive(req, res, std::make_shared<ResponsesWire>(responses::Meta{"resp_" + unguessable_id(), unix_now(), served_.id}, rreq),
        {std::make_shared<const PreparedRequest>(std::move(std::get<PreparedRequest>(prepared)))}, stream, arrived);
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
