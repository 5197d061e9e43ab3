// Splits a template into text and tags, as Hugging Face's chat templates are rendered (Jinja2
// with trim_blocks and lstrip_blocks, which llama.cpp's --jinja follows too): {{ expr }},
// {% stmt %}, {# comment #}, `-` on either side strips the whitespace there, a block tag alone on
// its line leaves no trace of the line, {% raw %} keeps its text as written. Tags come as tokens.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ember::jinja {

struct Token {
  enum class Type { name, string, integer, floating, op };
  Type type = Type::op;
  std::string text;  // name, operator, or the string's value
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

struct Segment {
  enum class Kind { text, expr, stmt };
  Kind kind = Kind::text;
  std::string text;           // text
  std::vector<Token> tokens;  // expr, stmt
  int line = 0;
};

// Throws SyntaxError naming the line.
std::vector<Segment> lex(std::string_view src);

}  // namespace ember::jinja
