// The server's parsers return std::variant<T, ApiError>: these take the value a test expects (a
// failure naming the body otherwise) or the error it expects.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "server/api.hpp"

namespace ember::test_support {

// The model the parsers' tests serve: "smol" with a 256-token context.
inline server::ServedModel served_smol() {
  server::ServedModel m;
  m.id = "smol";
  m.n_ctx = 256;
  return m;
}

template <class T>
T expect_value(std::variant<T, server::ApiError>&& r, const std::string& body) {
  if (auto* e = std::get_if<server::ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::holds_alternative<T>(r) ? std::move(std::get<T>(r)) : T{};
}

template <class T>
server::ApiError expect_error(std::variant<T, server::ApiError>&& r, const std::string& body) {
  if (!std::holds_alternative<server::ApiError>(r)) {
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  return std::get<server::ApiError>(r);
}

}  // namespace ember::test_support
