// The HTTP server's route table: 405's Allow is derived from the routes a path matches (GET brings
// HEAD; the CORS catch-all OPTIONS route is not a method of every path), empty where none does.
#include <gtest/gtest.h>

#include "server/http_server.hpp"

using namespace ember::server;

TEST(HttpRoutes, AllowIsTheMethodsOfTheRoutesAPathMatches) {
  http::HttpServer s(http::ServerOptions{});
  const http::HttpServer::Handler none = [](const http::Request&, http::Response&) {};
  s.Options(R"(.*)", none);
  s.Get("/health", none);
  s.Post("/v1/embeddings", none);
  s.Get(R"(/v1/models/(.+))", none);
  s.Get("/both", none);
  s.Post("/both", none);
  EXPECT_EQ(s.allowed_methods("/health"), "GET, HEAD");
  EXPECT_EQ(s.allowed_methods("/v1/embeddings"), "POST");
  EXPECT_EQ(s.allowed_methods("/v1/models/some-model"), "GET, HEAD");
  EXPECT_EQ(s.allowed_methods("/both"), "GET, HEAD, POST");
  EXPECT_EQ(s.allowed_methods("/v1/models/"), "");  // the pattern wants a name
  EXPECT_EQ(s.allowed_methods("/nothing"), "");      // OPTIONS answers it, but it is no route
  EXPECT_EQ(s.allowed_methods("/health/x"), "");     // whole paths only
}
