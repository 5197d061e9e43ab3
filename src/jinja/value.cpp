#include "jinja/value.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "jinja/error.hpp"

namespace ember::jinja {

const Value* Value::Object::find(std::string_view key) const {
  const auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

Value* Value::Object::find(std::string_view key) {
  const auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void Value::Object::set(const std::string& key, Value v) {
  if (Value* old = find(key)) {
    *old = std::move(v);
    return;
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(key, std::move(v));
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::none;
  return v;
}

Value::Value(bool b) : kind_(Kind::boolean), b_(b) {}
Value::Value(int64_t v) : kind_(Kind::integer), i_(v) {}
Value::Value(double v) : kind_(Kind::floating), f_(v) {}
Value::Value(std::string s) : kind_(Kind::string) {
  count_made(s.size());
  s_ = std::make_shared<const std::string>(std::move(s));
}

Value::~Value() {
  if ((a_ && !a_->empty() && a_.use_count() == 1) || (o_ && o_->size() != 0 && o_.use_count() == 1)) release_contents();
}

void Value::release_contents() {
  // The outermost release frees a work list one value at a time; a value freed meanwhile (inside
  // the loop below) adds what it holds to that list instead of freeing it recursively.
  thread_local std::vector<Value>* pending = nullptr;
  const auto take = [this](std::vector<Value>& into) {
    if (a_) {
      for (Value& x : *a_) into.push_back(std::move(x));
      a_->clear();
    } else {
      for (auto& item : o_->items_) into.push_back(std::move(item.second));
      o_->items_.clear();
      o_->index_.clear();
    }
  };
  if (pending) return take(*pending);
  std::vector<Value> work;
  pending = &work;
  take(work);
  while (!work.empty()) {
    Value v = std::move(work.back());
    work.pop_back();
  }
  pending = nullptr;
}

Value Value::array(Array items) {
  count_made(items.size() * sizeof(Value));
  Value v;
  v.kind_ = Kind::array;
  v.a_ = std::make_shared<Array>(std::move(items));
  return v;
}

Value Value::tuple(Array items) {
  Value v = array(std::move(items));
  v.b_ = true;
  return v;
}

Value Value::object() {
  Value v;
  v.kind_ = Kind::object;
  v.o_ = std::make_shared<Object>();
  return v;
}

Value Value::function(std::string name, Function f) {
  Value v;
  v.kind_ = Kind::function;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<const Function>(std::move(f));
  return v;
}

bool Value::same_as(const Value& o) const {
  if (kind_ != o.kind_) return false;
  if (kind_ == Kind::array) return a_ == o.a_;
  if (kind_ == Kind::object) return o_ == o.o_;
  if (kind_ == Kind::function) return fn_ == o.fn_;
  return *this == o;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return b_;
    case Kind::integer: return i_ != 0;
    case Kind::floating: return f_ != 0;
    case Kind::string: return !s_->empty();
    case Kind::array: return !a_->empty();
    case Kind::object: return o_->size() > 0;
    case Kind::function: return true;
  }
  return false;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

int64_t Value::length() const {
  switch (kind_) {
    case Kind::string: {
      int64_t n = 0;
      for (unsigned char c : *s_) n += (c & 0xC0) != 0x80;
      return n;
    }
    case Kind::array: return static_cast<int64_t>(a_->size());
    case Kind::object: return static_cast<int64_t>(o_->size());
    case Kind::undefined: return 0;
    default: throw Error(fmt::format("object of type '{}' has no len()", type_name()));
  }
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]xx
  const size_t e = sci.find('e');
  const int exp = std::atoi(sci.c_str() + e + 1);
  const bool neg = sci[0] == '-';
  std::string digits;
  for (size_t i = neg ? 1 : 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {  // Python's repr switches to an exponent here
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    return out + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
  if (exp < 0) return out + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

std::string string_repr(std::string_view s) {
  const char q = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out + q;
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::undefined: return "";
    case Kind::string: return *s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  const NestingGuard level;
  switch (kind_) {
    case Kind::undefined: return "";
    case Kind::none: return "None";
    case Kind::boolean: return b_ ? "True" : "False";
    case Kind::integer: return std::to_string(i_);
    case Kind::floating: return float_repr(f_);
    case Kind::string: return string_repr(*s_);
    case Kind::array: {
      std::string out = b_ ? "(" : "[";
      for (size_t i = 0; i < a_->size(); ++i) out += (i ? ", " : "") + (*a_)[i].repr();
      if (b_ && a_->size() == 1) out += ",";
      return out + (b_ ? ")" : "]");
    }
    case Kind::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : o_->items()) {
        out += (first ? "" : ", ") + string_repr(k) + ": " + v.repr();
        first = false;
      }
      return out + "}";
    }
    case Kind::function: return "<function " + *s_ + ">";
  }
  return "";
}

bool Value::operator==(const Value& o) const {
  const NestingGuard level;
  if (is_number() && o.is_number()) {
    if (is_int() && o.is_int()) return i_ == o.i_;
    return as_number() == o.as_number();
  }
  if ((is_bool() && o.is_number()) || (is_number() && o.is_bool()))  // Python: True == 1
    return (is_bool() ? static_cast<double>(b_) : as_number()) == (o.is_bool() ? static_cast<double>(o.b_) : o.as_number());
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return true;
    case Kind::boolean: return b_ == o.b_;
    case Kind::string: return *s_ == *o.s_;
    case Kind::array:
      if (a_->size() != o.a_->size()) return false;
      for (size_t i = 0; i < a_->size(); ++i)
        if (!((*a_)[i] == (*o.a_)[i])) return false;
      return true;
    case Kind::object: {
      if (o_->size() != o.o_->size()) return false;
      for (const auto& [k, v] : o_->items()) {
        const Value* w = o.o_->find(k);
        if (!w || !(v == *w)) return false;
      }
      return true;
    }
    case Kind::function: return fn_ == o.fn_;
    default: return false;
  }
}

bool Value::less(const Value& o) const {
  const NestingGuard level;
  if ((is_number() || is_bool()) && (o.is_number() || o.is_bool())) {
    const double a = is_bool() ? b_ : as_number(), b = o.is_bool() ? o.b_ : o.as_number();
    if (is_int() && o.is_int()) return i_ < o.i_;
    return a < b;
  }
  if (is_string() && o.is_string()) return *s_ < *o.s_;
  if (is_array() && o.is_array()) {
    for (size_t i = 0; i < a_->size() && i < o.a_->size(); ++i) {
      if ((*a_)[i].less((*o.a_)[i])) return true;
      if ((*o.a_)[i].less((*a_)[i])) return false;
    }
    return a_->size() < o.a_->size();
  }
  throw Error(fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(), o.type_name()));
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::array: return "list";
    case Kind::object: return o_->is_namespace ? "Namespace" : "dict";
    case Kind::function: return "function";
  }
  return "?";
}

}  // namespace ember::jinja
