// Template source to statements (ast.hpp). Throws SyntaxError (with the line) for what is not
// Jinja, Unsupported for Jinja this engine does not render (a statement such as include or call,
// a filter or test it does not know), so that a caller can fall back.
#pragma once
#include <string_view>

#include "jinja/ast.hpp"

namespace ember::jinja {

Body parse(std::string_view source);

// Whether builtins.cpp knows a filter / a test of this name.
bool known_filter(const std::string& name);
bool known_test(const std::string& name);

}  // namespace ember::jinja
