// OpenAI's Responses API as data (server/responses.hpp), without sockets: a request becomes the
// chat request it means (input items as messages, flat tools as chat's, text.format as
// response_format), the fields it does not take are 400s naming them, and the response object and
// events carry what the SDKs read. (tests/server/test_responses.py runs the openai SDK and the
// OpenAI Agents SDK against the server.)
#include <gtest/gtest.h>

#include <string>

#include "server/responses.hpp"
#include "support/api_results.hpp"

using namespace ember;
using namespace ember::server;

namespace {

responses::Request ok(const std::string& body) {
  return test_support::expect_value(responses::parse_request(body, test_support::served_smol()), body);
}

ApiError err(const std::string& body) {
  return test_support::expect_error(responses::parse_request(body, test_support::served_smol()), body);
}

}  // namespace

TEST(ServerResponses, InputBecomesTheChatItMeans) {
  const responses::Request s = ok(R"({"model": "smol", "input": "Hi", "instructions": "Be brief.",
                                      "max_output_tokens": 20, "temperature": 0.5, "stream": true, "store": true,
                                      "include": [], "truncation": "disabled", "metadata": {"k": "v"}})");
  ASSERT_EQ(s.chat.messages.size(), 2u);
  EXPECT_EQ(s.chat.messages[0].role, "system");
  EXPECT_EQ(s.chat.messages[0].content, "Be brief.");
  EXPECT_EQ(s.chat.messages[1].role, "user");
  EXPECT_EQ(s.chat.messages[1].content, "Hi");
  EXPECT_TRUE(s.chat.chat);
  EXPECT_EQ(s.chat.max_tokens, 20);
  EXPECT_FLOAT_EQ(s.chat.sampling.temperature, 0.5f);
  EXPECT_TRUE(s.chat.stream);

  const responses::Request items = ok(R"({"model": "smol", "input": [
      {"role": "developer", "content": [{"type": "input_text", "text": "Use "}, {"type": "input_text", "text": "tools."}]},
      {"type": "message", "role": "user", "content": "Weather and 2+3?"},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call", "call_id": "c2", "name": "add", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "5"}]}],
      "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true},
                {"type": "function", "name": "add", "description": "Add"}],
      "tool_choice": {"type": "function", "name": "add"}, "parallel_tool_calls": true})");
  const std::vector<ChatMessage>& m = items.chat.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0].role, "system");  // a developer message, as the chat route reads it
  EXPECT_EQ(m[0].content, "Use tools.");
  ASSERT_EQ(m[2].tool_calls.size(), 2u);  // consecutive calls: one assistant message
  EXPECT_EQ(m[2].tool_calls[0].id, "c1");
  EXPECT_EQ(m[2].tool_calls[1].name, "add");
  EXPECT_EQ(m[3].role, "tool");
  EXPECT_EQ(m[3].tool_call_id, "c1");
  EXPECT_EQ(m[4].content, "5");
  ASSERT_EQ(items.chat.tools.tools.size(), 2u);
  EXPECT_EQ(items.chat.tools.tools[1].description, "Add");
  EXPECT_EQ(items.chat.tools.choice.mode, ToolChoice::Mode::named);
  EXPECT_EQ(items.chat.tools.choice.name, "add");
  EXPECT_TRUE(items.chat.tools.parallel);
  EXPECT_EQ(items.tools.size(), 2u);  // as given, for the response object

  const responses::Request js = ok(R"({"model": "smol", "input": "x", "text": {"format": {"type": "json_schema",
      "name": "c", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}, "strict": true}}})");
  EXPECT_TRUE(js.chat.grammar);
  EXPECT_EQ(js.text_format["name"], "c");
  EXPECT_TRUE(ok(R"({"model": "smol", "input": "x", "text": {"format": {"type": "json_object"}}})").chat.grammar);
  EXPECT_FALSE(ok(R"({"model": "smol", "input": "x", "text": {"format": {"type": "text"}}})").chat.grammar);
}

TEST(ServerResponses, WhatItDoesNotTakeIsA400NamingIt) {
  EXPECT_EQ(err(R"({"model": "smol", "input": "x", "previous_response_id": "resp_1"})").param, "previous_response_id");
  EXPECT_EQ(err(R"({"model": "smol", "input": "x", "reasoning": {"effort": "low"}})").param, "reasoning");
  EXPECT_EQ(err(R"({"model": "smol", "input": "x", "include": ["message.output_text.logprobs"]})").param, "include");
  EXPECT_EQ(err(R"({"model": "smol", "input": "x", "truncation": "auto"})").param, "truncation");
  EXPECT_EQ(err(R"({"model": "smol"})").param, "input");
  EXPECT_EQ(err(R"({"model": "smol", "input": []})").param, "input");
  EXPECT_EQ(err(R"({"model": "smol", "input": [{"type": "reasoning", "summary": []}]})").param, "input[0].type");
  EXPECT_EQ(err(R"({"model": "smol", "input": [{"role": "robot", "content": "x"}]})").param, "input[0].role");
  EXPECT_EQ(err(R"({"model": "smol", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})")
                .param,
            "input[0].content[0].type");
  EXPECT_EQ(err(R"({"model": "smol", "input": [{"type": "function_call", "call_id": "c", "name": "f"}]})").param,
            "input[0].arguments");
  EXPECT_EQ(err(R"({"model": "smol", "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]})")
                .param,
            "input");  // answers no call (the chat's check, named by the input)
  EXPECT_EQ(err(R"({"model": "smol", "input": "x", "tools": [{"type": "web_search"}]})").param, "tools[0].type");
  EXPECT_EQ(err(R"({"model": "smol", "input": "x", "max_output_tokens": 0})").param, "max_output_tokens");
  EXPECT_EQ(err(R"({"model": "smol", "input": "x", "text": {"format": {"type": "yaml"}}})").param, "text.format.type");
  EXPECT_EQ(err(R"({"model": "other", "input": "x"})").status, 404);
}

TEST(ServerResponses, TheResponseAndItsEvents) {
  const responses::Request r = ok(R"({"model": "smol", "input": "x", "tools": [{"type": "function", "name": "f"}]})");
  const responses::Meta meta{"resp_abc", 5, "smol"};
  const json text_only = responses::output_items(meta, "Hello", {});
  ASSERT_EQ(text_only.size(), 1u);
  EXPECT_EQ(text_only[0]["type"], "message");
  EXPECT_EQ(text_only[0]["id"], "msg_abc");
  EXPECT_EQ(text_only[0]["content"][0]["type"], "output_text");
  EXPECT_EQ(text_only[0]["content"][0]["text"], "Hello");
  const json calls = responses::output_items(meta, "", {{"call_1", "f", R"({"a":1})"}});
  ASSERT_EQ(calls.size(), 1u);  // no empty message beside a call
  EXPECT_EQ(calls[0]["type"], "function_call");
  EXPECT_EQ(calls[0]["call_id"], "call_1");
  EXPECT_EQ(calls[0]["arguments"], R"({"a":1})");
  const json done = responses::response_json(meta, r, calls, FinishReason::eog, {7, 3, 2});
  EXPECT_EQ(done["object"], "response");
  EXPECT_EQ(done["status"], "completed");
  EXPECT_TRUE(done["incomplete_details"].is_null());
  EXPECT_EQ(done["usage"]["input_tokens"], 7);
  EXPECT_EQ(done["usage"]["output_tokens"], 3);
  EXPECT_EQ(done["usage"]["total_tokens"], 10);
  EXPECT_EQ(done["usage"]["input_tokens_details"]["cached_tokens"], 2);
  EXPECT_EQ(done["tools"].size(), 1u);
  EXPECT_EQ(done["store"], false);
  const json cut = responses::response_json(meta, r, text_only, FinishReason::length, {});
  EXPECT_EQ(cut["status"], "incomplete");
  EXPECT_EQ(cut["incomplete_details"]["reason"], "max_output_tokens");
  int64_t seq = 4;
  const std::string e = responses::event("response.output_text.delta", {{"delta", "Hi"}}, seq);
  EXPECT_EQ(seq, 5);
  EXPECT_TRUE(e.starts_with("event: response.output_text.delta\ndata: {")) << e;
  EXPECT_TRUE(e.ends_with("\n\n"));
  const json data = json::parse(e.substr(e.find("data: ") + 6));
  EXPECT_EQ(data["type"], "response.output_text.delta");
  EXPECT_EQ(data["sequence_number"], 4);
  EXPECT_EQ(data["delta"], "Hi");
}
