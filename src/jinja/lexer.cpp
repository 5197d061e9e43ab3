#include "jinja/lexer.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

#include "core/utf8.hpp"
#include "jinja/error.hpp"

namespace ember::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

void rstrip(std::string& s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Segment> run() {
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with '-'
    while (pos < src_.size()) {
      const size_t open = next_tag(pos);
      std::string text(src_.substr(pos, open - pos));
      if (strip_next) text.erase(0, text.find_first_not_of(" \t\n\r\f\v") == std::string::npos
                                        ? text.size() : text.find_first_not_of(" \t\n\r\f\v"));
      strip_next = false;
      if (open == src_.size()) {
        push_text(std::move(text));
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char mod = open + 2 < src_.size() ? src_[open + 2] : 0;
      if (mod == '-') {
        rstrip(text);
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: a block or comment tag that starts its line takes the line's indent.
        size_t b = open;
        while (b > pos && (src_[b - 1] == ' ' || src_[b - 1] == '\t')) --b;
        if (b == 0 || src_[b - 1] == '\n') text.resize(text.size() - std::min(text.size(), open - b));
      }
      push_text(std::move(text));
      const int line = line_at(open);
      size_t p = open + 2 + (mod == '-' || mod == '+' ? 1 : 0);
      bool strip_after = false;
      if (kind == '#') {
        const size_t close = src_.find("#}", p);
        if (close == std::string_view::npos) throw SyntaxError(fmt::format("line {}: a comment is not closed with #}}", line));
        strip_after = close > p && src_[close - 1] == '-';
        pos = close + 2;
        pos = trim_block_end(pos, strip_after, close > p && src_[close - 1] == '+');
        strip_next = strip_after;
        continue;
      }
      Segment seg;
      seg.kind = kind == '{' ? Segment::Kind::expr : Segment::Kind::stmt;
      seg.line = line;
      bool keep_newline = false;
      pos = tokens(p, kind == '{' ? '}' : '%', seg.tokens, strip_after, keep_newline, line);
      if (seg.kind == Segment::Kind::stmt && seg.tokens.size() == 1 && seg.tokens[0].text == "raw" &&
          seg.tokens[0].type == Token::Type::name) {
        pos = trim_block_end(pos, strip_after, keep_newline);
        pos = raw_block(pos, strip_after, strip_next);
        continue;
      }
      if (seg.kind == Segment::Kind::stmt) pos = trim_block_end(pos, strip_after, keep_newline);
      strip_next = strip_after;
      segs_.push_back(std::move(seg));
    }
    return std::move(segs_);
  }

 private:
  size_t next_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  int line_at(size_t pos) {
    for (; line_pos_ < pos; ++line_pos_) line_ += src_[line_pos_] == '\n';
    return line_;
  }

  void push_text(std::string text) {
    if (text.empty()) return;
    Segment s;
    s.kind = Segment::Kind::text;
    s.text = std::move(text);
    segs_.push_back(std::move(s));
  }

  // trim_blocks: the newline right after a block tag goes (unless '-' took all of it, or '+').
  size_t trim_block_end(size_t pos, bool stripped, bool keep) const {
    if (stripped || keep) return pos;
    if (pos < src_.size() && src_[pos] == '\n') return pos + 1;
    if (pos + 1 < src_.size() && src_[pos] == '\r' && src_[pos + 1] == '\n') return pos + 2;
    return pos;
  }

  // {% raw %}...{% endraw %}: the text as written (the tags' '-' and lstrip apply at its ends).
  size_t raw_block(size_t pos, bool strip_start, bool& strip_next) {
    size_t at = pos;
    for (;;) {
      const size_t open = src_.find("{%", at);
      if (open == std::string_view::npos) throw SyntaxError(fmt::format("line {}: {{% raw %}} is not closed", line_at(pos)));
      size_t p = open + 2;
      const bool minus = p < src_.size() && src_[p] == '-';
      if (minus || (p < src_.size() && src_[p] == '+')) ++p;
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        at = open + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && is_space(src_[p])) ++p;
      const bool minus_after = p < src_.size() && src_[p] == '-';
      if (minus_after || (p < src_.size() && src_[p] == '+')) ++p;
      if (src_.compare(p, 2, "%}") != 0) throw SyntaxError(fmt::format("line {}: bad {{% endraw %}}", line_at(open)));
      std::string text(src_.substr(pos, open - pos));
      if (strip_start) text.erase(0, text.find_first_not_of(" \t\n\r\f\v") == std::string::npos ? text.size()
                                                                                               : text.find_first_not_of(" \t\n\r\f\v"));
      if (minus) rstrip(text);
      push_text(std::move(text));
      strip_next = minus_after;
      return trim_block_end(p + 2, minus_after, false);
    }
  }

  // Reads a tag's tokens up to its closer ("}}" or "%}" outside brackets); returns the position
  // after it.
  size_t tokens(size_t p, char closer, std::vector<Token>& out, bool& strip_after, bool& keep_newline, int line) {
    int depth = 0;
    for (;;) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size()) throw SyntaxError(fmt::format("line {}: a tag is not closed with {}}}", line, closer));
      const char c = src_[p];
      if (depth == 0) {
        if ((c == '-' || c == '+') && p + 2 < src_.size() && src_[p + 1] == closer && src_[p + 2] == '}') {
          strip_after = c == '-';
          keep_newline = c == '+';
          return p + 3;
        }
        if (c == closer && p + 1 < src_.size() && src_[p + 1] == '}') return p + 2;
      }
      Token t;
      t.line = line_at(p);
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        t.type = Token::Type::name;
        t.text = std::string(src_.substr(p, e - p));
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        bool is_float = false;
        std::string digits;
        while (e < src_.size()) {
          const char d = src_[e];
          if (std::isdigit(static_cast<unsigned char>(d)) || d == '_') {
            if (d != '_') digits += d;
          } else if (d == '.' && !is_float && e + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
            is_float = true;
            digits += d;
          } else if ((d == 'e' || d == 'E') && e + 1 < src_.size() &&
                     (std::isdigit(static_cast<unsigned char>(src_[e + 1])) || src_[e + 1] == '-' || src_[e + 1] == '+')) {
            is_float = true;
            digits += d;
            digits += src_[++e];
          } else {
            break;
          }
          ++e;
        }
        t.type = is_float ? Token::Type::floating : Token::Type::integer;
        t.text = digits;
        if (is_float) t.f = std::strtod(digits.c_str(), nullptr);
        else t.i = std::strtoll(digits.c_str(), nullptr, 10);
        p = e;
      } else if (c == '\'' || c == '"') {
        t.type = Token::Type::string;
        p = string_literal(p, t.text, line);
      } else {
        static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
        t.type = Token::Type::op;
        t.text = std::string(1, c);
        for (const char* op : two)
          if (src_.compare(p, 2, op) == 0) t.text = op;
        if (std::string_view("+-*/%~<>=()[]{},.:|!").find(c) == std::string_view::npos)
          throw SyntaxError(fmt::format("line {}: unexpected character '{}'", t.line, c));
        if (t.text == "!") throw SyntaxError(fmt::format("line {}: unexpected character '!'", t.line));
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        p += t.text.size();
      }
      out.push_back(std::move(t));
    }
  }

  size_t string_literal(size_t p, std::string& out, int line) {
    const char q = src_[p++];
    while (p < src_.size() && src_[p] != q) {
      char c = src_[p++];
      if (c != '\\' || p >= src_.size()) {
        out += c;
        continue;
      }
      c = src_[p++];
      switch (c) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
          if (p + n > src_.size()) throw SyntaxError(fmt::format("line {}: bad \\{} escape", line, c));
          append_utf8(out, static_cast<uint32_t>(std::strtoul(std::string(src_.substr(p, n)).c_str(), nullptr, 16)));
          p += n;
          break;
        }
        case '\n': break;  // a backslash-newline continues the literal
        default:
          if (c != '\\' && c != '\'' && c != '"') out += '\\';  // Python keeps unknown escapes
          out += c;
      }
    }
    if (p >= src_.size()) throw SyntaxError(fmt::format("line {}: a string literal is not closed", line));
    return p + 1;
  }

  std::string_view src_;
  std::vector<Segment> segs_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Segment> lex(std::string_view src) {
  // Jinja2 drops one newline at the end of a template (keep_trailing_newline is off).
  if (src.ends_with("\r\n")) src.remove_suffix(2);
  else if (src.ends_with("\n")) src.remove_suffix(1);
  return Lexer(src).run();
}

}  // namespace ember::jinja
