// An error as OpenAI sends it: {"error": {"message", "type", "param", "code"}} with an HTTP
// status (api.hpp writes it; Ollama's routes send {"error": message}). Empty param / code are
// sent as null.
#pragma once
#include <string>
#include <utility>

#include "core/error.hpp"

namespace ember::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;
};

// A request that failed after it was admitted, with the answer to give (Server::generate throws
// it where the engine ended the job with an error: 400 where the request's own grammar broke a
// bound, 500 where the engine failed).
struct RequestFailed : Error {
  explicit RequestFailed(ApiError e) : Error(e.message), api(std::move(e)) {}
  ApiError api;
};

}  // namespace ember::server
