// JSON data (a request's messages and tools, a test's fixtures) as template values and back.
#pragma once
#include <nlohmann/json.hpp>

#include "jinja/value.hpp"

namespace ember::jinja {

Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);

}  // namespace ember::jinja
