// Structured output: the byte grammar and its matcher (engine/grammar.hpp), JSON schemas compiled
// into grammars (server/json_schema.hpp), and generation constrained by one.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "engine/generator.hpp"
#include "engine/grammar.hpp"
#include "engine/session.hpp"
#include "server/json_schema.hpp"
#include "support/session_params.hpp"
#include "support/synth_suite.hpp"

using namespace ember;
using server::json_object_grammar;
using server::json_schema_grammar;
using server::SchemaError;
using ojson = nlohmann::ordered_json;

namespace {

// Whether the whole text is a complete sentence of g (every byte accepted on the way).
bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  for (char c : text) {
    if (!m.allows(std::string_view(&c, 1))) return false;
    m.accept(std::string_view(&c, 1));
  }
  return m.complete();
}

// A random sentence of g: random allowed bytes, closing quotes and brackets preferred half the
// time, stopping (when complete) with probability 1/4 per byte.
std::string random_sentence(const std::shared_ptr<const Grammar>& g, std::mt19937& rng) {
  GrammarMatcher m(g);
  std::string out;
  for (int step = 0; step < 4000; ++step) {
    if (m.complete() && (!m.can_continue() || rng() % 4 == 0)) return out;
    std::vector<char> ok, closers;
    for (int b = 0; b < 256; ++b) {
      const char c = static_cast<char>(b);
      if (!m.allows(std::string_view(&c, 1))) continue;
      ok.push_back(c);
      if (c == '"' || c == '}' || c == ']' || c == ',') closers.push_back(c);
    }
    if (ok.empty()) break;
    const std::vector<char>& from = !closers.empty() && rng() % 2 ? closers : ok;
    const char c = from[rng() % from.size()];
    m.accept(std::string_view(&c, 1));
    out.push_back(c);
  }
  ADD_FAILURE() << "no complete sentence after 4000 bytes: " << out;
  return out;
}

const ojson kPerson = ojson::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer"},
    "height": {"type": "number"},
    "member": {"type": "boolean"},
    "role": {"enum": ["admin", "user", "guest \"x\""]},
    "nick": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 3},
    "boss": {"$ref": "#/$defs/Boss"}
  },
  "required": ["name", "age", "role", "tags"],
  "additionalProperties": false,
  "$defs": {"Boss": {"type": "object", "properties": {"id": {"const": 7}, "boss": {"$ref": "#/$defs/Boss"}},
                     "required": ["id"]}}
})");

// Checks a parsed document against kPerson by hand.
void expect_person(const nlohmann::json& j) {
  ASSERT_TRUE(j.is_object());
  static const std::vector<std::string> known = {"name", "age", "height", "member", "role", "nick", "tags", "boss"};
  for (const auto& [k, v] : j.items()) EXPECT_NE(std::find(known.begin(), known.end(), k), known.end()) << k;
  ASSERT_TRUE(j.contains("name") && j["name"].is_string());
  EXPECT_LE(nlohmann::json(j["name"]).get<std::string>().size(), 12u * 4);
  ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer());
  if (j.contains("height")) {
    EXPECT_TRUE(j["height"].is_number());
  }
  if (j.contains("member")) {
    EXPECT_TRUE(j["member"].is_boolean());
  }
  ASSERT_TRUE(j.contains("role"));
  const std::string role = j["role"].get<std::string>();
  EXPECT_TRUE(role == "admin" || role == "user" || role == "guest \"x\"") << role;
  if (j.contains("nick")) {
    EXPECT_TRUE(j["nick"].is_null() || j["nick"].is_string());
  }
  ASSERT_TRUE(j.contains("tags") && j["tags"].is_array());
  EXPECT_GE(j["tags"].size(), 1u);
  EXPECT_LE(j["tags"].size(), 3u);
  for (const nlohmann::json* b = j.contains("boss") ? &j["boss"] : nullptr; b;
       b = b->contains("boss") ? &(*b)["boss"] : nullptr)
    EXPECT_EQ((*b)["id"], 7);
}

}  // namespace

TEST(Grammar, LiteralsAlternativesAndCompletion) {
  auto g = std::make_shared<Grammar>();
  const int yes = g->add_literal("yes"), no = g->add_literal("no");
  const int root = g->add_rule("root");
  g->add_alternative(root, {Grammar::Symbol::ref(yes)});
  g->add_alternative(root, {Grammar::Symbol::ref(no)});
  g->finish(root);
  EXPECT_TRUE(matches(g, "yes"));
  EXPECT_TRUE(matches(g, "no"));
  EXPECT_FALSE(matches(g, "ye"));
  EXPECT_FALSE(matches(g, "yess"));
  GrammarMatcher m(g);
  EXPECT_TRUE(m.allows("y"));
  EXPECT_TRUE(m.allows("ye"));
  EXPECT_FALSE(m.allows("x"));
  EXPECT_FALSE(m.allows(""));
  m.accept("n");
  EXPECT_FALSE(m.complete());
  EXPECT_THROW(m.accept("x"), Error);
  m.accept("o");
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.can_continue());
}

TEST(Grammar, RefusesBrokenGrammars) {
  Grammar empty;
  const int r = empty.add_rule("r");
  EXPECT_THROW(empty.finish(r), Error);  // no alternative
  // Left recursion, directly and through a rule that may match nothing, is refused at finish()
  // with the rule's name; recursion after a byte is not.
  auto left = std::make_shared<Grammar>();
  const int l = left->add_rule("l");
  left->add_alternative(l, {Grammar::Symbol::ref(l), Grammar::Symbol::bytes(ByteSet::of("a"))});
  EXPECT_EQ(left->left_recursive_rule(), "l");
  EXPECT_THROW(left->finish(l), Error);
  Grammar hidden;
  const int h = hidden.add_rule("h"), e = hidden.add_rule("maybe-empty"), m = hidden.add_rule("m");
  hidden.add_alternative(e, {});
  hidden.add_alternative(e, {Grammar::Symbol::bytes(ByteSet::of(" "))});
  hidden.add_alternative(h, {Grammar::Symbol::ref(e), Grammar::Symbol::ref(m)});
  hidden.add_alternative(m, {Grammar::Symbol::ref(h)});
  hidden.add_alternative(m, {Grammar::Symbol::bytes(ByteSet::of("x"))});
  EXPECT_FALSE(hidden.left_recursive_rule().empty());
  EXPECT_THROW(hidden.finish(h), Error);
  Grammar right;
  const int r2 = right.add_rule("r");
  right.add_alternative(r2, {Grammar::Symbol::bytes(ByteSet::of("(")), Grammar::Symbol::ref(r2)});
  right.add_alternative(r2, {Grammar::Symbol::bytes(ByteSet::of(")"))});
  EXPECT_EQ(right.left_recursive_rule(), "");
  right.finish(r2);
}

// An enum of thousands of values shares their prefixes: one reading of the text at a time, and
// exactly the values match. The same alternatives written one by one are as many readings, which
// past kMaxReadings is a GrammarError at the byte that makes them (not at the start).
TEST(Grammar, AChoiceOfThousandsKeepsOneReading) {
  std::vector<std::string> values;
  for (int i = 0; i < 5000; ++i) values.push_back("v" + std::to_string(i));
  auto g = std::make_shared<Grammar>();
  g->finish(g->add_choice("enum", values));
  for (const char* ok : {"v0", "v1", "v10", "v4999", "v123"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"v", "v5000", "v01", "w1", "v49999"}) EXPECT_FALSE(matches(g, bad)) << bad;
  GrammarMatcher m(g);
  m.accept("v1");
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.can_continue());  // v10, v100, ...

  auto flat = std::make_shared<Grammar>();
  const int root = flat->add_rule("root"), each = flat->add_rule("each");
  flat->add_alternative(root, {Grammar::Symbol::bytes(ByteSet::of("[")), Grammar::Symbol::ref(each)});
  for (const std::string& v : values) {
    Grammar::Sequence s;
    Grammar::append_literal(s, v);
    flat->add_alternative(each, s);
  }
  flat->finish(root);
  GrammarMatcher f(flat);  // one reading: "[" first
  EXPECT_FALSE(f.allows("x"));
  try {
    f.allows("[v");
    ADD_FAILURE() << "5000 readings at once were kept";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("more than 4096 readings"), std::string::npos) << e.what();
  }
}

// Every grammar is bounded in size as it is built: past kMaxGrammarSymbols a GrammarError, so that a
// schema's maxItems cannot make gigabytes of rules.
TEST(Grammar, SizeIsBoundedAsItIsBuilt) {
  Grammar g;
  const int r = g.add_rule("r");
  Grammar::Sequence s;
  Grammar::append_literal(s, std::string(1000, 'x'));
  EXPECT_THROW(
      for (size_t i = 0; i <= kMaxGrammarSymbols / 1000; ++i) g.add_alternative(r, s), GrammarError);
  EXPECT_LE(g.n_symbols(), kMaxGrammarSymbols + 1001);
}

// A grammar's states are numbered and their transitions kept: checking every byte again from a
// state the matcher has seen makes no new state.
TEST(Grammar, SeenStatesAreLookups) {
  const auto g = json_schema_grammar(kPerson);
  GrammarMatcher m(g);
  m.accept(R"({"name":"A)");
  for (int b = 0; b < 256; ++b) (void)m.allows(std::string(1, static_cast<char>(b)));
  const size_t known = m.n_states();
  for (int b = 0; b < 256; ++b) (void)m.allows(std::string(1, static_cast<char>(b)));
  m.accept("b");  // inside the string: the same readings as after "A", less one character of maxLength
  m.accept("c");
  for (int b = 0; b < 256; ++b) (void)m.allows(std::string(1, static_cast<char>(b)));
  EXPECT_LE(m.n_states(), known + 40);  // two characters further: a few new states, not one per byte asked
  const size_t now = m.n_states();
  for (int b = 0; b < 256; ++b) (void)m.allows(std::string(1, static_cast<char>(b)));
  EXPECT_EQ(m.n_states(), now);
}

// Valid documents (whitespace, escapes, UTF-8, recursion) are complete sentences; each broken
// one is not.
TEST(JsonSchema, AcceptsValidAndRejectsInvalidDocuments) {
  const auto g = json_schema_grammar(kPerson);
  for (const char* ok : {
           R"({"name":"Ann","age":31,"role":"admin","tags":["a"]})",
           R"({ "name" : "Ann" , "age" : -0 , "height" : 1.5e-3 , "member" : true , "role" : "user" , "tags" : [ "a" , "b" ] })",
           "{\n  \"name\": \"\\u00e9t\\u00E9\\n\\\"\",\n  \"age\": 0,\n  \"role\": \"guest \\\"x\\\"\",\n  \"nick\": null,\n  \"tags\": [\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"]\n}",
           R"({"name":"","age":12,"role":"user","nick":"abcd","tags":["x","y","z"],"boss":{"id":7,"boss":{"id":7}}})",
       })
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {
           R"({"age":31,"name":"Ann","role":"admin","tags":["a"]})",             // out of order (schema order)
           R"({"name":"Ann","role":"admin","tags":["a"]})",                      // age missing
           R"({"name":"Ann","age":31,"role":"root","tags":["a"]})",              // not in the enum
           R"({"name":"Ann","age":31.5,"role":"user","tags":["a"]})",            // not an integer
           R"({"name":"Ann","age":01,"role":"user","tags":["a"]})",              // leading zero
           R"({"name":"Ann","age":1,"role":"user","tags":[]})",                  // minItems 1
           R"({"name":"Ann","age":1,"role":"user","tags":["a","b","c","d"]})",   // maxItems 3
           R"({"name":"Ann","age":1,"role":"user","tags":["abcd"]})",            // maxLength 3
           R"({"name":"Ann Bob Carl Dee","age":1,"role":"user","tags":["a"]})",  // maxLength 12
           R"({"name":"Ann","age":1,"role":"user","tags":["a"],"x":1})",         // additional property
           R"({"name":"Ann","age":1,"role":"user","tags":["a"],"boss":{"id":8}})",  // const
           "{\"name\":\"A\x01\",\"age\":1,\"role\":\"user\",\"tags\":[\"a\"]}",  // control byte
           "{\"name\":\"\xc3\",\"age\":1,\"role\":\"user\",\"tags\":[\"a\"]}",   // broken UTF-8
           R"({"name":"\q","age":1,"role":"user","tags":["a"]})",                // bad escape
           R"({"name":"Ann","age":1,"role":"user","tags":["a"]} )",              // trailing text
           R"( {"name":"Ann","age":1,"role":"user","tags":["a"]})",              // leading text
       })
    EXPECT_FALSE(matches(g, bad)) << bad;
}

// Random sentences of the grammar parse as JSON and satisfy the schema.
TEST(JsonSchema, RandomSentencesValidate) {
  const auto g = json_schema_grammar(kPerson);
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    const std::string text = random_sentence(g, rng);
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
    expect_person(j);
  }
  const auto any = json_object_grammar();
  for (int i = 0; i < 100; ++i) {
    const std::string text = random_sentence(any, rng);
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
    EXPECT_TRUE(j.is_object()) << text;
  }
  EXPECT_TRUE(matches(any, R"({"a":[1,2.5,{"b":null}],"c":"d","e":true,"f":{}})"));
  EXPECT_FALSE(matches(any, R"([1])"));
}

TEST(JsonSchema, RefusesUnsupportedFeaturesByName) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"type":"string","pattern":"^a"})", "'pattern'"},
      {R"({"type":"string","format":"date-time"})", "'format'"},
      {R"({"type":"integer","minimum":3})", "'minimum'"},
      {R"({"oneOf":[{"type":"string"},{"type":"integer"}]})", "'oneOf'"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
      {R"({"type":"object","properties":{"a":{"type":"string","not":{}}}})", "#/properties/a"},
      {R"({"$ref":"http://example.com/s.json"})", "$ref"},
      {R"({"$ref":"#/$defs/Missing"})", "names nothing"},
      {R"({"type":"object","required":["a"]})", "required property 'a'"},
      {R"({"type":"string","maxLength":1000000})", "maxLength"},
      {R"({"type":"color"})", "unknown type"},
      {R"(false)", "admits no value"},
      // A schema that refers to itself before writing anything: refused, naming where.
      {R"({"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}})", "left recursion), so no JSON text can match it (at #/$defs/a)"},
      {R"({"$defs":{"b":{"anyOf":[{"$ref":"#/$defs/b"},{"type":"string"}]}},"$ref":"#/$defs/b"})", "(at #/$defs/b)"},
  };
  // Bounds: nesting (a client's anyOf 258 deep), and the grammar's size (300 arrays of up to
  // 10,000 items each, which once took 3 GB and 18 s to compile), each refused at once by name.
  ojson deep = {{"type", "string"}};
  for (int i = 0; i < 258; ++i) deep = {{"anyOf", ojson::array({deep})}};
  ojson wide = {{"anyOf", ojson::array()}};
  for (int i = 0; i < 300; ++i) wide["anyOf"].push_back({{"type", "array"}, {"items", {{"type", "integer"}}}, {"maxItems", 9999 - i}});
  for (const auto& [schema, want] : std::vector<std::pair<ojson, const char*>>{
           {deep, "the schema nests deeper than 64 levels"}, {wide, "more than 262144 symbols"}}) {
    try {
      json_schema_grammar(schema);
      ADD_FAILURE() << "accepted " << want;
    } catch (const SchemaError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  for (const auto& [schema, want] : cases) {
    try {
      json_schema_grammar(ojson::parse(schema));
      ADD_FAILURE() << "accepted " << schema;
    } catch (const SchemaError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << schema << ": " << e.what();
    }
  }
}

// Generation under a grammar on a synth model (random weights, a byte-level vocabulary): the text
// is always a complete document, whatever the sampling.
TEST(JsonSchema, ConstrainedGenerationGivesValidDocuments) {
  test_support::SynthSuite suite;
  SynthOptions o = synth_preset("tiny");
  o.n_ctx = 512;
  suite.open(o, "ember_json_schema");
  auto vocab = std::make_shared<TokenGrammar>(*suite.tok);
  for (int seed = 0; seed < 6; ++seed) {
    Session s(*suite.model, test_support::session_params(1, 512, 64));
    GenerateParams g = test_support::greedy(400);
    g.ignore_eos = false;
    if (seed > 0) g.sampling.temperature = 1.0f, g.sampling.seed = static_cast<uint64_t>(seed);
    ojson flat = kPerson;  // without the recursive "boss": random weights could nest it past any limit
    flat["properties"].erase("boss");
    g.grammar = json_schema_grammar(flat);
    g.grammar_vocab = vocab;
    std::string text;
    GenerateResult r = generate(s, *suite.tok, suite.tok->encode("person:", true, false), g, [&](std::string_view p) {
      text.append(p);
      return true;
    });
    SCOPED_TRACE(text);
    ASSERT_EQ(r.finish, FinishReason::eog) << "seed " << seed;  // ended by the grammar, not the limit
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(text));
    expect_person(j);
  }
  suite.close();
}
