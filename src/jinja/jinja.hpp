// A Jinja template engine written for Ember's chat templates: the statements (if, for with loop
// variables and else, set with namespaces and blocks, macro, filter blocks, break/continue,
// raw), expressions (literals, lists, dicts, attribute and item access, slicing, calls,
// arithmetic, comparisons, in, and/or/not, conditional expressions, ~), the tests and filters
// real templates use (tojson, trim, items, selectattr, ...), string and dict methods and
// raise_exception, rendered as Hugging Face renders chat templates (Jinja2 with trim_blocks and
// lstrip_blocks). Sandboxed: a template reads only the values it is given (no files, no
// environment, no attributes beyond Python's plain data methods) and runs within Limits.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "jinja/context.hpp"
#include "jinja/error.hpp"
#include "jinja/value.hpp"

namespace ember::jinja {

struct Stmt;

constexpr size_t kMaxTemplateBytes = size_t{1} << 20;  // real chat templates are under 50 KB

class Template {
 public:
  // Throws SyntaxError or Unsupported (see error.hpp), Error for a source over kMaxTemplateBytes.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `variables` (a dict: messages, add_generation_prompt, bos_token, ...). Throws
  // Raised for the template's raise_exception, Error for the rest (an undefined function, a
  // type error, a bound passed).
  std::string render(const Value& variables, const Limits& limits = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::jinja
