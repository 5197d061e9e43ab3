// Embedding routes (server/embeddings.hpp): OpenAI's /v1/embeddings, Ollama's /api/embed and
// /api/embeddings. A request waits for a sequence as a generation does; its inputs run on it one
// after another, each evaluated in chunks beside the other sequences' steps (BatchEngine::embed).
#include "server/http_server.hpp"

#include "core/log.hpp"
#include "core/timer.hpp"
#include "server/routes_common.hpp"
#include "server/server.hpp"

namespace ember::server {

void Server::embeddings(const http::Request& req, http::Response& res, EmbeddingApi api) {
  const auto arrived = std::chrono::steady_clock::now();
  ++n_requests_;
  const auto fail = api == EmbeddingApi::openai ? send_error : send_ollama_error;
  if (draining_ || stopping_) return fail(res, shutting_down_error());
  const int fd = req.fd;  // the request's connection: a client that hangs up is seen there
  auto parsed = parse_embedding_request(req.body, api, served_, tok_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(res, *e);
  const EmbeddingRequest& r = std::get<EmbeddingRequest>(parsed);
  // Any free sequence: an embedding reads every token, so no cached prefix helps.
  std::unique_ptr<SlotQueue::Ticket> ticket = queue_.enqueue([](size_t) { return size_t{0}; });
  if (!ticket) return fail(res, busy_error());
  const auto gone = [&] { return http::peer_closed(fd); };
  const int slot = wait_for_sequence(*ticket, gone, std::chrono::milliseconds(250));
  if (slot < 0) {
    if (gone()) ++n_cancelled_;
    return fail(res, shutting_down_error());
  }
  Timer t;
  std::vector<std::vector<float>> vectors;
  int64_t tokens = 0;
  for (const std::vector<int32_t>& in : r.inputs) {
    std::shared_ptr<BatchEngine::Job> job = engine_->embed(slot, in, served_.pooling);
    std::vector<BatchEngine::Piece> none;
    while (job->wait(none, std::chrono::milliseconds(200)))
      if (gone() || stopping_) job->cancel();
    if (!job->error().empty()) return fail(res, failed(Error(job->error())));
    if (job->embedding().empty()) {  // cancelled: the client left, or shutdown
      ++n_cancelled_;
      return fail(res, shutting_down_error());
    }
    vectors.push_back(job->embedding());
    if (r.normalize) l2_normalize(vectors.back());
    tokens += static_cast<int64_t>(in.size());
  }
  ticket.reset();
  ++n_completed_;
  metrics_.embedded(static_cast<int64_t>(vectors.size()), tokens);
  log_info("slot {}: embedded {} inputs, {} tokens, {:.0f} ms", slot, vectors.size(), tokens, t.seconds() * 1e3);
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - arrived).count();
  res.set_content(dump(embedding_response(r, vectors, served_, tokens, ns)), "application/json");
}

void Server::install_embedding_routes() {
  http::HttpServer& s = *http_;
  for (const char* path : {"/v1/embeddings", "/embeddings"})
    s.Post(path, [this](const http::Request& req, http::Response& res) {
      embeddings(req, res, EmbeddingApi::openai);
    });
  s.Post("/api/embed", [this](const http::Request& req, http::Response& res) {
    embeddings(req, res, EmbeddingApi::ollama);
  });
  s.Post("/api/embeddings", [this](const http::Request& req, http::Response& res) {
    embeddings(req, res, EmbeddingApi::ollama_legacy);
  });
}

}  // namespace ember::server
