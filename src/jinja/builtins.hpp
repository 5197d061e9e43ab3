// What templates call: filters (x | trim), tests (x is defined), the methods of strings, dicts and
// lists (x.strip(), d.items()), attribute and item access, the global functions (range,
// namespace, raise_exception, strftime_now, dict) and tojson's JSON, written as Python's
// json.dumps writes it (", " and ": ", non-ASCII kept) as Hugging Face's templates expect.
#pragma once
#include <string>

#include "jinja/context.hpp"
#include "jinja/value.hpp"

namespace ember::jinja {

// The items a loop or filter walks: a list's, a dict's keys, a string's characters (undefined and
// None: none). `line` names the place in errors (0: none).
Value::Array items_of(const Value& v, int line = 0);

Value apply_filter(const std::string& name, const Value& v, Args& args, Context& ctx);
bool apply_test(const std::string& name, const Value& v, Args& args);
// obj.name: a dict's key or method, a string's or list's method; undefined where there is none.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: a dict's key, a list's or string's index (negative from the end); undefined where none.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] of a list or string.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// The global functions, by name.
Context::Scope global_functions(const Limits& limits);
// json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: on one line).
std::string to_json(const Value& v, int indent = -1);

}  // namespace ember::jinja
