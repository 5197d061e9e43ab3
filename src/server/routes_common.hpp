// What the server's route files share (server.cpp, routes_openai.cpp, routes_ollama.cpp): the
// socket of the request a worker thread handles, and the answers every route gives alike.
#pragma once
#include <cstdint>
#include <string>

#include <httplib.h>

#include "server/api.hpp"

namespace ember::server {

// The socket of the request this worker thread is handling (set before routing; -1: unknown).
extern thread_local int t_request_fd;

int64_t unix_now();
void send_error(httplib::Response& res, const ApiError& e);  // OpenAI's error shape
void send_ollama_error(httplib::Response& res, const ApiError& e);  // Ollama's: {"error": message}
std::string sse(const std::string& data);                     // "data: ...\n\n"
ApiError shutting_down_error();                               // 503 server_shutting_down
ApiError cut_off_error(int64_t n_generated);                  // an answer cut off by shutdown
void set_retry_after(httplib::Response& res, const ApiError& e);  // for 503s: when to come back

}  // namespace ember::server
