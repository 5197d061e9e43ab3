#include "jinja/builtins.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <limits>

#include <fmt/format.h>

#include "jinja/error.hpp"
#include "jinja/parser.hpp"

namespace ember::jinja {

namespace {

// The argument at `pos` or named `name` (undefined where not given).
Value arg(const Args& a, size_t pos, const char* name) {
  for (const auto& [k, v] : a.keyword)
    if (k == name) return v;
  return pos < a.positional.size() ? a.positional[pos] : Value();
}

const std::string& need_string(const Value& v, const char* what) {
  if (!v.is_string()) throw Error(fmt::format("{} needs a string, got {}", what, v.type_name()));
  return v.as_string();
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto drop = [&](char c) {
    return chars.is_string() ? chars.as_string().find(c) != std::string::npos : is_ws(c);
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && drop(s[b])) ++b;
  if (right)
    while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = u < 0x80;  // (bytes of non-ASCII letters keep a word going)
    }
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  // The result's size first: a short text with many matches may grow past the render's bound.
  size_t matches = 0;
  if (from.empty()) {
    matches = static_cast<size_t>(Value(s).length()) + 1;
  } else {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + from.size())) ++matches;
  }
  if (count >= 0) matches = std::min(matches, static_cast<size_t>(count));
  if (to.size() > from.size() && matches > 0) need_room(s.size() + matches * (to.size() - from.size()));
  if (from.empty()) {
    std::string out;
    int64_t n = 0;
    for (std::string_view c : code_points(s)) {
      if (count < 0 || n++ < count) out += to;
      out += c;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out += s.substr(pos, f - pos) + to;
    pos = f + from.size();
  }
  return out + s.substr(pos);
}

Value split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Value::Array parts;
  need_room((s.size() / std::max<size_t>(sep.is_string() ? sep.as_string().size() : 1, 1) + 1) * sizeof(Value));
  if (!sep.is_string() || sep.as_string().empty()) {
    if (sep.is_string()) throw Error("split: empty separator");
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_ws(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        std::string rest = s.substr(i);
        while (!rest.empty() && is_ws(rest.back())) rest.pop_back();
        parts.push_back(Value(rest));
        break;
      }
      size_t e = i;
      while (e < s.size() && !is_ws(s[e])) ++e;
      parts.push_back(Value(s.substr(i, e - i)));
      i = e;
    }
    return Value::array(std::move(parts));
  }
  const std::string& d = sep.as_string();
  size_t pos = 0;
  for (;;) {
    const size_t f = maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit ? std::string::npos : s.find(d, pos);
    if (f == std::string::npos) {
      parts.push_back(Value(s.substr(pos)));
      break;
    }
    parts.push_back(Value(s.substr(pos, f - pos)));
    pos = f + d.size();
  }
  return Value::array(std::move(parts));
}

bool starts_or_ends(const std::string& s, const Value& what, bool start) {
  const auto one = [&](const Value& p) {
    const std::string& x = need_string(p, start ? "startswith" : "endswith");
    return s.size() >= x.size() && (start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0);
  };
  if (what.is_array()) return std::any_of(what.as_array().begin(), what.as_array().end(), one);
  return one(what);
}

// str.format with {} / {0} / {name} fields (no format specs).
std::string format(const std::string& f, const Args& a) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (f[i] == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (f[i] == '{') {
      const size_t e = f.find('}', i);
      if (e == std::string::npos) throw Error("format: a '{' is not closed");
      const std::string field = f.substr(i + 1, e - i - 1);
      if (field.find_first_of(":!") != std::string::npos) throw Unsupported("format specs in str.format are not supported");
      Value v;
      if (field.empty()) v = arg(a, next++, "");
      else if (field.size() < 9 &&
               std::all_of(field.begin(), field.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        v = arg(a, std::stoul(field), "");
      else v = arg(a, SIZE_MAX, field.c_str());
      const std::string piece = v.str();
      need_room(out.size() + piece.size());
      out += piece;
      i = e;
    } else {
      out += f[i];
    }
  }
  return out;
}

Value method(const std::string& name, Value::Function f) { return Value::function(name, std::move(f)); }

Value string_method(const std::string& s, const std::string& name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return method(name, [s, name](Args& a) {
      return Value(strip(s, arg(a, 0, "chars"), name != "rstrip", name != "lstrip"));
    });
  if (name == "split")
    return method(name, [s](Args& a) {
      const Value m = arg(a, 1, "maxsplit");
      return split(s, arg(a, 0, "sep"), m.is_int() ? m.as_int() : -1);
    });
  if (name == "startswith" || name == "endswith")
    return method(name, [s, name](Args& a) { return Value(starts_or_ends(s, arg(a, 0, "prefix"), name == "startswith")); });
  if (name == "upper") return method(name, [s](Args&) { return Value(upper(s)); });
  if (name == "lower") return method(name, [s](Args&) { return Value(lower(s)); });
  if (name == "title") return method(name, [s](Args&) { return Value(title(s)); });
  if (name == "capitalize") return method(name, [s](Args&) { return Value(capitalize(s)); });
  if (name == "replace")
    return method(name, [s](Args& a) {
      const Value n = arg(a, 2, "count");
      return Value(replace(s, need_string(arg(a, 0, "old"), "replace"), need_string(arg(a, 1, "new"), "replace"),
                           n.is_int() ? n.as_int() : -1));
    });
  if (name == "find" || name == "rfind" || name == "index")
    return method(name, [s, name](Args& a) {
      const std::string& x = need_string(arg(a, 0, "sub"), name.c_str());
      const size_t f = name == "rfind" ? s.rfind(x) : s.find(x);
      if (f == std::string::npos) {
        if (name == "index") throw Error("substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(code_points(std::string_view(s).substr(0, f)).size()));
    });
  if (name == "count")
    return method(name, [s](Args& a) {
      const std::string& x = need_string(arg(a, 0, "sub"), "count");
      if (x.empty()) return Value(static_cast<int64_t>(code_points(s).size()) + 1);
      int64_t n = 0;
      for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) ++n;
      return Value(n);
    });
  if (name == "join")
    return method(name, [s](Args& a) {
      const Value items = arg(a, 0, "iterable");
      if (!items.is_array()) throw Error("join needs a list");
      std::string out;
      for (size_t i = 0; i < items.as_array().size(); ++i) {
        const std::string& x = need_string(items.as_array()[i], "join");
        need_room(out.size() + s.size() + x.size());
        out += (i ? s : "") + x;
      }
      return Value(out);
    });
  if (name == "format") return method(name, [s](Args& a) { return Value(format(s, a)); });
  if (name == "splitlines")
    return method(name, [s](Args&) {
      Value::Array lines;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t e = s.find_first_of("\r\n", pos);
        if (e == std::string::npos) {
          lines.push_back(Value(s.substr(pos)));
          break;
        }
        lines.push_back(Value(s.substr(pos, e - pos)));
        pos = e + (s[e] == '\r' && e + 1 < s.size() && s[e + 1] == '\n' ? 2 : 1);
      }
      return Value::array(std::move(lines));
    });
  if (name == "removeprefix" || name == "removesuffix")
    return method(name, [s, name](Args& a) {
      const std::string& x = need_string(arg(a, 0, "x"), name.c_str());
      if (name == "removeprefix") return Value(s.rfind(x, 0) == 0 ? s.substr(x.size()) : s);
      return Value(s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0 ? s.substr(0, s.size() - x.size()) : s);
    });
  const auto all = [&](auto pred) {
    return method(name, [s, pred](Args&) {
      return Value(!s.empty() && std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)); }));
    });
  };
  if (name == "isdigit") return all([](unsigned char c) { return std::isdigit(c) != 0; });
  if (name == "isalpha") return all([](unsigned char c) { return std::isalpha(c) != 0; });
  if (name == "isalnum") return all([](unsigned char c) { return std::isalnum(c) != 0; });
  if (name == "isspace") return all([](unsigned char c) { return std::isspace(c) != 0; });
  if (name == "isupper") return method(name, [s](Args&) { return Value(upper(s) == s && lower(s) != s); });
  if (name == "islower") return method(name, [s](Args&) { return Value(lower(s) == s && upper(s) != s); });
  return Value();
}

Value dict_method(const Value& d, const std::string& name) {
  if (name == "items")
    return method(name, [d](Args&) {
      Value::Array out;
      for (const auto& [k, v] : d.as_object().items()) out.push_back(Value::tuple({Value(k), v}));
      return Value::array(std::move(out));
    });
  if (name == "keys")
    return method(name, [d](Args&) {
      Value::Array out;
      for (const auto& [k, v] : d.as_object().items()) out.push_back(Value(k));
      return Value::array(std::move(out));
    });
  if (name == "values")
    return method(name, [d](Args&) {
      Value::Array out;
      for (const auto& [k, v] : d.as_object().items()) out.push_back(v);
      return Value::array(std::move(out));
    });
  if (name == "get")
    return method(name, [d](Args& a) {
      const Value k = arg(a, 0, "key");
      const Value* v = k.is_string() ? d.as_object().find(k.as_string()) : nullptr;
      if (v) return *v;
      const Value def = arg(a, 1, "default");
      return def.is_undefined() ? Value::none() : def;
    });
  return Value();
}


// An attribute path "a.b" (map, selectattr, sort, join, sum, unique).
Value attribute(const Value& v, const Value& path) {
  if (path.is_int()) return get_item(v, path);
  Value cur = v;
  const Value parts = split(need_string(path, "attribute"), Value("."), -1);  // (alive through the loop)
  for (const Value& part : parts.as_array()) cur = get_attr(cur, part.as_string());
  return cur;
}

Args rest(const Args& a, size_t from) {
  Args r;
  for (size_t i = from; i < a.positional.size(); ++i) r.positional.push_back(a.positional[i]);
  r.keyword = a.keyword;
  return r;
}

// select / reject / selectattr / rejectattr.
Value select(const Value& v, const Args& a, bool keep, bool by_attr) {
  Value::Array out;
  const size_t t = by_attr ? 1 : 0;
  const Value test = arg(a, t, "");
  Args targs = rest(a, t + 1);
  for (const Value& x : items_of(v)) {
    const Value subject = by_attr ? attribute(x, arg(a, 0, "attribute")) : x;
    const bool ok = test.is_undefined() ? subject.truthy() : apply_test(need_string(test, "select"), subject, targs);
    if (ok == keep) out.push_back(x);
  }
  return Value::array(std::move(out));
}

std::string indent_text(const std::string& s, const Value& width, bool first, bool blank) {
  if (width.is_int() && width.as_int() < 0) throw Error("indent: the width must not be negative");
  if (width.is_int()) need_room(static_cast<size_t>(width.as_int()));
  const std::string pad = width.is_string() ? width.as_string() : std::string(width.is_int() ? static_cast<size_t>(width.as_int()) : 4, ' ');
  std::string out;
  size_t pos = 0;
  bool first_line = true;
  while (pos <= s.size()) {
    size_t e = s.find('\n', pos);
    const bool last = e == std::string::npos;
    if (last) e = s.size();
    const std::string line = s.substr(pos, e - pos);
    need_room(out.size() + pad.size() + line.size() + 1);
    if (!first_line) out += '\n';
    if ((first || !first_line) && (blank || !line.empty())) out += pad;
    out += line;
    first_line = false;
    if (last) break;
    pos = e + 1;
  }
  return out;
}

void json_string(std::string& out, const std::string& s, bool ascii) {
  out += '"';
  const std::vector<std::string_view> cps = code_points(s);
  for (std::string_view cp : cps) {
    const auto c = static_cast<unsigned char>(cp[0]);
    if (cp.size() == 1) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20 || c == 0x7f) out += fmt::format("\\u{:04x}", c);
          else out += static_cast<char>(c);
      }
      continue;
    }
    if (!ascii) {
      out += cp;
      continue;
    }
    uint32_t u = cp.size() == 2 ? c & 0x1F : cp.size() == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < cp.size(); ++i) u = (u << 6) | (static_cast<unsigned char>(cp[i]) & 0x3F);
    if (u >= 0x10000) {
      u -= 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
    } else {
      out += fmt::format("\\u{:04x}", u);
    }
  }
  out += '"';
}

struct JsonStyle {
  int indent = -1;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false, ascii = false;
};

void json(std::string& out, const Value& v, const JsonStyle& st, int level) {
  const NestingGuard nesting;
  const auto newline = [&](int l) {
    if (st.indent < 0) return;
    const size_t width = static_cast<size_t>(st.indent) * static_cast<size_t>(l);
    need_room(out.size() + width + 1);
    out += '\n';
    out.append(width, ' ');
  };
  need_room(out.size() + st.item_sep.size() + st.key_sep.size());
  switch (v.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.as_int()); return;
    case Value::Kind::floating: {
      const double d = v.as_number();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
      return;
    }
    case Value::Kind::string: json_string(out, v.as_string(), st.ascii); return;
    case Value::Kind::array: {
      const Value::Array& a = v.as_array();
      if (a.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += st.item_sep;
        newline(level + 1);
        json(out, a[i], st, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::object: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_object().items()) items.push_back(&kv);
      if (st.sort_keys) std::sort(items.begin(), items.end(), [](auto* x, auto* y) { return x->first < y->first; });
      if (items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += st.item_sep;
        newline(level + 1);
        json_string(out, items[i]->first, st.ascii);
        out += st.key_sep;
        json(out, items[i]->second, st, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    case Value::Kind::function: throw Error("Object of type function is not JSON serializable");
  }
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

const char* const kTests[] = {"defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number",
                              "string", "mapping", "iterable", "sequence", "callable", "even", "odd", "divisibleby",
                              "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt",
                              "greaterthan", ">", "ge", ">=", "in", "lower", "upper", "sameas"};

}  // namespace

Value::Array items_of(const Value& v, int line) {
  if (v.is_array()) return v.as_array();
  if (v.is_object()) {
    Value::Array keys;
    for (const auto& [k, x] : v.as_object().items()) keys.push_back(Value(k));
    return keys;
  }
  if (v.is_string()) {
    need_room(static_cast<size_t>(v.length()) * sizeof(Value));
    Value::Array chars;
    for (std::string_view c : code_points(v.as_string())) chars.push_back(Value(std::string(c)));
    return chars;
  }
  if (v.is_undefined() || v.is_none()) return {};
  throw Error(line > 0 ? fmt::format("line {}: '{}' object is not iterable", line, v.type_name())
                       : fmt::format("'{}' object is not iterable", v.type_name()));
}

bool known_test(const std::string& name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

std::string to_json(const Value& v, int indent) {
  JsonStyle st;
  st.indent = indent;
  if (indent >= 0) st.item_sep = ",";
  std::string out;
  json(out, v, st, 0);
  return out;
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_object()) {
    if (!obj.as_object().is_namespace)
      if (Value m = dict_method(obj, name); !m.is_undefined()) return m;
    const Value* v = obj.as_object().find(name);
    return v ? *v : Value();
  }
  if (obj.is_string()) return string_method(obj.as_string(), name);
  return Value();
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_object()) {
    if (!key.is_string()) return Value();
    const Value* v = obj.as_object().find(key.as_string());
    return v ? *v : Value();
  }
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    const int64_t n = obj.length();
    int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    if (obj.is_array()) return obj.as_array()[static_cast<size_t>(i)];
    return Value(std::string(code_points(obj.as_string())[static_cast<size_t>(i)]));
  }
  return Value();
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (!obj.is_array() && !obj.is_string()) {
    if (obj.is_undefined()) return Value();
    throw Error(fmt::format("'{}' object is not subscriptable", obj.type_name()));
  }
  const auto as_opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int()) throw Error(fmt::format("slice {} must be an integer", what));
    return v.as_int();
  };
  const int64_t n = obj.length();
  const int64_t st = as_opt(step, "step").value_or(1);
  if (st == 0) throw Error("slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v < 0 ? *v + n : *v;
    return st > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(as_opt(start, "start"), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(as_opt(stop, "stop"), st > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(i);
  if (obj.is_array()) {
    Value::Array out;
    for (int64_t i : idx) out.push_back(obj.as_array()[static_cast<size_t>(i)]);
    return Value::array(std::move(out));
  }
  const std::vector<std::string_view> cps = code_points(obj.as_string());
  std::string out;
  for (int64_t i : idx) out += cps[static_cast<size_t>(i)];
  return Value(std::move(out));
}

bool apply_test(const std::string& name, const Value& v, Args& a) {
  const Value x = arg(a, 0, "value");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "iterable") return v.is_array() || v.is_object() || v.is_string();
  if (name == "sequence") return v.is_array() || v.is_object() || v.is_string();
  if (name == "callable") return v.is_function();
  if (name == "even" || name == "odd") {
    if (!v.is_int()) throw Error(fmt::format("the test {} needs an integer", name));
    return (v.as_int() % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    if (!v.is_int() || !x.is_int() || x.as_int() == 0) throw Error("divisibleby needs integers (and no zero)");
    return v.as_int() % x.as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return v == x;
  if (name == "ne" || name == "!=") return !(v == x);
  if (name == "lt" || name == "lessthan" || name == "<") return v.less(x);
  if (name == "le" || name == "<=") return !x.less(v);
  if (name == "gt" || name == "greaterthan" || name == ">") return x.less(v);
  if (name == "ge" || name == ">=") return !v.less(x);
  if (name == "in") {
    if (x.is_string()) return v.is_string() && x.as_string().find(v.as_string()) != std::string::npos;
    for (const Value& y : items_of(x))
      if (y == v) return true;
    return false;
  }
  if (name == "lower") return v.is_string() && lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && upper(v.as_string()) == v.as_string();
  if (name == "sameas") return v.same_as(x);
  throw Unsupported(fmt::format("the test '{}' is not supported", name));
}

// ---- filters: one function each, found by name in kFilters -----------------------------------

namespace {

using FilterFn = Value (*)(const Value& v, Args& a, Context& ctx);

Value f_safe(const Value& v, Args&, Context&) { return v; }
Value f_string(const Value& v, Args&, Context&) { return Value(v.str()); }
Value f_trim(const Value& v, Args& a, Context&) {
  return Value(strip(need_string(v.is_undefined() ? Value("") : v, "trim"), arg(a, 0, "chars"), true, true));
}
Value f_upper(const Value& v, Args&, Context&) { return Value(upper(v.str())); }
Value f_lower(const Value& v, Args&, Context&) { return Value(lower(v.str())); }
Value f_title(const Value& v, Args&, Context&) { return Value(title(v.str())); }
Value f_capitalize(const Value& v, Args&, Context&) { return Value(capitalize(v.str())); }
Value f_length(const Value& v, Args&, Context&) { return Value(v.length()); }
Value f_escape(const Value& v, Args&, Context&) { return Value(html_escape(v.str())); }
Value f_wordcount(const Value& v, Args&, Context&) {
  return Value(static_cast<int64_t>(split(v.str(), Value(), -1).as_array().size()));
}
Value f_default(const Value& v, Args& a, Context&) {
  const bool boolean = arg(a, 1, "boolean").truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) {
    const Value d = arg(a, 0, "default_value");
    return d.is_undefined() ? Value("") : d;
  }
  return v;
}
Value f_tojson(const Value& v, Args& a, Context&) {
  JsonStyle st;
  const Value ind = arg(a, 0, "indent");
  if (ind.is_int()) {
    st.indent = static_cast<int>(ind.as_int());
    st.item_sep = ",";
  }
  const Value seps = arg(a, SIZE_MAX, "separators");
  if (seps.is_array() && seps.as_array().size() == 2) {
    st.item_sep = need_string(seps.as_array()[0], "tojson separators");
    st.key_sep = need_string(seps.as_array()[1], "tojson separators");
  }
  st.sort_keys = arg(a, SIZE_MAX, "sort_keys").truthy();
  st.ascii = arg(a, SIZE_MAX, "ensure_ascii").truthy();
  std::string out;
  json(out, v, st, 0);
  return Value(out);
}
Value f_items(const Value& v, Args&, Context&) {
  if (v.is_undefined() || v.is_none()) return Value::array();
  if (!v.is_object()) throw Error(fmt::format("items needs a dict, got {}", v.type_name()));
  Args none;
  return dict_method(v, "items").call(none);
}
Value f_dictsort(const Value& v, Args&, Context&) {
  if (!v.is_object()) throw Error("dictsort needs a dict");
  Value::Array out;
  for (const auto& [k, x] : v.as_object().items()) out.push_back(Value::tuple({Value(k), x}));
  std::stable_sort(out.begin(), out.end(),
                   [](const Value& p, const Value& q) { return lower(p.as_array()[0].as_string()) < lower(q.as_array()[0].as_string()); });
  return Value::array(std::move(out));
}
Value f_list(const Value& v, Args&, Context&) { return Value::array(items_of(v)); }
template <bool First>
Value f_end(const Value& v, Args&, Context&) {  // first, last
  const Value::Array it = items_of(v);
  if (it.empty()) return Value();
  return First ? it.front() : it.back();
}
Value f_reverse(const Value& v, Args&, Context&) {
  if (v.is_string()) {
    std::vector<std::string_view> cps = code_points(v.as_string());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return Value(out);
  }
  Value::Array it = items_of(v);
  std::reverse(it.begin(), it.end());
  return Value::array(std::move(it));
}
Value f_join(const Value& v, Args& a, Context&) {
  const Value sep = arg(a, 0, "d");
  const Value attr = arg(a, 1, "attribute");
  std::string out;
  const std::string between = sep.is_undefined() ? "" : sep.str();
  bool first = true;
  for (const Value& x : items_of(v)) {
    const std::string piece = (attr.is_undefined() ? x : attribute(x, attr)).str();
    need_room(out.size() + between.size() + piece.size());
    if (!first) out += between;
    out += piece;
    first = false;
  }
  return Value(out);
}
Value f_replace(const Value& v, Args& a, Context&) {
  const Value n = arg(a, 2, "count");
  return Value(replace(v.str(), arg(a, 0, "old").str(), arg(a, 1, "new").str(), n.is_int() ? n.as_int() : -1));
}
Value f_indent(const Value& v, Args& a, Context&) {
  return Value(indent_text(v.str(), arg(a, 0, "width"), arg(a, 1, "first").truthy(), arg(a, 2, "blank").truthy()));
}
Value f_int(const Value& v, Args& a, Context&) {
  if (v.is_int()) return v;
  if (v.is_float()) {  // (outside the 64-bit range, as a string that is no integer: the default)
    const double x = v.as_number();
    if (x > -9.2e18 && x < 9.2e18) return Value(static_cast<int64_t>(x));
    const Value d = arg(a, 0, "default");
    return d.is_undefined() ? Value(int64_t{0}) : d;
  }
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_string()) {
    try {
      size_t used = 0;
      const std::string s = strip(v.as_string(), Value(), true, true);
      const int64_t r = std::stoll(s, &used);
      if (used == s.size()) return Value(r);
    } catch (const std::exception&) {
    }
  }
  const Value d = arg(a, 0, "default");
  return d.is_undefined() ? Value(int64_t{0}) : d;
}
Value f_float(const Value& v, Args& a, Context&) {
  if (v.is_number()) return Value(v.as_number());
  if (v.is_string()) {
    try {
      size_t used = 0;
      const std::string s = strip(v.as_string(), Value(), true, true);
      const double r = std::stod(s, &used);
      if (used == s.size()) return Value(r);
    } catch (const std::exception&) {
    }
  }
  const Value d = arg(a, 0, "default");
  return d.is_undefined() ? Value(0.0) : d;
}
Value f_abs(const Value& v, Args&, Context&) {
  if (v.is_int()) {
    if (v.as_int() == std::numeric_limits<int64_t>::min()) throw Error("abs: integer overflow");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (v.is_float()) return Value(std::fabs(v.as_number()));
  throw Error(fmt::format("abs needs a number, got {}", v.type_name()));
}
Value f_round(const Value& v, Args& a, Context&) {
  const Value p = arg(a, 0, "precision");
  const std::string how = arg(a, 1, "method").is_string() ? arg(a, 1, "method").as_string() : "common";
  const double scale = std::pow(10.0, p.is_int() ? static_cast<double>(p.as_int()) : 0.0);
  const double x = v.as_number() * scale;
  // 'common' is Python's round(): halves to even.
  const double r = how == "floor" ? std::floor(x) : how == "ceil" ? std::ceil(x) : std::nearbyint(x);
  return Value(r / scale);
}
Value f_attr(const Value& v, Args& a, Context&) {  // an attribute only: a dict's methods, never its keys (Python's getattr)
  const std::string& n = need_string(arg(a, 0, "name"), "attr");
  return v.is_object() && !v.as_object().is_namespace ? dict_method(v, n) : get_attr(v, n);
}
Value f_map(const Value& v, Args& a, Context& ctx) {
  Value::Array out;
  const Value attr = arg(a, SIZE_MAX, "attribute");
  if (!attr.is_undefined()) {
    const Value def = arg(a, SIZE_MAX, "default");
    for (const Value& x : items_of(v)) {
      Value y = attribute(x, attr);
      out.push_back(y.is_undefined() && !def.is_undefined() ? def : y);
    }
    return Value::array(std::move(out));
  }
  const std::string f = need_string(arg(a, 0, ""), "map");
  if (!known_filter(f)) throw Unsupported(fmt::format("the filter '{}' is not supported", f));
  Args fargs = rest(a, 1);
  for (const Value& x : items_of(v)) out.push_back(apply_filter(f, x, fargs, ctx));
  return Value::array(std::move(out));
}
template <bool Keep, bool ByAttr>
Value f_select(const Value& v, Args& a, Context&) {  // select, reject, selectattr, rejectattr
  return select(v, a, Keep, ByAttr);
}
Value f_unique(const Value& v, Args& a, Context&) {
  Value::Array out;
  const Value attr = arg(a, 1, "attribute");
  for (const Value& x : items_of(v)) {
    const Value key = attr.is_undefined() ? x : attribute(x, attr);
    if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return (attr.is_undefined() ? y : attribute(y, attr)) == key; }))
      out.push_back(x);
  }
  return Value::array(std::move(out));
}
Value f_sort(const Value& v, Args& a, Context&) {
  Value::Array out = items_of(v);
  const bool rev = arg(a, 0, "reverse").truthy();
  const Value attr = arg(a, 2, "attribute");
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    const Value p = attr.is_undefined() ? x : attribute(x, attr), q = attr.is_undefined() ? y : attribute(y, attr);
    return rev ? q.less(p) : p.less(q);
  });
  return Value::array(std::move(out));
}
template <bool Max>
Value f_extreme(const Value& v, Args&, Context&) {  // max, min
  const Value::Array it = items_of(v);
  if (it.empty()) return Value();
  Value best = it[0];
  for (const Value& x : it)
    if (Max ? best.less(x) : x.less(best)) best = x;
  return best;
}
Value f_sum(const Value& v, Args& a, Context&) {
  const Value attr = arg(a, 0, "attribute");
  Value total = arg(a, 1, "start").is_undefined() ? Value(int64_t{0}) : arg(a, 1, "start");
  for (const Value& x : items_of(v)) {
    const Value y = attr.is_undefined() ? x : attribute(x, attr);
    if (!y.is_number() || !total.is_number()) throw Error("sum needs numbers");
    int64_t r = 0;
    if (total.is_int() && y.is_int() && __builtin_add_overflow(total.as_int(), y.as_int(), &r))
      throw Error("sum: integer overflow");
    total = total.is_int() && y.is_int() ? Value(r) : Value(total.as_number() + y.as_number());
  }
  return total;
}

// Every filter a template may use, by name (Jinja2's FILTERS, the ones chat templates use).
struct Filter {
  const char* name;
  FilterFn fn;
};
constexpr Filter kFilters[] = {
    {"abs", f_abs},           {"attr", f_attr},         {"capitalize", f_capitalize},
    {"count", f_length},      {"d", f_default},         {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},          {"escape", f_escape},
    {"first", f_end<true>},   {"float", f_float},       {"indent", f_indent},
    {"int", f_int},           {"items", f_items},       {"join", f_join},
    {"last", f_end<false>},   {"length", f_length},     {"list", f_list},
    {"lower", f_lower},       {"map", f_map},           {"max", f_extreme<true>},
    {"min", f_extreme<false>}, {"reject", f_select<false, false>}, {"rejectattr", f_select<false, true>},
    {"replace", f_replace},   {"reverse", f_reverse},   {"round", f_round},
    {"safe", f_safe},         {"select", f_select<true, false>}, {"selectattr", f_select<true, true>},
    {"sort", f_sort},         {"string", f_string},     {"sum", f_sum},
    {"title", f_title},       {"tojson", f_tojson},     {"trim", f_trim},
    {"unique", f_unique},     {"upper", f_upper},       {"wordcount", f_wordcount}};

const Filter* find_filter(const std::string& name) {
  for (const Filter& f : kFilters)
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

bool known_filter(const std::string& name) { return find_filter(name) != nullptr; }

Value apply_filter(const std::string& name, const Value& v, Args& a, Context& ctx) {
  const Filter* f = find_filter(name);
  if (!f) throw Unsupported(fmt::format("the filter '{}' is not supported", name));
  return f->fn(v, a, ctx);
}

Context::Scope global_functions(const Limits& limits) {
  Context::Scope g;
  const int64_t max_range = limits.max_range;
  g["range"] = Value::function("range", [max_range](Args& a) {
    const auto n = a.positional.size();
    if (n < 1 || n > 3) throw Error("range takes 1 to 3 integers");
    for (const Value& x : a.positional)
      if (!x.is_int()) throw Error(fmt::format("range takes integers, got {}", x.type_name()));
    const int64_t start = n == 1 ? 0 : a.positional[0].as_int(), stop = n == 1 ? a.positional[0].as_int() : a.positional[1].as_int();
    const int64_t step = n == 3 ? a.positional[2].as_int() : 1;
    if (step == 0) throw Error("range step must not be zero");
    Value::Array out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (static_cast<int64_t>(out.size()) >= max_range) throw Error(fmt::format("range of more than {} items", max_range));
      out.push_back(Value(i));
      if (__builtin_add_overflow(i, step, &i)) break;  // past the 64-bit range: past stop too
    }
    return Value::array(std::move(out));
  });
  g["namespace"] = Value::function("namespace", [](Args& a) {
    Value ns = Value::object();
    ns.as_object().is_namespace = true;
    for (const Value& p : a.positional)
      if (p.is_object())
        for (const auto& [k, v] : p.as_object().items()) ns.as_object().set(k, v);
    for (const auto& [k, v] : a.keyword) ns.as_object().set(k, v);
    return ns;
  });
  g["dict"] = Value::function("dict", [](Args& a) {
    Value d = Value::object();
    for (const Value& p : a.positional)
      if (p.is_object())
        for (const auto& [k, v] : p.as_object().items()) d.as_object().set(k, v);
    for (const auto& [k, v] : a.keyword) d.as_object().set(k, v);
    return d;
  });
  g["raise_exception"] = Value::function("raise_exception", [](Args& a) -> Value {
    throw Raised(a.positional.empty() ? std::string("the chat template raised an error") : a.positional[0].str());
  });
  g["strftime_now"] = Value::function("strftime_now", [](Args& a) {
    const std::string f = need_string(arg(a, 0, "format"), "strftime_now");
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
    return Value(std::string(buf, n));
  });
  return g;
}

}  // namespace ember::jinja
