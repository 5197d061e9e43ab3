// What can go wrong with a template: it cannot be read (SyntaxError, with its line), it uses
// something this engine does not render (Unsupported: the caller falls back to the family's
// built-in style), it ran past its bounds, or it raised an error itself (Raised: a
// raise_exception() call, whose message is meant for the user: "Conversation roles must
// alternate user/assistant/...").
#pragma once
#include <string>

#include "core/error.hpp"

namespace ember::jinja {

class Error : public ember::Error {
 public:
  using ember::Error::Error;
};

class SyntaxError : public Error {
 public:
  using Error::Error;
};

class Unsupported : public Error {
 public:
  using Error::Error;
};

class Raised : public Error {
 public:
  using Error::Error;
};

}  // namespace ember::jinja
