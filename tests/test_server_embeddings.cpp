// Embedding answers' encoding (server/embeddings.hpp): OpenAI's base64 is the little-endian
// float32 bytes (what its SDK decodes with numpy.frombuffer), padded to whole quads.
#include <gtest/gtest.h>

#include <vector>

#include "server/embeddings.hpp"

using namespace ember::server;

TEST(ServerEmbeddings, Base64IsTheFloatsLittleEndianBytes) {
  EXPECT_EQ(base64_floats(std::vector<float>{}), "");
  EXPECT_EQ(base64_floats(std::vector<float>{1.0f}), "AACAPw==");           // 00 00 80 3f
  EXPECT_EQ(base64_floats(std::vector<float>{1.0f, -2.0f}), "AACAPwAAAMA=");  // + 00 00 00 c0
  EXPECT_EQ(base64_floats(std::vector<float>{0.5f, 0.25f, -0.0f}), "AAAAPwAAgD4AAACA");
}

TEST(ServerEmbeddings, AnswersInEachApisShape) {
  ServedModel m;
  m.id = "smol";
  const std::vector<std::vector<float>> v = {{1.0f, 0.0f}, {0.0f, 1.0f}};
  EmbeddingRequest r;
  r.base64 = true;
  json j = embedding_response(r, v, m, 7, 1000);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][1]["index"], 1);
  EXPECT_EQ(j["data"][0]["embedding"], base64_floats(v[0]));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  r.api = EmbeddingApi::ollama;
  j = embedding_response(r, v, m, 7, 1000);
  EXPECT_EQ(j["embeddings"][1][1], 1.0);
  EXPECT_EQ(j["prompt_eval_count"], 7);
  EXPECT_EQ(j["total_duration"], 1000);
  r.api = EmbeddingApi::ollama_legacy;
  EXPECT_EQ(embedding_response(r, {v[0]}, m, 7, 1000), (json{{"embedding", {1.0, 0.0}}}));
}
