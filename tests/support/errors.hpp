// The message of the ember::Error a call throws ("" when it throws none), for tests that check
// that bad input is named.
#pragma once
#include <functional>
#include <string>

#include "core/error.hpp"

namespace ember::test_support {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace ember::test_support
