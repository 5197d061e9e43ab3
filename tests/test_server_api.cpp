// Request parsing and validation of the OpenAI-compatible API, without sockets.
#include <gtest/gtest.h>

#include <string>

#include "support/api_results.hpp"
#include "core/json.hpp"
#include "server/api.hpp"
#include "support/paths.hpp"
#include "model/model.hpp"
#include "tokenizer/tokenizer.hpp"

using namespace ember;
using namespace ember::server;

namespace {

ServedModel served() { return test_support::served_smol(); }

CompletionRequest ok(const std::string& body, bool chat = true) {
  return test_support::expect_value(parse_completion_request(body, chat, served()), body);
}

ApiError err(const std::string& body, bool chat = true) {
  return test_support::expect_error(parse_completion_request(body, chat, served()), body);
}

}  // namespace

TEST(ServerApi, ChatRequestWithAllFields) {
  CompletionRequest r = ok(R"({"model":"smol","messages":[{"role":"system","content":"be brief"},
    {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
    "max_tokens":12,"temperature":0.5,"top_p":0.9,"seed":42,"stop":["\n\n","User:"],"n":1,
    "stream":true,"stream_options":{"include_usage":true},"frequency_penalty":0,"user":"x"})");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "hi there");
  EXPECT_EQ(r.max_tokens, 12);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "User:"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(ServerApi, DefaultsAndNulls) {
  CompletionRequest r = ok(R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":null,"stop":null,"seed":null})");
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.seed);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_FLOAT_EQ(r.sampling.temperature, SamplerParams{}.temperature);
  CompletionRequest c = ok(R"({"prompt":"abc","stop":"x","max_tokens":3.0})", false);
  EXPECT_EQ(c.prompt, "abc");
  EXPECT_EQ(c.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(c.max_tokens, 3);
  EXPECT_EQ(ok(R"({"prompt":["one"]})", false).prompt, "one");
  EXPECT_EQ(ok(R"({"messages":[{"role":"developer","content":"d"},{"role":"user","content":"u"}],
                   "max_completion_tokens":5})").max_tokens, 5);
}

TEST(ServerApi, MalformedBodies) {
  for (const char* body : {"", "{", "{\"messages\": [", "not json", "\xff\xfe", "{\"a\":1}}", "[1,2"}) {
    ApiError e = err(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_NE(e.message.find("not valid JSON"), std::string::npos) << body;
  }
  EXPECT_NE(err("[]").message.find("must be a JSON object"), std::string::npos);
  EXPECT_NE(err("42").message.find("must be a JSON object"), std::string::npos);
  // Nesting past kMaxJsonDepth is refused before any value is built (copying, printing and
  // comparing one recurse per level): 100,000 levels, as a hostile client sent, and 129; 128 is
  // read (and then refused for what it holds, not for its depth).
  for (int depth : {100000, kMaxJsonDepth + 1}) {
    const std::string deep = R"({"messages": [{"role": "user", "content": "x"}], "stop": )" + std::string(depth - 1, '[') +
                             std::string(depth - 1, ']') + "}";
    const ApiError e = err(deep);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.message, fmt::format("the request body nests arrays and objects deeper than {} levels", kMaxJsonDepth));
  }
  const std::string ok128 = R"({"messages": [{"role": "user", "content": "x"}], "stop": )" +
                            std::string(kMaxJsonDepth - 1, '[') + std::string(kMaxJsonDepth - 1, ']') + "}";
  EXPECT_EQ(err(ok128).param, "stop");
}

// Brackets inside strings (escaped quotes too) are text, not nesting.
TEST(ServerApi, JsonNestingCountsOnlyStructure) {
  EXPECT_EQ(json_nesting(R"({"a": [1, {"b": []}]})"), 4);
  EXPECT_EQ(json_nesting(R"(["[[[[", "\"[[[", {}])"), 2);
  EXPECT_EQ(json_nesting("1"), 0);
  EXPECT_EQ(json_nesting(std::string(1000, '['), 10), 10);  // counting stops at the bound
  EXPECT_TRUE(parse_json(std::string(200, '[') + std::string(200, ']')).is_discarded());
  EXPECT_EQ(parse_json("[[1]]").dump(), "[[1]]");
}

TEST(ServerApi, WrongTypesNameTheField) {
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"messages":"hi"})", "messages"},
      {R"({})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[42]})", "messages[0]"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"tool","content":"x"}]})", "messages[0].tool_call_id"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", "messages[0].tool_calls"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})", "tools[0].function.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]})", "tools[0].type"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"always"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"parallel_tool_calls":"yes"})", "parallel_tool_calls"},
      {R"({"messages":[{"role":1,"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"5"})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":3})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":-0.1})", "top_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"seed":"1"})", "seed"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":{}})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":2})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"model":7})", "model"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":3})", "logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":-1})", "top_logprobs"},
  };
  for (const auto& c : cases) {
    ApiError e = err(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  EXPECT_EQ(err(R"({"prompt":42})", false).param, "prompt");
  EXPECT_EQ(err(R"({"prompt":[]})", false).param, "prompt");
  EXPECT_EQ(err(R"({"prompt":[1,"a"]})", false).param, "prompt");
  EXPECT_EQ(err(R"({"prompt":[[1,2],[]]})", false).param, "prompt");
  EXPECT_EQ(err(R"({"prompt":[-1]})", false).param, "prompt");
  EXPECT_EQ(err(R"({"prompt":[{"a":1}]})", false).param, "prompt");
  EXPECT_EQ(err(R"({"prompt":["a","b"],"stream":true})", false).param, "prompt");
  EXPECT_EQ(err(R"({"prompt":"x","echo":1})", false).param, "echo");
  EXPECT_EQ(err(R"({"messages":[{"role":"user","content":"x"}],"echo":true})").param, "echo");
  EXPECT_EQ(err(R"({"prompt":"x","max_tokens":0})", false).param, "max_tokens");
  EXPECT_EQ(err(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(err(R"({"messages":[]})", false).param, "prompt");
  EXPECT_EQ(err(R"({"prompt":"x","logprobs":6})", false).param, "logprobs");
  EXPECT_EQ(err(R"({"prompt":"x","logprobs":true})", false).param, "logprobs");
}

// Log-probabilities as OpenAI asks for them: chat logprobs (bool) + top_logprobs (0-20),
// completions logprobs (0-5); off by default.
// OpenAI's logit_bias, presence_penalty and frequency_penalty reach the sampler; a value of the
// wrong type or range is a 400 naming the field.
TEST(ServerApi, PenaltiesAndLogitBias) {
  ServedModel m = served();
  m.n_vocab = 1000;
  const auto parse = [&](const std::string& extra) {
    return parse_completion_request(R"({"messages":[{"role":"user","content":"x"}])" + extra + "}", true, m);
  };
  const CompletionRequest r = test_support::expect_value(
      parse(R"(,"logit_bias":{"5":-100,"999":2.5},"presence_penalty":0.5,"frequency_penalty":-1)"), "penalties");
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{5, -100.f}, {999, 2.5f}}));
  EXPECT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(r.sampling.frequency_penalty, -1.f);
  for (const auto& [extra, param] : std::vector<std::pair<std::string, std::string>>{
           {R"(,"logit_bias":"x")", "logit_bias"},
           {R"(,"logit_bias":[1])", "logit_bias"},
           {R"(,"logit_bias":{"a":1})", "logit_bias"},
           {R"(,"logit_bias":{"1000":1})", "logit_bias"},
           {R"(,"logit_bias":{"-1":1})", "logit_bias"},
           {R"(,"logit_bias":{"1":101})", "logit_bias"},
           {R"(,"logit_bias":{"1":"1"})", "logit_bias"},
           {R"(,"presence_penalty":2.5)", "presence_penalty"},
           {R"(,"frequency_penalty":"1")", "frequency_penalty"}}) {
    const ApiError e = test_support::expect_error(parse(extra), extra);
    EXPECT_EQ(e.status, 400) << extra;
    EXPECT_EQ(e.param, param) << extra << ": " << e.message;
  }
}

TEST(ServerApi, LogprobsFields) {
  EXPECT_EQ(ok(R"({"messages":[{"role":"user","content":"x"}]})").logprobs, -1);
  EXPECT_EQ(ok(R"({"messages":[{"role":"user","content":"x"}],"logprobs":false})").logprobs, -1);
  EXPECT_EQ(ok(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})").logprobs, 0);
  EXPECT_EQ(ok(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":20})").logprobs, 20);
  EXPECT_EQ(ok(R"({"prompt":"x","logprobs":null})", false).logprobs, -1);
  EXPECT_EQ(ok(R"({"prompt":"x","logprobs":0})", false).logprobs, 0);
  EXPECT_EQ(ok(R"({"prompt":"x","logprobs":5})", false).logprobs, 5);
}

// Completions' prompts as lm-eval's local-completions sends them: token ids, several prompts (a
// choice each), echo with no new token.
TEST(ServerApi, PromptsAsTextIdsAndSeveral) {
  const CompletionRequest ids = ok(R"({"prompt":[5,6,7],"echo":true,"max_tokens":0,"logprobs":1})", false);
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_TRUE(ids.echo);
  EXPECT_EQ(ids.max_tokens, 0);
  const CompletionRequest several = ok(R"({"prompt":[[1,2],"text",[3]]})", false);
  ASSERT_EQ(several.prompts.size(), 3u);
  EXPECT_EQ(several.prompts[0].ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(several.prompts[1].text, "text");
  EXPECT_TRUE(several.prompts[1].ids.empty());
  EXPECT_EQ(several.prompts[2].ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(several.prompt_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(several.echo);
  std::string many = R"({"prompt":[)";
  for (size_t i = 0; i <= kMaxPrompts; ++i) many += std::string(i ? "," : "") + "\"p\"";
  EXPECT_EQ(err(many + "]}", false).param, "prompt");
}

TEST(ServerApi, AbsurdMaxTokens) {
  for (const char* mt : {"0", "-1", "257", "1000000000000", "1e300", "18446744073709551615"}) {
    ApiError e = err(std::string(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":)") + mt + "}");
    EXPECT_EQ(e.status, 400) << mt;
    EXPECT_EQ(e.param, "max_tokens") << mt;
  }
  EXPECT_EQ(ok(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":256})").max_tokens, 256);
}

TEST(ServerApi, UnknownModelIs404) {
  ApiError e = err(R"({"model":"gpt-4","messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_NE(e.message.find("gpt-4"), std::string::npos);
  EXPECT_NE(e.message.find("smol"), std::string::npos);
}

TEST(ServerApi, ErrorShape) {
  nlohmann::json j = error_json(ApiError{400, "bad", "invalid_request_error", "stop", ""});
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "stop");
  EXPECT_TRUE(j["error"]["code"].is_null());
  // Invalid UTF-8 in a message never throws.
  EXPECT_NO_THROW(error_body(ApiError{400, "bad \xff byte", "x", "", ""}));
}

TEST(ServerApi, ResponseShapes) {
  ResponseMeta m{"chatcmpl-1", 123, "smol", true};
  auto c = completion_json(m, "hi", FinishReason::eog, {5, 2});
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["usage"]["total_tokens"], 7);
  auto k = chunk_json(m, "h", std::nullopt);
  EXPECT_EQ(k["object"], "chat.completion.chunk");
  EXPECT_EQ(k["choices"][0]["delta"]["content"], "h");
  EXPECT_TRUE(k["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(chunk_json(m, "", FinishReason::context)["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(usage_chunk_json(m, {1, 1})["choices"].empty());
  ResponseMeta t{"cmpl-1", 123, "smol", false};
  EXPECT_EQ(completion_json(t, "x", FinishReason::length, {1, 1})["choices"][0]["text"], "x");
  EXPECT_EQ(chunk_json(t, "y", std::nullopt)["object"], "text_completion");
  EXPECT_TRUE(c["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST(ServerApi, LogprobsShapes) {
  std::string path = test_support::model_path(test_support::kSmolLM2);
  if (path.empty()) GTEST_SKIP() << "SmolLM2 not installed";
  auto model = load_model(path);
  Tokenizer tok(*model->file);
  const std::vector<int32_t> ids = tok.encode("Hello world", false, false);
  ASSERT_GE(ids.size(), 2u);
  std::vector<TokenLogprobs> lps;
  for (int32_t id : ids) lps.push_back({id, -0.5f, {{id, -0.5f}, {ids[0] == id ? ids[1] : ids[0], -1.5f}}});
  const json chat = logprobs_json(true, lps, tok);
  ASSERT_EQ(chat["content"].size(), ids.size());
  std::string joined;
  for (const json& e : chat["content"]) {
    joined += e["token"].get<std::string>();
    EXPECT_EQ(e["logprob"], -0.5f);
    EXPECT_EQ(e["bytes"].size(), e["token"].get<std::string>().size());
    EXPECT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["top_logprobs"][1]["logprob"], -1.5f);
  }
  EXPECT_EQ(joined, "Hello world");
  EXPECT_TRUE(chat["refusal"].is_null());
  int64_t offset = 10;
  const json text = logprobs_json(false, lps, tok, &offset);
  ASSERT_EQ(text["tokens"].size(), ids.size());
  EXPECT_EQ(text["text_offset"][0], 10);
  EXPECT_EQ(text["text_offset"][1], 10 + static_cast<int64_t>(text["tokens"][0].get<std::string>().size()));
  EXPECT_EQ(offset, 10 + static_cast<int64_t>(std::string("Hello world").size()));  // advanced for the next chunk
  EXPECT_EQ(text["token_logprobs"][1], -0.5f);
  EXPECT_EQ(text["top_logprobs"][0].size(), 2u);
  std::vector<TokenLogprobs> echoed = lps;  // echo: the first prompt token has no log-probability
  echoed[0].known = false;
  echoed[0].top.clear();
  const json e = logprobs_json(false, echoed, tok);
  EXPECT_TRUE(e["token_logprobs"][0].is_null());
  EXPECT_TRUE(e["top_logprobs"][0].is_null());
  EXPECT_EQ(e["token_logprobs"][1], -0.5f);
  EXPECT_EQ(e["tokens"][0], text["tokens"][0]);
  ResponseMeta m{"chatcmpl-1", 123, "smol", true};
  EXPECT_EQ(completion_json(m, "x", FinishReason::eog, {1, 1}, chat)["choices"][0]["logprobs"], chat);
  EXPECT_EQ(chunk_json(m, "x", std::nullopt, chat)["choices"][0]["logprobs"], chat);
}

TEST(ServerApi, PrepareChecksTheContext) {
  std::string path = test_support::model_path(test_support::kSmolLM2);
  if (path.empty()) GTEST_SKIP() << "SmolLM2 not installed";
  auto model = load_model(path);
  Tokenizer tok(*model->file);
  ServedModel sm = served();
  sm.n_ctx = 64;
  sm.chat_template = model->file->opt_string("tokenizer.chat_template").value_or("");

  auto p = prepare_request(ok(R"({"messages":[{"role":"user","content":"hi"}]})"), tok, sm, 9);
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(p));
  auto& pr = std::get<PreparedRequest>(p);
  EXPECT_EQ(pr.gen.max_tokens, 64 - static_cast<int64_t>(pr.prompt.size()));  // chat default: fill the context
  EXPECT_EQ(pr.gen.sampling.seed, 9u);

  auto q = prepare_request(ok(R"({"prompt":"The capital","seed":3})", false), tok, sm, 9);
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(q));
  EXPECT_EQ(std::get<PreparedRequest>(q).gen.max_tokens, kCompletionsDefaultMaxTokens);
  EXPECT_EQ(std::get<PreparedRequest>(q).gen.sampling.seed, 3u);

  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "word ";
  auto l = prepare_request(ok(R"({"prompt":")" + long_prompt + R"("})", false), tok, sm, 0);
  ASSERT_TRUE(std::holds_alternative<ApiError>(l));
  EXPECT_EQ(std::get<ApiError>(l).code, "context_length_exceeded");
  EXPECT_EQ(std::get<ApiError>(l).status, 400);

  auto e = prepare_request(ok(R"({"prompt":""})", false), tok, sm, 0);
  EXPECT_TRUE(std::holds_alternative<ApiError>(e));

  // Token ids are taken as they are (no start token), echo keeps the prompt's text and asks for
  // its logprobs; an id past the vocabulary is a 400.
  const std::vector<int32_t> hello = tok.encode("Hello world", false, false);
  std::string body = R"({"prompt":[)";
  for (size_t i = 0; i < hello.size(); ++i) body += (i ? "," : "") + std::to_string(hello[i]);
  auto h = prepare_request(ok(body + R"(],"echo":true,"logprobs":1,"max_tokens":1})", false), tok, sm, 0);
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(h));
  EXPECT_EQ(std::get<PreparedRequest>(h).prompt, hello);
  EXPECT_EQ(std::get<PreparedRequest>(h).echo, "Hello world");
  EXPECT_TRUE(std::get<PreparedRequest>(h).gen.prompt_logprobs);
  EXPECT_EQ(std::get<PreparedRequest>(h).gen.n_logprobs, 1);
  auto past = prepare_request(ok(R"({"prompt":[1999999]})", false), tok, sm, 0);
  ASSERT_TRUE(std::holds_alternative<ApiError>(past));
  EXPECT_EQ(std::get<ApiError>(past).param, "prompt");

  // Tokenizers in vLLM's shapes (lm-eval's remote tokenizer).
  const TokenizeRequest vr = std::get<TokenizeRequest>(parse_tokenize_request(R"({"prompt":"Hello world","add_special_tokens":false})"));
  EXPECT_TRUE(vr.vllm);
  const json vt = tokenize_json(vr, tok, 64);
  EXPECT_EQ(vt["tokens"], json(hello));
  EXPECT_EQ(vt["count"], hello.size());
  EXPECT_EQ(vt["max_model_len"], 64);
  EXPECT_FALSE(tokenize_json(std::get<TokenizeRequest>(parse_tokenize_request(R"({"content":"Hello world"})")), tok, 64)
                   .contains("count"));
  const json info = tokenizer_info_json(sm, tok);
  EXPECT_EQ(info["eos_token"], tok.token_to_piece(tok.eos()));
  EXPECT_EQ(info["model_max_length"], 64);
  EXPECT_EQ(info["chat_template"], sm.chat_template);
}
