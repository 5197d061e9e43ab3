// An enum's names in one table: the name of a value, the value of a name, and one wording of the
// error for a name that is none of them ("unknown placement method 'x' (expected ilp, greedy or
// layer-split)").
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace ember {

template <class E>
struct EnumName {
  E value;
  const char* name;
};

// Names for a message: "a, b or c" (`last`: what goes before the last one).
inline std::string name_list(const std::vector<std::string>& names, std::string_view last = " or ") {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? std::string(last) : ", ") + names[i];
  return s;
}

template <class E, size_t N>
std::string enum_name_list(const EnumName<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const auto& e : table) names.push_back(e.name);
  return name_list(names);
}

template <class E, size_t N>
const char* enum_name(const EnumName<E> (&table)[N], E v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return "?";
}

template <class E, size_t N>
std::optional<E> find_enum(const EnumName<E> (&table)[N], std::string_view name) {
  for (const auto& e : table)
    if (name == e.name) return e.value;
  return std::nullopt;
}

// The value named `name`; throws "unknown <what> '<name>' (expected a, b or c)".
template <class E, size_t N>
E parse_enum(const EnumName<E> (&table)[N], std::string_view name, const char* what) {
  if (const auto v = find_enum(table, name)) return *v;
  fail("unknown {} '{}' (expected {})", what, name, enum_name_list(table));
}

}  // namespace ember
