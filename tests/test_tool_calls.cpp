// Tool calls (server/tool_calls.hpp): each family's format found in real templates; the model's
// text read back into calls in each format (with text around them, several calls, malformed or
// unknown ones left as text); the grammar of a forced choice accepts exactly the calls it should,
// and every text a random walk through it produces reads back as valid calls (so a small model's
// forced call always parses); the generic format's prompt; streaming's held-back text.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "engine/grammar.hpp"
#include "server/json_schema.hpp"
#include "server/tool_calls.hpp"
#include "support/paths.hpp"

using namespace ember;
using namespace ember::server;
using ojson = nlohmann::ordered_json;

namespace {

ToolRequest weather_and_add(ToolChoice::Mode mode = ToolChoice::Mode::automatic, bool parallel = false) {
  ToolRequest r;
  r.tools.push_back({"get_weather", "Get the weather",
                     ojson::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                      "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]})")});
  r.tools.push_back({"add", "Add two integers",
                     ojson::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                      "required": ["a", "b"], "additionalProperties": false})")});
  r.choice.mode = mode;
  r.parallel = parallel;
  return r;
}

std::string template_file(const std::string& name) {
  std::ifstream f(test_support::data_path("chat_templates/" + name));
  EXPECT_TRUE(f.good()) << name;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

bool accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  if (!m.allows(text)) return false;
  m.accept(text);
  return m.complete();
}

// A call's arguments obey the test's schemas.
bool valid_arguments(const ToolCall& c) {
  const ojson a = ojson::parse(c.arguments, nullptr, false);
  if (!a.is_object()) return false;
  if (c.name == "get_weather")
    return a.contains("city") && a["city"].is_string() && (!a.contains("unit") || a["unit"] == "c" || a["unit"] == "f");
  return c.name == "add" && a.size() == 2 && a["a"].is_number_integer() && a["b"].is_number_integer();
}

const ToolFormat kFormats[] = {ToolFormat::hermes, ToolFormat::llama3, ToolFormat::mistral, ToolFormat::generic};

}  // namespace

TEST(ToolCalls, EachFamilysFormatIsFoundInItsTemplate) {
  const std::pair<const char*, ToolFormat> cases[] = {
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::hermes},
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", ToolFormat::hermes},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::llama3},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::llama3},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolFormat::mistral},
      {"HuggingFaceTB-SmolLM2-135M-Instruct.jinja", ToolFormat::generic},
      {"google-gemma-3-it.jinja", ToolFormat::generic},
      {"microsoft-Phi-3.5-mini-instruct.jinja", ToolFormat::generic}};
  for (const auto& [file, want] : cases) EXPECT_EQ(tool_format(template_file(file)), want) << file;
  EXPECT_EQ(tool_format(""), ToolFormat::generic);
}

TEST(ToolCalls, TheModelsTextReadsBackAsCalls) {
  const ToolRequest r = weather_and_add();
  struct Case {
    ToolFormat f;
    std::string text, content;
    std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  };
  const std::vector<Case> cases = {
      {ToolFormat::hermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
       "Let me check.", {{"get_weather", R"({"city":"Paris"})"}}},
      {ToolFormat::hermes, "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>\n<tool_call>\n"
                           "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}\n</tool_call>",
       "", {{"add", R"({"a":1,"b":2})"}, {"get_weather", R"({"city":"Oslo"})"}}},
      {ToolFormat::hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par", 
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par", {}},  // cut off: text
      {ToolFormat::hermes, "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
       "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>", {}},  // not one of the tools
      {ToolFormat::llama3, "{\"name\": \"add\", \"parameters\": {\"a\": 2, \"b\": 3}}", "", {{"add", R"({"a":2,"b":3})"}}},
      {ToolFormat::llama3, "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 2, \"b\": 3}}; "
                           "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
       "", {{"add", R"({"a":2,"b":3})"}, {"get_weather", R"({"city":"Rome"})"}}},
      {ToolFormat::llama3, "{\"answer\": 5} is JSON", "{\"answer\": 5} is JSON", {}},
      {ToolFormat::mistral, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 1}, \"id\": \"abc123def\"}]", "",
       {{"add", R"({"a":1,"b":1})"}}},
      {ToolFormat::generic, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\", \"unit\": \"f\"}}]}",
       "", {{"get_weather", R"({"city":"Lima","unit":"f"})"}}},
      {ToolFormat::generic, "{\"tool_call\": {\"name\": \"add\", \"arguments\": {\"a\": 0, \"b\": 0}}}", "", {{"add", R"({"a":0,"b":0})"}}},
      {ToolFormat::generic, "The weather is fine.", "The weather is fine.", {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(tool_format_name(c.f)) + ": " + c.text);
    const ToolOutput out = parse_tool_output(c.f, r, c.text, "x");
    EXPECT_EQ(out.content, c.content);
    ASSERT_EQ(out.calls.size(), c.calls.size());
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(out.calls[i].name, c.calls[i].first);
      EXPECT_EQ(out.calls[i].arguments, c.calls[i].second);
      EXPECT_EQ(out.calls[i].id, "call_x_" + std::to_string(i));
    }
  }
}

TEST(ToolCalls, AForcedChoicesGrammarTakesExactlyItsCalls) {
  for (ToolFormat f : kFormats) {
    SCOPED_TRACE(tool_format_name(f));
    const auto wrap = [&](const std::vector<std::string>& calls) {
      const char* key = f == ToolFormat::llama3 ? "parameters" : "arguments";
      std::string body;
      for (size_t i = 0; i < calls.size(); ++i) {
        if (i) body += f == ToolFormat::hermes ? "\n</tool_call>\n<tool_call>\n" : f == ToolFormat::llama3 ? "\n" : ", ";
        body += calls[i].substr(0, calls[i].find('|')) + "\"" + key + "\": " + calls[i].substr(calls[i].find('|') + 1) + "}";
      }
      if (f == ToolFormat::hermes) return "<tool_call>\n" + body + "\n</tool_call>";
      if (f == ToolFormat::mistral) return "[TOOL_CALLS][" + body + "]";
      if (f == ToolFormat::generic) return "{\"tool_calls\": [" + body + "]}";
      return body;
    };
    const std::string weather = R"({"name": "get_weather", |{"city": "Paris", "unit": "c"})";
    const std::string add = R"({"name": "add", |{"a": 4, "b": -2})";
    const auto required = tool_call_grammar(f, weather_and_add(ToolChoice::Mode::required));
    EXPECT_TRUE(accepts(required, wrap({weather})));
    EXPECT_TRUE(accepts(required, wrap({add})));
    EXPECT_FALSE(accepts(required, wrap({weather, add})));  // one call unless parallel
    EXPECT_FALSE(accepts(required, wrap({R"({"name": "add", |{"a": 4})"})));                  // b is required
    EXPECT_FALSE(accepts(required, wrap({R"({"name": "add", |{"a": 4, "b": 1.5})"})));        // an integer
    EXPECT_FALSE(accepts(required, wrap({R"({"name": "get_weather", |{"city": "Paris", "unit": "k"})"})));  // enum
    EXPECT_FALSE(accepts(required, wrap({R"({"name": "rm", |{}})"})));
    EXPECT_FALSE(accepts(required, "Sure! " + wrap({weather})));
    ToolRequest named = weather_and_add(ToolChoice::Mode::named);
    named.choice.name = "add";
    EXPECT_TRUE(accepts(tool_call_grammar(f, named), wrap({add})));
    EXPECT_FALSE(accepts(tool_call_grammar(f, named), wrap({weather})));
    const auto parallel = tool_call_grammar(f, weather_and_add(ToolChoice::Mode::required, true));
    EXPECT_TRUE(accepts(parallel, wrap({weather, add, weather})));
  }
  ToolRequest bad = weather_and_add(ToolChoice::Mode::required);
  bad.tools[1].parameters = ojson::parse(R"({"type": "object", "properties": {"a": {"type": "string", "format": "date"}}})");
  try {
    tool_call_grammar(ToolFormat::generic, bad);
    ADD_FAILURE() << "accepted";
  } catch (const SchemaError& e) {
    EXPECT_NE(std::string(e.what()).find("tools[1].function.parameters"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("format"), std::string::npos) << e.what();
  }
}

// Random texts of the grammar (each byte chosen at random among those it allows) read back as
// calls of the request's functions with valid arguments, in every format, parallel or not.
TEST(ToolCalls, EveryTextOfTheGrammarReadsBackAsValidCalls) {
  std::mt19937 rng(3);
  std::string alphabet;
  for (int c = 32; c < 127; ++c) alphabet += static_cast<char>(c);
  alphabet += "\n";
  for (ToolFormat f : kFormats) {
    for (bool parallel : {false, true}) {
      SCOPED_TRACE(std::string(tool_format_name(f)) + (parallel ? " parallel" : ""));
      const ToolRequest r = weather_and_add(ToolChoice::Mode::required, parallel);
      const auto g = tool_call_grammar(f, r);
      int done = 0;
      for (int trial = 0; trial < 60; ++trial) {
        GrammarMatcher m(g);
        std::string text;
        while (text.size() < 4000) {
          if (m.complete() && (!m.can_continue() || rng() % 8 == 0)) break;
          std::string allowed;
          for (char c : alphabet)
            if (m.allows(std::string_view(&c, 1))) allowed += c;
          if (allowed.empty()) break;
          // Close strings and objects sooner than uniform choice would.
          char c = allowed[rng() % allowed.size()];
          for (char pref : std::string("\"}]"))
            if (allowed.find(pref) != std::string::npos && rng() % 3 == 0) c = pref;
          m.accept(std::string_view(&c, 1));
          text += c;
        }
        if (!m.complete()) continue;
        ++done;
        const ToolOutput out = parse_tool_output(f, r, text, "t");
        ASSERT_FALSE(out.calls.empty()) << text;
        EXPECT_EQ(out.content, "") << text;
        if (!parallel) {
          EXPECT_EQ(out.calls.size(), 1u) << text;
        }
        for (const ToolCall& c : out.calls) EXPECT_TRUE(valid_arguments(c)) << c.name << " " << c.arguments << " in " << text;
      }
      EXPECT_GE(done, 40);
    }
  }
}

TEST(ToolCalls, TheGenericFormatDescribesTheToolsAndFoldsInCallsAndResults) {
  ToolRequest r = weather_and_add();
  ChatMessage call{"assistant", ""};
  call.tool_calls = {{"c1", "get_weather", R"({"city": "Paris"})"}, {"c2", "add", R"({"a": 1, "b": 2})"}};
  ChatMessage res1{"tool", "21 C"}, res2{"tool", "3"};
  res1.tool_call_id = "c1";
  res2.tool_call_id = "c2";
  const ToolPrompt p = tool_prompt(ToolFormat::generic, r, {{"system", "Be brief."}, {"user", "Weather? And 1+2?"}, call, res1, res2});
  ASSERT_EQ(p.messages.size(), 4u);
  EXPECT_EQ(p.messages[0].role, "system");
  EXPECT_TRUE(p.messages[0].content.starts_with("Be brief.\n\nYou can call these tools"));
  // Each tool as a signature line, not its schema.
  EXPECT_NE(p.messages[0].content.find("\nget_weather(city: string, unit?: \"c\" | \"f\") - Get the weather\n"),
            std::string::npos)
      << p.messages[0].content;
  EXPECT_NE(p.messages[0].content.find("\nadd(a: integer, b: integer) - Add two integers\n"), std::string::npos);
  EXPECT_EQ(p.messages[0].content.find("maxLength"), std::string::npos);
  EXPECT_NE(p.messages[0].content.find("Otherwise reply to the user as usual."), std::string::npos);
  EXPECT_EQ(p.messages[2].content,
            R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"add","arguments":{"a":1,"b":2}}]})");
  EXPECT_TRUE(p.messages[2].tool_calls.empty());
  EXPECT_EQ(p.messages[3].role, "user");
  EXPECT_EQ(p.messages[3].content,
            "The tool get_weather returned 21 C\nThe tool add returned 3\nNow answer the question (or call another tool).");
  EXPECT_TRUE(p.tools.is_undefined());
  // A named choice: only that tool, and the order to call it; no system message yet: one first.
  r.choice = {ToolChoice::Mode::named, "add"};
  const ToolPrompt q = tool_prompt(ToolFormat::generic, r, {{"user", "1+2?"}});
  ASSERT_EQ(q.messages.size(), 2u);
  EXPECT_EQ(q.messages[0].content.find("get_weather"), std::string::npos);
  EXPECT_NE(q.messages[0].content.find("Call the tool add"), std::string::npos);
  // Native formats: the template gets the tools, the messages as they are.
  const ToolPrompt n = tool_prompt(ToolFormat::hermes, weather_and_add(), {{"user", "x"}, call, res1});
  ASSERT_TRUE(n.tools.is_array());
  EXPECT_EQ(n.tools.as_array().size(), 2u);
  EXPECT_EQ(n.messages.size(), 3u);
  EXPECT_EQ(n.messages[2].name, "get_weather");  // the call's name, where the client left it out
  // tool_choice none: no tools anywhere.
  r.choice.mode = ToolChoice::Mode::none;
  EXPECT_TRUE(tool_prompt(ToolFormat::hermes, r, {{"user", "x"}}).tools.is_undefined());
  EXPECT_EQ(tool_prompt(ToolFormat::generic, r, {{"user", "x"}}).messages.size(), 1u);
}

// The generic format's signature lines stay short whatever the schema: nested objects one level
// deep, arrays, unions, long enums and descriptions cut.
TEST(ToolCalls, SignaturesAreShort) {
  ToolRequest r;
  r.tools.push_back({"search", std::string(300, 'x') + "\nmore lines",
                     ojson::parse(R"({"type": "object", "properties": {
                         "query": {"type": "string", "description": "what to look for, at length"},
                         "filters": {"type": "object", "properties": {"site": {"type": "string"},
                                     "deep": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                                     "required": ["site"]},
                         "tags": {"type": "array", "items": {"type": "string"}},
                         "mode": {"enum": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]},
                         "when": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                         "any": {}}, "required": ["query"]})")});
  r.tools.push_back({"ping", "", ojson::parse(R"({"type": "object"})")});
  const ToolPrompt p = tool_prompt(ToolFormat::generic, r, {{"user", "x"}});
  const std::string& s = p.messages[0].content;
  EXPECT_NE(s.find("\nsearch(query: string, filters?: {site: string, deep?: object}, tags?: array of string, "
                   "mode?: 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | ..., when?: string | null, any?: any) - " +
                   std::string(200, 'x') + "...\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("\nping()\n"), std::string::npos) << s;
  EXPECT_EQ(s.find("more lines"), std::string::npos);
}

TEST(ToolCalls, StreamingHoldsBackWhatMayBeACall) {
  EXPECT_EQ(content_before_calls(ToolFormat::hermes, "Hello there"), 11u);
  EXPECT_EQ(content_before_calls(ToolFormat::hermes, "Hello <tool"), 6u);  // may be <tool_call>
  EXPECT_EQ(content_before_calls(ToolFormat::hermes, "Hi <tool_call>\n{\"na"), 3u);
  EXPECT_EQ(content_before_calls(ToolFormat::mistral, "ok [TOOL"), 3u);
  EXPECT_EQ(content_before_calls(ToolFormat::generic, "  {\"tool"), 0u);
  EXPECT_EQ(content_before_calls(ToolFormat::generic, "Sunny."), 6u);
  EXPECT_EQ(content_before_calls(ToolFormat::generic, "  "), 0u);
  EXPECT_EQ(content_before_calls(ToolFormat::llama3, "<|python"), 0u);
}

// Both routes stream through HeldToolText: text goes out until a call may start, the end gives
// the calls and the held-back text that was none; under a forced choice everything waits.
TEST(ToolCalls, HeldTextGivesContentThenCalls) {
  const ToolRequest r = weather_and_add();
  HeldToolText h(ToolFormat::hermes, r);
  EXPECT_EQ(h.add("Sure, "), "Sure, ");
  EXPECT_EQ(h.add("let me <tool"), "let me ");
  EXPECT_EQ(h.add("_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"), "");
  const HeldToolText::End end = h.finish("x");
  ASSERT_EQ(end.calls.size(), 1u);
  EXPECT_EQ(end.calls[0].name, "get_weather");
  EXPECT_EQ(end.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(end.content, "");

  HeldToolText none(ToolFormat::hermes, r);
  EXPECT_EQ(none.add("a <tool"), "a ");
  EXPECT_EQ(none.add("s> b"), "<tools> b");  // a marker's start that turned out none goes out
  EXPECT_EQ(none.add(" <tool_"), " ");
  const HeldToolText::End text = none.finish("x");  // the end: held-back text that was no call
  EXPECT_TRUE(text.calls.empty());
  EXPECT_EQ(text.content, "<tool_");

  const ToolRequest forced = weather_and_add(ToolChoice::Mode::required);
  HeldToolText all(ToolFormat::generic, forced);
  EXPECT_EQ(all.add("Sunny."), "");
  EXPECT_EQ(all.finish("x").content, "Sunny.");
}
