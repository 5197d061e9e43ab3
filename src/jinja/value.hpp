// The values a Jinja template computes with, as Python's Jinja2 sees them: undefined, None,
// booleans, integers, floats, strings (UTF-8; length, indexing and slicing count code points),
// lists, dicts (insertion-ordered, as Python's), namespaces (dicts whose attributes `set` may
// assign) and callables (macros, builtins, bound methods). Lists and dicts are shared by
// reference, as in Python. Printing and comparison follow Python: True, None, 1.0, ['a', 1].
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ember::jinja {

class Value;

// The bounds of the render running on this thread (render.cpp sets them; outside a render they
// are off): the bytes of strings and of list items made count against Limits::max_made (a
// Value's constructor counts them; need_room checks before a builtin makes a large result),
// and a walk of nested values (printing, comparing, JSON) may go kMaxValueDepth levels deep
// (a template can nest a list in itself a million times, or put a namespace inside itself).
void count_made(size_t bytes);  // throws jinja::Error past the bound
void need_room(size_t bytes);   // throws where `bytes` more would pass it
constexpr int kMaxValueDepth = 512;
class NestingGuard {  // one level of a walk; throws past kMaxValueDepth
 public:
  NestingGuard();
  ~NestingGuard();
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;
};

// A call's arguments: positional, then keyword.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

class Value {
 public:
  enum class Kind { undefined, none, boolean, integer, floating, string, array, object, function };
  using Array = std::vector<Value>;
  // Insertion-ordered string-keyed map.
  class Object {
   public:
    const Value* find(std::string_view key) const;
    Value* find(std::string_view key);
    void set(const std::string& key, Value v);
    const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
    size_t size() const { return items_.size(); }
    bool is_namespace = false;  // namespace(): `set ns.attr = ...` may assign

   private:
    friend class Value;
    std::vector<std::pair<std::string, Value>> items_;
    std::unordered_map<std::string, size_t> index_;
  };
  using Function = std::function<Value(Args&)>;

  Value() = default;  // undefined
  // Freeing a list or dict frees what it holds without recursion (a value may nest deeply).
  ~Value();
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  static Value none();
  Value(bool b);
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v);
  Value(double v);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value array(Array items = {});
  static Value tuple(Array items);  // a list that prints as Python's tuple: (1, 2)
  static Value object();
  static Value function(std::string name, Function f);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_int() const { return kind_ == Kind::integer; }
  bool is_float() const { return kind_ == Kind::floating; }
  bool is_number() const { return kind_ == Kind::integer || kind_ == Kind::floating; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }
  bool is_function() const { return kind_ == Kind::function; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const { return kind_ == Kind::floating ? f_ : static_cast<double>(i_); }
  const std::string& as_string() const { return *s_; }
  Array& as_array() const { return *a_; }
  Object& as_object() const { return *o_; }
  const std::string& function_name() const { return *s_; }
  Value call(Args& args) const { return (*fn_)(args); }
  // Whether two values share one list or dict (Python's `is`).
  bool same_as(const Value& o) const;

  // Python's truth: undefined, None, False, 0, 0.0, '' and empty containers are false.
  bool truthy() const;
  // len(): code points of a string, items of a list or dict.
  int64_t length() const;
  // What {{ value }} writes: str(value) (undefined: nothing).
  std::string str() const;
  // repr(value), as Python writes values inside lists and dicts.
  std::string repr() const;
  // Python's ==.
  bool operator==(const Value& o) const;
  // Python's <, for numbers, strings and lists of those; throws jinja::Error for others.
  bool less(const Value& o) const;
  const char* type_name() const;  // Python's name of the type ("str", "int", "dict", ...)

 private:
  // Moves what the last holder of a list or dict holds out of it, to be freed one by one.
  void release_contents();
  Kind kind_ = Kind::undefined;
  bool b_ = false;  // boolean; for an array: a tuple
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;  // string, function name
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
  std::shared_ptr<const Function> fn_;
};

// Python's repr of a float: the shortest digits that read back, 1.0, 1e-05, 1e+16.
std::string float_repr(double v);
// Python's repr of a string: quoted with ' (with " where the text has a ' and no ").
std::string string_repr(std::string_view s);

// Code points of UTF-8 text, and back: string indexing and slicing work on these.
std::vector<std::string_view> code_points(std::string_view s);

}  // namespace ember::jinja
