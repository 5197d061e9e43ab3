#include "server/json_schema.hpp"

#include <fmt/format.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ember::server {

namespace {

using json = nlohmann::ordered_json;
using Sym = Grammar::Symbol;
using Seq = Grammar::Sequence;

constexpr int kMaxWhitespace = 20;   // bytes of whitespace in a row
constexpr int kMaxIntDigits = 16;    // after the first
constexpr int kMaxFracDigits = 16;
constexpr int kMaxExpDigits = 3;
constexpr int64_t kMaxBound = 10000;  // largest maxLength / maxItems / minItems taken
constexpr int kMaxSchemaDepth = 64;   // schemas inside schemas

// Keywords that only annotate a schema: they constrain nothing.
const std::set<std::string>& annotations() {
  static const std::set<std::string> a = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "readOnly", "writeOnly", "deprecated", "$defs", "definitions",
                                          "strict", "name"};
  return a;
}
const std::set<std::string>& supported() {
  static const std::set<std::string> s = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                          "maxItems", "minLength", "maxLength", "enum", "const", "anyOf", "allOf", "$ref"};
  return s;
}

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(&root), g_(std::make_shared<Grammar>()) {}

  // Compiles further schemas into the same grammar (SchemaGrammarBuilder), each with its own
  // $refs.
  int another(const json& root) {
    root_ = &root;
    refs_.clear();
    return schema(root, "");
  }
  Grammar& grammar() { return *g_; }

  std::shared_ptr<const Grammar> finish(int rule) {
    // A schema that refers to itself before any value is written ({"$ref": "#/$defs/a"} with a
    // = {"$ref": "#/$defs/a"}, or through anyOf) describes no JSON text: refused with its path,
    // before a request takes a sequence. (Rules of $refs are named by their path.)
    const std::string lr = g_->left_recursive_rule();
    if (!lr.empty())
      throw SchemaError(fmt::format("the schema refers to itself before any value is written (left recursion), so no "
                                    "JSON text can match it (at {})", lr.rfind('#', 0) == 0 ? lr : "#" + lr));
    g_->finish(rule);
    GrammarMatcher first(g_);  // the readings of the empty text: a bound broken at once is the schema's
    return g_;
  }

  int schema(const json& s, const std::string& at) {
    // Nesting (through $refs too, whose targets are compiled where first used) is bounded, so
    // that a client's schema cannot exhaust the stack.
    if (depth_ >= kMaxSchemaDepth) fail(at, fmt::format("the schema nests deeper than {} levels", kMaxSchemaDepth));
    ++depth_;
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      fail(at, "the schema 'false' admits no value");
    }
    if (!s.is_object()) fail(at, fmt::format("a schema must be an object or a boolean, got {}", s.type_name()));
    for (const auto& [k, v] : s.items())
      if (!supported().count(k) && !annotations().count(k))
        fail(at, fmt::format("the schema feature '{}' is not supported", k));
    if (auto r = s.find("$ref"); r != s.end()) {
      for (const auto& [k, v] : s.items())
        if (k != "$ref" && supported().count(k)) fail(at, fmt::format("'{}' beside '$ref' is not supported", k));
      return ref(*r, at);
    }
    if (auto c = s.find("const"); c != s.end()) return g_->add_literal(c->dump());
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) fail(at + "/enum", "'enum' must be a nonempty array");
      std::vector<std::string> texts;
      for (const json& v : *e) texts.push_back(v.dump());
      return g_->add_choice(at + "/enum", std::move(texts));
    }
    if (auto a = s.find("anyOf"); a != s.end()) {
      if (!a->is_array() || a->empty()) fail(at + "/anyOf", "'anyOf' must be a nonempty array");
      const int r = g_->add_rule(at + "/anyOf");
      for (size_t i = 0; i < a->size(); ++i)
        g_->add_alternative(r, {Sym::ref(schema((*a)[i], fmt::format("{}/anyOf/{}", at, i)))});
      return r;
    }
    if (auto a = s.find("allOf"); a != s.end()) {
      if (!a->is_array() || a->size() != 1) fail(at + "/allOf", "'allOf' is supported with exactly one schema");
      return schema((*a)[0], at + "/allOf/0");
    }
    auto t = s.find("type");
    if (t == s.end()) {
      if (s.contains("properties") || s.contains("additionalProperties")) return object(s, at);
      if (s.contains("items")) return array(s, at);
      return any_value();
    }
    if (t->is_string()) return typed(t->get<std::string>(), s, at);
    if (!t->is_array() || t->empty()) fail(at + "/type", "'type' must be a string or a nonempty array of strings");
    const int r = g_->add_rule(at + "/type");
    for (const json& one : *t) {
      if (!one.is_string()) fail(at + "/type", "'type' must hold strings");
      g_->add_alternative(r, {Sym::ref(typed(one.get<std::string>(), s, at))});
    }
    return r;
  }

  // Any JSON object (json_object).
  int any_object() {
    if (any_object_ < 0) {
      any_object_ = g_->add_rule("object");
      free_object(any_object_, -1);
    }
    return any_object_;
  }

 private:
  [[noreturn]] static void fail(const std::string& at, const std::string& what) {
    constexpr size_t kMaxPath = 160;  // of a deep path, its end
    const std::string path = at.size() > kMaxPath ? "..." + at.substr(at.size() - kMaxPath) : at;
    throw SchemaError(fmt::format("{} (at {})", what, path.empty() ? "#" : "#" + path));
  }

  int typed(const std::string& type, const json& s, const std::string& at) {
    if (type == "object") return object(s, at);
    if (type == "array") return array(s, at);
    if (type == "string") {
      const int64_t lo = bound(s, "minLength", 0, at), hi = bound(s, "maxLength", -1, at);
      if (hi >= 0 && hi < lo) fail(at, "'maxLength' is below 'minLength'");
      return string(lo, hi);
    }
    if (type == "number") return number();
    if (type == "integer") return integer();
    if (type == "boolean") {
      const int r = g_->add_rule("boolean");
      for (const char* v : {"true", "false"}) {
        Seq q;
        Grammar::append_literal(q, v);
        g_->add_alternative(r, q);
      }
      return r;
    }
    if (type == "null") return g_->add_literal("null");
    fail(at + "/type", fmt::format("unknown type '{}'", type));
  }

  static int64_t bound(const json& s, const char* key, int64_t dflt, const std::string& at) {
    auto it = s.find(key);
    if (it == s.end()) return dflt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      fail(at + "/" + key, fmt::format("'{}' must be a nonnegative integer", key));
    if (it->get<int64_t>() > kMaxBound) fail(at + "/" + key, fmt::format("'{}' above {} is not supported", key, kMaxBound));
    return it->get<int64_t>();
  }

  int ref(const json& r, const std::string& at) {
    if (!r.is_string()) fail(at + "/$ref", "'$ref' must be a string");
    const std::string p = r.get<std::string>();
    if (auto m = refs_.find(p); m != refs_.end()) return m->second;
    if (!(p.rfind("#/$defs/", 0) == 0 || p.rfind("#/definitions/", 0) == 0))
      fail(at + "/$ref", fmt::format("'$ref' '{}' is not supported (only #/$defs/... and #/definitions/...)", p));
    const json* target = nullptr;
    try {
      target = &root_->at(json::json_pointer(p.substr(1)));
    } catch (const json::exception&) {
      fail(at + "/$ref", fmt::format("'$ref' '{}' names nothing in the schema", p));
    }
    const int rule = g_->add_rule(p);
    refs_[p] = rule;  // before its body: a schema may refer to itself
    g_->add_alternative(rule, {Sym::ref(schema(*target, p.substr(1)))});
    return rule;
  }

  // Whitespace between tokens: at most kMaxWhitespace bytes.
  int ws() {
    if (ws_ < 0) ws_ = repeat("ws", Sym::bytes(ByteSet::of(" \t\n\r")), {}, 0, kMaxWhitespace);
    return ws_;
  }

  // `item` (sep item)*, between lo and hi times (hi < 0: no limit).
  int repeat(const std::string& name, const Sym& item, const Seq& sep, int64_t lo, int64_t hi) {
    // tail(k): (sep item) between max(lo - 1 - k, 0) and hi - 1 - k more times, built from the end.
    const int r = g_->add_rule(name);
    Seq with_sep = sep;
    with_sep.push_back(item);
    int more;  // the (sep item) copies after the first item
    if (hi < 0) {
      const int star = g_->add_rule(name + "*");
      Seq loop = with_sep;
      loop.push_back(Sym::ref(star));
      g_->add_alternative(star, loop);
      g_->add_alternative(star, {});
      more = star;
      for (int64_t k = 1; k < lo; ++k) more = chain(name, with_sep, more, false);
    } else {
      more = g_->add_rule(name + "$");
      g_->add_alternative(more, {});
      for (int64_t k = hi - 1; k >= 1; --k) more = chain(name, with_sep, more, k >= lo);
    }
    if (hi != 0) {
      Seq first = {item, Sym::ref(more)};
      g_->add_alternative(r, first);
    }
    if (lo == 0) g_->add_alternative(r, {});
    return r;
  }
  // A rule: `seq` then `next`, or (optional) nothing.
  int chain(const std::string& name, const Seq& seq, int next, bool optional) {
    const int r = g_->add_rule(name);
    Seq s = seq;
    s.push_back(Sym::ref(next));
    g_->add_alternative(r, s);
    if (optional) g_->add_alternative(r, {});
    return r;
  }

  // One character of a JSON string: printable ASCII but " and \, an escape, or a valid UTF-8
  // sequence.
  int character() {
    if (char_ >= 0) return char_;
    char_ = g_->add_rule("char");
    const ByteSet cont = ByteSet::range(0x80, 0xBF);
    g_->add_alternative(char_, {Sym::bytes(ascii_plain())});
    Seq esc = {Sym::bytes(ByteSet::of("\\")), Sym::bytes(ByteSet::of("\"\\/bfnrt"))};
    g_->add_alternative(char_, esc);
    ByteSet hex = ByteSet::range('0', '9');
    hex.add_range('a', 'f').add_range('A', 'F');
    g_->add_alternative(char_, {Sym::bytes(ByteSet::of("\\")), Sym::bytes(ByteSet::of("u")), Sym::bytes(hex),
                                Sym::bytes(hex), Sym::bytes(hex), Sym::bytes(hex)});
    g_->add_alternative(char_, {Sym::bytes(ByteSet::range(0xC2, 0xDF)), Sym::bytes(cont)});
    g_->add_alternative(char_, {Sym::bytes(ByteSet().add(0xE0)), Sym::bytes(ByteSet::range(0xA0, 0xBF)), Sym::bytes(cont)});
    ByteSet e_plain = ByteSet::range(0xE1, 0xEC);
    e_plain.add_range(0xEE, 0xEF);
    g_->add_alternative(char_, {Sym::bytes(e_plain), Sym::bytes(cont), Sym::bytes(cont)});
    g_->add_alternative(char_, {Sym::bytes(ByteSet().add(0xED)), Sym::bytes(ByteSet::range(0x80, 0x9F)), Sym::bytes(cont)});
    g_->add_alternative(char_, {Sym::bytes(ByteSet().add(0xF0)), Sym::bytes(ByteSet::range(0x90, 0xBF)), Sym::bytes(cont),
                                Sym::bytes(cont)});
    g_->add_alternative(char_, {Sym::bytes(ByteSet::range(0xF1, 0xF3)), Sym::bytes(cont), Sym::bytes(cont), Sym::bytes(cont)});
    g_->add_alternative(char_, {Sym::bytes(ByteSet().add(0xF4)), Sym::bytes(ByteSet::range(0x80, 0x8F)), Sym::bytes(cont),
                                Sym::bytes(cont)});
    return char_;
  }
  static ByteSet ascii_plain() {
    ByteSet s = ByteSet::range(0x20, 0x7F);
    s.bits['"' >> 6] &= ~(uint64_t{1} << ('"' & 63));
    s.bits['\\' >> 6] &= ~(uint64_t{1} << ('\\' & 63));
    return s;
  }

  int string(int64_t lo, int64_t hi) {
    const auto key = std::make_pair(lo, hi);
    if (auto it = strings_.find(key); it != strings_.end()) return it->second;
    const int chars = repeat(fmt::format("chars{{{},{}}}", lo, hi), Sym::ref(character()), {}, lo, hi);
    const int r = g_->add_rule("string");
    const Sym quote = Sym::bytes(ByteSet::of("\""));
    g_->add_alternative(r, {quote, Sym::ref(chars), quote});
    return strings_[key] = r;
  }

  // "-"? ("0" | [1-9] [0-9]{0,16})
  int integer() {
    if (integer_ >= 0) return integer_;
    const Sym digit = Sym::bytes(ByteSet::range('0', '9'));
    const int digits = repeat("digits", digit, {}, 0, kMaxIntDigits);
    const int natural = g_->add_rule("natural");
    g_->add_alternative(natural, {Sym::bytes(ByteSet::of("0"))});
    g_->add_alternative(natural, {Sym::bytes(ByteSet::range('1', '9')), Sym::ref(digits)});
    integer_ = g_->add_rule("integer");
    g_->add_alternative(integer_, {Sym::bytes(ByteSet::of("-")), Sym::ref(natural)});
    g_->add_alternative(integer_, {Sym::ref(natural)});
    return integer_;
  }

  // integer ("." [0-9]{1,16})? ([eE] [+-]? [0-9]{1,3})?
  int number() {
    if (number_ >= 0) return number_;
    const Sym digit = Sym::bytes(ByteSet::range('0', '9'));
    const int frac_digits = repeat("fraction", digit, {}, 1, kMaxFracDigits);
    const int frac = g_->add_rule("frac");
    g_->add_alternative(frac, {Sym::bytes(ByteSet::of(".")), Sym::ref(frac_digits)});
    g_->add_alternative(frac, {});
    const int exp_digits = repeat("exponent", digit, {}, 1, kMaxExpDigits);
    const int exp = g_->add_rule("exp");
    g_->add_alternative(exp, {Sym::bytes(ByteSet::of("eE")), Sym::bytes(ByteSet::of("+-")), Sym::ref(exp_digits)});
    g_->add_alternative(exp, {Sym::bytes(ByteSet::of("eE")), Sym::ref(exp_digits)});
    g_->add_alternative(exp, {});
    number_ = g_->add_rule("number");
    g_->add_alternative(number_, {Sym::ref(integer()), Sym::ref(frac), Sym::ref(exp)});
    return number_;
  }

  // Any JSON value.
  int any_value() {
    if (any_value_ >= 0) return any_value_;
    any_value_ = g_->add_rule("value");
    g_->add_alternative(any_value_, {Sym::ref(any_object())});
    const int item = g_->add_rule("item");
    g_->add_alternative(item, {Sym::ref(any_value_), Sym::ref(ws())});
    g_->add_alternative(any_value_, {Sym::ref(list("array", item, 0, -1))});
    g_->add_alternative(any_value_, {Sym::ref(string(0, -1))});
    g_->add_alternative(any_value_, {Sym::ref(number())});
    for (const char* v : {"true", "false", "null"}) {
      Seq q;
      Grammar::append_literal(q, v);
      g_->add_alternative(any_value_, q);
    }
    return any_value_;
  }

  // "[" ws (item ("," ws item)*)? "]" with lo..hi items; `item` ends with its whitespace.
  int list(const std::string& name, int item, int64_t lo, int64_t hi) {
    Seq sep;
    Grammar::append_literal(sep, ",");
    sep.push_back(Sym::ref(ws()));
    const int items = repeat(name + " items", Sym::ref(item), sep, lo, hi);
    const int r = g_->add_rule(name);
    g_->add_alternative(r, {Sym::bytes(ByteSet::of("[")), Sym::ref(ws()), Sym::ref(items), Sym::bytes(ByteSet::of("]"))});
    return r;
  }

  int array(const json& s, const std::string& at) {
    const int64_t lo = bound(s, "minItems", 0, at), hi = bound(s, "maxItems", -1, at);
    if (hi >= 0 && hi < lo) fail(at, "'maxItems' is below 'minItems'");
    const auto it = s.find("items");
    const int value = it == s.end() ? any_value() : schema(*it, at + "/items");
    const int item = g_->add_rule(at + "/items");
    g_->add_alternative(item, {Sym::ref(value), Sym::ref(ws())});
    return list(at.empty() ? "array" : at, item, lo, hi);
  }

  // "{" ws (key ws ":" ws value ws ("," ws key ws ":" ws value ws)*)? "}" with free keys and
  // values of rule `value` (< 0: any).
  void free_object(int r, int value) {
    const int member = g_->add_rule("member");
    g_->add_alternative(member, {Sym::ref(string(0, -1)), Sym::ref(ws()), Sym::bytes(ByteSet::of(":")), Sym::ref(ws()),
                                 Sym::ref(value < 0 ? any_value() : value), Sym::ref(ws())});
    Seq sep;
    Grammar::append_literal(sep, ",");
    sep.push_back(Sym::ref(ws()));
    const int members = repeat("members", Sym::ref(member), sep, 0, -1);
    g_->add_alternative(r, {Sym::bytes(ByteSet::of("{")), Sym::ref(ws()), Sym::ref(members), Sym::bytes(ByteSet::of("}"))});
  }

  int object(const json& s, const std::string& at) {
    const int r = g_->add_rule(at.empty() ? "object" : at);
    const auto props = s.find("properties");
    std::set<std::string> required;
    if (auto req = s.find("required"); req != s.end()) {
      if (!req->is_array()) fail(at + "/required", "'required' must be an array of strings");
      for (const json& k : *req) {
        if (!k.is_string()) fail(at + "/required", "'required' must be an array of strings");
        if (props == s.end() || !props->is_object() || !props->contains(k.get<std::string>()))
          fail(at + "/required", fmt::format("required property '{}' has no schema in 'properties'", k.get<std::string>()));
        required.insert(k.get<std::string>());
      }
    }
    if (props == s.end() || props->empty()) {
      const auto extra = s.find("additionalProperties");
      if (extra != s.end() && extra->is_boolean() && !extra->get<bool>()) {
        g_->add_alternative(r, {Sym::bytes(ByteSet::of("{")), Sym::ref(ws()), Sym::bytes(ByteSet::of("}"))});
        return r;
      }
      free_object(r, extra == s.end() || extra->is_boolean() ? -1 : schema(*extra, at + "/additionalProperties"));
      return r;
    }
    if (!props->is_object()) fail(at + "/properties", "'properties' must be an object");
    // tail[k][first]: the properties from k on, `first` when none has been written yet.
    std::vector<std::pair<std::string, const json*>> list;
    for (const auto& [k, v] : props->items()) list.emplace_back(k, &v);
    const size_t n = list.size();
    std::vector<std::array<int, 2>> tail(n + 1);
    for (int f = 0; f < 2; ++f) tail[n][f] = g_->add_literal("}");
    for (size_t k = n; k-- > 0;) {
      const auto& [name, sub] = list[k];
      const int value = schema(*sub, at + "/properties/" + name);
      for (int f = 0; f < 2; ++f) {
        tail[k][f] = g_->add_rule(fmt::format("{}/properties/{}", at, name));
        Seq member;
        if (!f) {
          Grammar::append_literal(member, ",");
          member.push_back(Sym::ref(ws()));
        }
        Grammar::append_literal(member, json(name).dump());
        member.insert(member.end(), {Sym::ref(ws()), Sym::bytes(ByteSet::of(":")), Sym::ref(ws()), Sym::ref(value),
                                     Sym::ref(ws()), Sym::ref(tail[k + 1][0])});
        g_->add_alternative(tail[k][f], member);
        if (!required.count(name)) g_->add_alternative(tail[k][f], {Sym::ref(tail[k + 1][f])});
      }
    }
    g_->add_alternative(r, {Sym::bytes(ByteSet::of("{")), Sym::ref(ws()), Sym::ref(tail[0][1])});
    return r;
  }

  const json* root_;
  std::shared_ptr<Grammar> g_;
  std::map<std::string, int> refs_;
  std::map<std::pair<int64_t, int64_t>, int> strings_;
  int depth_ = 0;
  int ws_ = -1, char_ = -1, integer_ = -1, number_ = -1, any_value_ = -1, any_object_ = -1;
};

}  // namespace

namespace {
// Runs a step of compiling, a grammar's bounds broken in it reported as the schema's error.
template <class F>
auto as_schema_error(F&& f) {
  try {
    return f();
  } catch (const GrammarError& e) {
    throw SchemaError(e.what());
  }
}
}  // namespace

std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema) {
  return as_schema_error([&] {
    Compiler c(schema);
    return c.finish(c.schema(schema, ""));
  });
}

struct SchemaGrammarBuilder::Impl {
  json none;
  Compiler c{none};
};

SchemaGrammarBuilder::SchemaGrammarBuilder() : impl_(std::make_unique<Impl>()) {}
SchemaGrammarBuilder::~SchemaGrammarBuilder() = default;

int SchemaGrammarBuilder::value(const nlohmann::ordered_json& schema) {
  schemas_.push_back(std::make_unique<const nlohmann::ordered_json>(schema));
  return as_schema_error([&] { return impl_->c.another(*schemas_.back()); });
}

Grammar& SchemaGrammarBuilder::grammar() { return impl_->c.grammar(); }

std::shared_ptr<const Grammar> SchemaGrammarBuilder::finish(int root) {
  return as_schema_error([&] { return impl_->c.finish(root); });
}

std::shared_ptr<const Grammar> json_object_grammar() {
  static const std::shared_ptr<const Grammar> g = [] {  // the same for every request: built once
    const nlohmann::ordered_json none;
    Compiler c(none);
    return c.finish(c.any_object());
  }();
  return g;
}

}  // namespace ember::server
