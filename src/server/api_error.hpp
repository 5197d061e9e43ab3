// An error as OpenAI sends it: {"error": {"message", "type", "param", "code"}} with an HTTP
// status (api.hpp writes it; Ollama's routes send {"error": message}). Empty param / code are
// sent as null.
#pragma once
#include <string>

namespace ember::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;
};

}  // namespace ember::server
