// What the server's route files share (server.cpp, drive.cpp, the routes_*.cpp): the answers
// every route gives alike.
#pragma once
#include <cstdint>
#include <string>

#include "server/api.hpp"
#include "server/http_server.hpp"

namespace ember::server {

int64_t unix_now();
// An error response (with Retry-After for a busy or shutting-down server): OpenAI's shape, and
// Ollama's {"error": message}.
void send_error(http::Response& res, const ApiError& e);
void send_ollama_error(http::Response& res, const ApiError& e);
std::string sse(const std::string& data);                     // "data: ...\n\n"
ApiError shutting_down_error();                               // 503 server_shutting_down
ApiError cut_off_error(int64_t n_generated);                  // an answer cut off by shutdown

}  // namespace ember::server
