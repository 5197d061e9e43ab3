// Ollama's API as data (server/ollama.hpp), without sockets: requests become the engine's
// CompletionRequest with Ollama's defaults and option names, errors name the field, responses
// carry the fields Ollama's clients read. (tests/server/test_ollama.py runs the `ollama` client.)
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "support/api_results.hpp"
#include "server/ollama.hpp"

using namespace ember;
using namespace ember::server;

namespace {

ServedModel served() {
  ServedModel m = test_support::served_smol();
  m.sampling.temperature = 0.2f;  // a model's recommended sampling: the defaults
  m.file.architecture = "llama";
  m.file.parameters = 134515008;
  m.file.quantization = "Q4_1";
  m.file.bytes = 98362432;
  m.file.modified = 1738911764;
  m.file.digest = std::string(64, 'a');
  m.file.metadata = {{"general.architecture", "llama"}};
  m.chat_template = "{{ messages }}";
  return m;
}

ollama::Request ok(const std::string& body, bool chat) {
  return test_support::expect_value(ollama::parse_request(body, chat, served()), body);
}

ApiError err(const std::string& body, bool chat) {
  return test_support::expect_error(ollama::parse_request(body, chat, served()), body);
}

}  // namespace

TEST(ServerOllama, ChatWithOptions) {
  const ollama::Request r = ok(R"({"model": "smol:latest", "messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"}], "options": {"temperature": 0.5, "top_k": 7, "top_p": 0.8, "min_p": 0.1,
      "seed": 42, "num_predict": 12, "stop": ["\n"], "repeat_penalty": 1.1, "repeat_last_n": -1, "num_ctx": 128},
      "keep_alive": "5m", "tools": [], "format": ""})", true);
  const CompletionRequest& c = r.completion;
  EXPECT_TRUE(r.chat);
  EXPECT_TRUE(c.chat);
  EXPECT_TRUE(c.stream);  // Ollama's default
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[1].content, "Hi");
  EXPECT_FLOAT_EQ(c.sampling.temperature, 0.5f);
  EXPECT_EQ(c.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(c.sampling.top_p, 0.8f);
  EXPECT_FLOAT_EQ(c.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(c.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(c.sampling.repeat_last_n, 256);  // -1: the whole context
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(c.max_tokens, 12);
  EXPECT_EQ(c.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.num_ctx, 128);
  EXPECT_FALSE(c.grammar);
}

TEST(ServerOllama, DefaultsAreTheModelsAndOllamas) {
  const ollama::Request r = ok(R"({"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "stream": false})", true);
  EXPECT_FALSE(r.completion.stream);
  EXPECT_FLOAT_EQ(r.completion.sampling.temperature, 0.2f);  // ServedModel::sampling
  EXPECT_FALSE(r.completion.max_tokens);                     // num_predict -1: until the end
  EXPECT_EQ(r.num_ctx, 0);
  const ollama::Request fill = ok(R"({"model": "smol", "prompt": "x", "options": {"num_predict": -2, "num_ctx": 9999}})", false);
  EXPECT_TRUE(fill.fill_context);
  EXPECT_FALSE(fill.completion.max_tokens);
  EXPECT_EQ(fill.num_ctx, 0);  // larger than the server's: its own
}

TEST(ServerOllama, GenerateUsesTheTemplateUnlessRaw) {
  const ollama::Request t = ok(R"({"model": "smol", "prompt": "Name a color.", "system": "Answer in one word."})", false);
  EXPECT_FALSE(t.chat);  // answered as "response"
  ASSERT_TRUE(t.completion.chat);  // through the chat template, as Ollama does
  ASSERT_EQ(t.completion.messages.size(), 2u);
  EXPECT_EQ(t.completion.messages[0].content, "Answer in one word.");
  EXPECT_EQ(t.completion.messages[1].content, "Name a color.");
  const ollama::Request raw = ok(R"({"model": "smol", "prompt": "The sky is", "raw": true})", false);
  EXPECT_FALSE(raw.completion.chat);
  EXPECT_EQ(raw.completion.prompt, "The sky is");
}

TEST(ServerOllama, FormatIsAGrammar) {
  EXPECT_TRUE(ok(R"({"model": "smol", "prompt": "x", "format": "json"})", false).completion.grammar);
  EXPECT_TRUE(ok(R"({"model": "smol", "prompt": "x", "format": {"type": "object", "properties": {"a": {"type": "integer"}}}})",
                 false).completion.grammar);
  EXPECT_EQ(err(R"({"model": "smol", "prompt": "x", "format": "xml"})", false).param, "format");
  const ApiError e = err(R"({"model": "smol", "prompt": "x", "format": {"type": "string", "pattern": "a+"}})", false);
  EXPECT_NE(e.message.find("unsupported JSON schema"), std::string::npos) << e.message;
}

TEST(ServerOllama, ErrorsNameTheField) {
  EXPECT_EQ(err(R"({"model": "other", "prompt": "x"})", false).status, 404);
  EXPECT_EQ(err(R"({"prompt": "x"})", false).param, "model");
  EXPECT_EQ(err(R"(not json)", false).status, 400);
  EXPECT_EQ(err(R"({"model": "smol", "messages": "hi"})", true).param, "messages");
  EXPECT_EQ(err(R"({"model": "smol", "messages": [{"role": "robot", "content": "x"}]})", true).param, "messages[0].role");
  EXPECT_EQ(err(R"({"model": "smol", "messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]})", true).param,
            "messages[0].images");
  EXPECT_EQ(err(R"({"model": "smol", "prompt": "x", "options": {"temperature": "hot"}})", false).param, "options.temperature");
  EXPECT_EQ(err(R"({"model": "smol", "prompt": "x", "options": {"num_predict": -3}})", false).param, "options.num_predict");
  EXPECT_EQ(err(R"({"model": "smol", "prompt": "x", "options": {"stop": [1]}})", false).param, "options.stop");
  EXPECT_EQ(err(R"({"model": "smol", "prompt": "x", "suffix": "y"})", false).param, "suffix");
  EXPECT_EQ(err(R"({"model": "smol", "prompt": "x", "stream": "yes"})", false).param, "stream");
  EXPECT_EQ(err(R"({"model": "smol", "prompt": ""})", false).param, "prompt");
  EXPECT_EQ(ollama::error_body(ApiError{400, "bad things", "invalid_request_error", "", ""}), R"({"error":"bad things"})");
}

// Tools on /api/chat in OpenAI's shapes; an assistant's calls (arguments as objects, no ids) get
// ids, and a tool message (its function in tool_name) answers the earliest open call of it.
TEST(ServerOllama, ToolsAndTheirResultsOnChat) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}])";
  const ollama::Request r = ok(R"({"model": "smol", "messages": [{"role": "user", "content": "Weather in Paris?"}], )" + tools +
                                   "}",
                               true);
  ASSERT_EQ(r.completion.tools.tools.size(), 2u);
  EXPECT_EQ(r.completion.tools.tools[0].name, "get_weather");
  EXPECT_TRUE(r.completion.tools.active());
  EXPECT_FALSE(r.completion.tools.forced());
  EXPECT_TRUE(r.completion.tools.parallel);

  const ollama::Request h = ok(R"({"model": "smol", "messages": [{"role": "user", "content": "Weather in Paris and 2+3?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
      {"role": "tool", "content": "5"}], )" + tools + "}",
                               true);
  const std::vector<ChatMessage>& m = h.completion.messages;
  ASSERT_EQ(m.size(), 4u);
  ASSERT_EQ(m[1].tool_calls.size(), 2u);
  EXPECT_EQ(m[1].tool_calls[0].name, "add");
  EXPECT_EQ(nlohmann::json::parse(m[1].tool_calls[0].arguments), nlohmann::json({{"a", 2}, {"b", 3}}));
  EXPECT_NE(m[1].tool_calls[0].id, m[1].tool_calls[1].id);
  EXPECT_EQ(m[2].tool_call_id, m[1].tool_calls[1].id);  // by its name
  EXPECT_EQ(m[2].name, "get_weather");
  EXPECT_EQ(m[3].tool_call_id, m[1].tool_calls[0].id);  // the one still open
  EXPECT_EQ(m[3].name, "add");

  EXPECT_EQ(err(R"({"model": "smol", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "5"}]})", true)
                .param,
            "messages[1]");
  EXPECT_EQ(err(R"({"model": "smol", "messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": {}}}]},
      {"role": "tool", "tool_name": "get_weather", "content": "5"}]})", true).param,
            "messages[2]");
  EXPECT_EQ(err(R"({"model": "smol", "prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]})", false).param,
            "tools");
  EXPECT_EQ(err(R"({"model": "smol", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "robot"}]})", true)
                .param,
            "tools[0].type");
  // No tools, or an empty list (clients send one): no tool machinery.
  EXPECT_FALSE(ok(R"({"model": "smol", "messages": [{"role": "user", "content": "x"}], "tools": []})", true)
                   .completion.tools.active());

  const ServedModel sm = served();
  const std::vector<ToolCall> calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}};
  ollama::Timings t;
  const json f = ollama::final_chunk(sm, true, "", FinishReason::eog, t, &calls);
  ASSERT_EQ(f["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(f["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(f["message"]["tool_calls"][0]["function"]["arguments"], json({{"city", "Paris"}}));  // an object
  EXPECT_EQ(f["done_reason"], "stop");
  const json c = ollama::tool_calls_chunk(sm, calls);
  EXPECT_EQ(c["done"], false);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["index"], 0);
  EXPECT_FALSE(ollama::final_chunk(sm, true, "", FinishReason::eog, t)["message"].contains("tool_calls"));
}

TEST(ServerOllama, LimitsOfASmallerContext) {
  ollama::Request r = ok(R"({"model": "smol", "prompt": "x", "options": {"num_ctx": 10}})", false);
  PreparedRequest p;
  p.prompt.assign(6, 1);
  p.gen.max_tokens = 250;
  EXPECT_FALSE(ollama::apply_limits(r, p));
  EXPECT_EQ(p.gen.max_tokens, 4);  // 10 - 6
  p.prompt.assign(10, 1);
  const auto e = ollama::apply_limits(r, p);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "options.num_ctx");
}

TEST(ServerOllama, ResponsesCarryWhatClientsRead) {
  const ServedModel m = served();
  json c = ollama::chunk(m, true, "Hel");
  EXPECT_EQ(c["model"], "smol");
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], "Hel");
  EXPECT_EQ(c["done"], false);
  EXPECT_TRUE(std::regex_match(c["created_at"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z)")));
  ollama::Timings t;
  t.total_ns = 5, t.prompt_ns = 2, t.eval_ns = 3, t.prompt_tokens = 7, t.tokens = 9;
  json f = ollama::final_chunk(m, false, "", FinishReason::length, t);
  EXPECT_EQ(f["response"], "");
  EXPECT_EQ(f["done"], true);
  EXPECT_EQ(f["done_reason"], "length");
  EXPECT_EQ(f["eval_count"], 9);
  EXPECT_EQ(f["prompt_eval_count"], 7);
  EXPECT_EQ(f["total_duration"], 5);
  EXPECT_EQ(ollama::final_chunk(m, true, "", FinishReason::eog, t)["done_reason"], "stop");
  const json tags = ollama::tags(m);
  ASSERT_EQ(tags["models"].size(), 1u);
  EXPECT_EQ(tags["models"][0]["model"], "smol:latest");
  EXPECT_EQ(tags["models"][0]["details"]["parameter_size"], "135M");
  EXPECT_EQ(tags["models"][0]["details"]["quantization_level"], "Q4_1");
  EXPECT_EQ(tags["models"][0]["modified_at"], "2025-02-07T07:02:44Z");
  const json show = ollama::show(m);
  EXPECT_EQ(show["template"], "{{ messages }}");
  EXPECT_NE(show["parameters"].get<std::string>().find("temperature 0.2"), std::string::npos);
  EXPECT_EQ(show["model_info"]["general.architecture"], "llama");
  EXPECT_EQ(show["capabilities"], json({"completion", "tools", "embedding"}));
  EXPECT_EQ(ollama::ps(m, 123)["models"][0]["size_vram"], 123);
  EXPECT_FALSE(ollama::check_show(R"({"model": "smol"})", m));
  EXPECT_FALSE(ollama::check_show(R"({"name": "smol:latest"})", m));
  EXPECT_EQ(ollama::check_show(R"({"model": "x"})", m)->status, 404);
}
