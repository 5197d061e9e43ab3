#include "jinja/parser.hpp"

#include <algorithm>
#include <initializer_list>

#include <fmt/format.h>

#include "jinja/error.hpp"
#include "jinja/lexer.hpp"

namespace ember::jinja {

namespace {

// Nesting of blocks, and the height of an expression's tree: "((((...", and as much through chains
// ("x|default(y)|default(y)..." 100,000 times, "1 + 1 + ..." of 200,000 terms), whose trees
// are as deep as they are long and would exhaust the stack when evaluated or freed.
constexpr int kMaxDepth = 200;

template <class T>
std::unique_ptr<T> node(int line) {
  auto n = std::make_unique<T>();
  n->line = line;
  return n;
}

// The heights of an expression's parts.
int height(const ExprPtr& e) { return e ? e->height : 0; }
int height(const std::vector<ExprPtr>& v) {
  int h = 0;
  for (const ExprPtr& e : v) h = std::max(h, height(e));
  return h;
}
int height(const std::vector<std::pair<ExprPtr, ExprPtr>>& v) {
  int h = 0;
  for (const auto& [a, b] : v) h = std::max({h, height(a), height(b)});
  return h;
}
int height(const ArgExprs& a) {
  int h = height(a.positional);
  for (const auto& [k, e] : a.keyword) h = std::max(h, height(e));
  return h;
}

// Sets a new node's height over its parts; refuses a tree taller than kMaxDepth.
template <class T, class... Parts>
std::unique_ptr<T> sealed(std::unique_ptr<T>& n, const Parts&... parts) {
  n->height = 1 + std::max({0, height(parts)...});
  if (n->height > kMaxDepth)
    throw SyntaxError(fmt::format("line {}: an expression nested deeper than {} levels", n->line, kMaxDepth));
  return std::move(n);
}

class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  Body run() {
    Body body = parse_body({}, nullptr);
    return body;
  }

 private:
  // ---- statements ----
  // Statements up to one of `stops` (a block tag whose first word is one of them: it is left as
  // the current segment, its tokens at its second word) or the end (only when stops is empty).
  Body parse_body(std::initializer_list<const char*> stops, std::string* stopped) {
    if (++depth_ > kMaxDepth) throw SyntaxError(fmt::format("line {}: blocks nested too deep", line()));
    Body body;
    while (seg_ < segs_.size()) {
      const Segment& s = segs_[seg_];
      if (s.kind == Segment::Kind::text) {
        auto t = node<TextStmt>(s.line);
        t->text = s.text;
        body.push_back(std::move(t));
        ++seg_;
        continue;
      }
      toks_ = &s.tokens;
      tok_ = 0;
      if (s.kind == Segment::Kind::expr) {
        auto o = node<OutputStmt>(s.line);
        o->expr = parse_expr();
        expect_end();
        body.push_back(std::move(o));
        ++seg_;
        continue;
      }
      if (s.tokens.empty() || s.tokens[0].type != Token::Type::name)
        throw SyntaxError(fmt::format("line {}: a {{% %}} tag must start with a statement name", s.line));
      const std::string word = s.tokens[0].text;
      for (const char* stop : stops)
        if (word == stop) {
          tok_ = 1;
          if (stopped) *stopped = word;
          --depth_;
          return body;
        }
      tok_ = 1;
      body.push_back(statement(word, s.line));
    }
    if (stops.size() != 0)
      throw SyntaxError(fmt::format("the template ends inside a block: {{% {} %}} is missing", *(stops.end() - 1)));
    --depth_;
    return body;
  }

  StmtPtr statement(const std::string& word, int ln) {
    if (word == "if") return if_stmt(ln);
    if (word == "for") return for_stmt(ln);
    if (word == "set") return set_stmt(ln);
    if (word == "macro") return macro_stmt(ln);
    if (word == "filter") return filter_block(ln);
    if (word == "break" || word == "continue") {
      auto b = node<LoopControl>(ln);
      b->is_break = word == "break";
      expect_end();
      ++seg_;
      return b;
    }
    if (word == "generation") {  // Hugging Face's marker of the assistant's text: renders its body
      expect_end();
      ++seg_;
      auto b = node<BodyStmt>(ln);
      b->body = parse_body({"endgeneration"}, nullptr);
      expect_end();
      ++seg_;
      return b;
    }
    for (const char* other : {"call", "include", "import", "from", "extends", "block", "with", "do", "autoescape",
                              "trans", "pluralize"})
      if (word == other) throw Unsupported(fmt::format("line {}: the {{% {} %}} statement is not supported", ln, word));
    throw SyntaxError(fmt::format("line {}: unknown statement '{}' (or a closing tag without its opening one)", ln, word));
  }

  StmtPtr if_stmt(int ln) {
    auto s = node<IfStmt>(ln);
    ExprPtr cond = parse_expr();
    expect_end();
    ++seg_;
    for (;;) {
      std::string stop;
      Body body = parse_body({"elif", "else", "endif"}, &stop);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (stop == "elif") {
        cond = parse_expr();
        expect_end();
        ++seg_;
        continue;
      }
      if (stop == "else") {
        expect_end();
        ++seg_;
        s->otherwise = parse_body({"endif"}, nullptr);
      }
      expect_end();
      ++seg_;
      return s;
    }
  }

  StmtPtr for_stmt(int ln) {
    auto s = node<ForStmt>(ln);
    const bool paren = accept("(");
    do s->targets.push_back(expect_name()); while (accept(","));
    if (paren) expect(")");
    if (!accept_name("in")) throw SyntaxError(fmt::format("line {}: expected 'in' in the for loop", ln));
    s->iter = parse_or();
    if (accept_name("if")) s->filter = parse_or();
    if (accept_name("recursive")) throw Unsupported(fmt::format("line {}: recursive loops are not supported", ln));
    expect_end();
    ++seg_;
    std::string stop;
    s->body = parse_body({"else", "endfor"}, &stop);
    if (stop == "else") {
      expect_end();
      ++seg_;
      s->otherwise = parse_body({"endfor"}, nullptr);
    }
    expect_end();
    ++seg_;
    return s;
  }

  StmtPtr set_stmt(int ln) {
    auto s = node<SetStmt>(ln);
    const std::string first = expect_name();
    if (accept(".")) {
      auto ns = node<Name>(ln);
      ns->name = first;
      s->ns = std::move(ns);
      s->attr = expect_name();
    } else {
      s->targets.push_back(first);
      while (accept(",")) s->targets.push_back(expect_name());
    }
    if (accept("=")) {
      s->value = parse_expr();
      if (peek_op(",")) {  // set a, b = 1, 2: a tuple without parentheses
        auto l = node<ListExpr>(ln);
        l->tuple = true;
        l->items.push_back(std::move(s->value));
        while (accept(",")) l->items.push_back(parse_expr());
        s->value = sealed(l, l->items);
      }
      expect_end();
      ++seg_;
      return s;
    }
    if (s->ns || s->targets.size() != 1) throw SyntaxError(fmt::format("line {}: a block set takes one name", ln));
    expect_end();
    ++seg_;
    s->body = parse_body({"endset"}, nullptr);
    expect_end();
    ++seg_;
    return s;
  }

  StmtPtr macro_stmt(int ln) {
    auto s = node<MacroStmt>(ln);
    s->name = expect_name();
    expect("(");
    if (!accept(")")) {
      do {
        std::string p = expect_name();
        ExprPtr def;
        if (accept("=")) def = parse_expr();
        s->params.emplace_back(std::move(p), std::move(def));
      } while (accept(","));
      expect(")");
    }
    expect_end();
    ++seg_;
    s->body = parse_body({"endmacro"}, nullptr);
    expect_end();
    ++seg_;
    return s;
  }

  StmtPtr filter_block(int ln) {
    auto s = node<FilterBlock>(ln);
    s->name = expect_name();
    if (!known_filter(s->name)) throw Unsupported(fmt::format("line {}: the filter '{}' is not supported", ln, s->name));
    if (accept("(")) s->args = call_args();
    expect_end();
    ++seg_;
    s->body = parse_body({"endfilter"}, nullptr);
    expect_end();
    ++seg_;
    return s;
  }

  // ---- expressions (Jinja2's precedence) ----
  ExprPtr parse_expr() {
    if (++depth_ > kMaxDepth) throw SyntaxError(fmt::format("line {}: an expression nested too deep", line()));
    ExprPtr e = parse_or();
    if (peek_name("if")) {
      const int ln = line();
      ++tok_;
      auto c = node<Conditional>(ln);
      c->then = std::move(e);
      c->cond = parse_or();
      if (accept_name("else")) c->otherwise = parse_expr();
      e = sealed(c, c->then, c->cond, c->otherwise);
    }
    --depth_;
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr lhs, ExprPtr rhs, int ln) {
    auto b = node<Binary>(ln);
    b->op = std::move(op);
    b->lhs = std::move(lhs);
    b->rhs = std::move(rhs);
    return sealed(b, b->lhs, b->rhs);
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (peek_name("or")) {
      const int ln = line();
      ++tok_;
      e = binary("or", std::move(e), parse_and(), ln);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (peek_name("and")) {
      const int ln = line();
      ++tok_;
      e = binary("and", std::move(e), parse_not(), ln);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (peek_name("not")) {
      const int ln = line();
      ++tok_;
      auto u = node<Unary>(ln);
      u->op = "not";
      u->operand = parse_not();
      return sealed(u, u->operand);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    for (;;) {
      const int ln = line();
      std::string op;
      if (peek_op("==") || peek_op("!=") || peek_op("<") || peek_op(">") || peek_op("<=") || peek_op(">=")) {
        op = cur().text;
        ++tok_;
      } else if (peek_name("in")) {
        op = "in";
        ++tok_;
      } else if (peek_name("not") && tok_ + 1 < toks_->size() && (*toks_)[tok_ + 1].type == Token::Type::name &&
                 (*toks_)[tok_ + 1].text == "in") {
        op = "not in";
        tok_ += 2;
      } else {
        return e;
      }
      e = binary(op, std::move(e), parse_math1(), ln);
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (peek_op("+") || peek_op("-")) {
      const int ln = line();
      const std::string op = cur().text;
      ++tok_;
      e = binary(op, std::move(e), parse_concat(), ln);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (peek_op("~")) {
      const int ln = line();
      ++tok_;
      e = binary("~", std::move(e), parse_math2(), ln);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      const int ln = line();
      const std::string op = cur().text;
      ++tok_;
      e = binary(op, std::move(e), parse_pow(), ln);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (peek_op("**")) {
      const int ln = line();
      ++tok_;
      e = binary("**", std::move(e), parse_unary(true), ln);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    if (++depth_ > kMaxDepth) throw SyntaxError(fmt::format("line {}: an expression nested too deep", line()));
    ExprPtr e;
    if (peek_op("-") || peek_op("+")) {
      const int ln = line();
      auto u = node<Unary>(ln);
      u->op = cur().text;
      ++tok_;
      u->operand = parse_unary(false);
      e = sealed(u, u->operand);
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) e = parse_filters(std::move(e));
    --depth_;
    return e;
  }

  ExprPtr parse_primary() {
    if (tok_ >= toks_->size()) throw SyntaxError(fmt::format("line {}: an expression is missing", line()));
    const Token& t = cur();
    const int ln = t.line;
    if (t.type == Token::Type::name) {
      ++tok_;
      auto lit = node<Literal>(ln);
      if (t.text == "true" || t.text == "True") lit->value = Value(true);
      else if (t.text == "false" || t.text == "False") lit->value = Value(false);
      else if (t.text == "none" || t.text == "None") lit->value = Value::none();
      else {
        auto n = node<Name>(ln);
        n->name = t.text;
        return n;
      }
      return lit;
    }
    if (t.type == Token::Type::string) {
      std::string s;
      while (tok_ < toks_->size() && cur().type == Token::Type::string) s += (*toks_)[tok_++].text;
      auto lit = node<Literal>(ln);
      lit->value = Value(std::move(s));
      return lit;
    }
    if (t.type == Token::Type::integer || t.type == Token::Type::floating) {
      ++tok_;
      auto lit = node<Literal>(ln);
      lit->value = t.type == Token::Type::integer ? Value(t.i) : Value(t.f);
      return lit;
    }
    if (accept("(")) {
      if (accept(")")) {  // ()
        auto l = node<ListExpr>(ln);
        l->tuple = true;
        return l;
      }
      ExprPtr e = parse_expr();
      if (peek_op(",")) {
        auto l = node<ListExpr>(ln);
        l->tuple = true;
        l->items.push_back(std::move(e));
        while (accept(",") && !peek_op(")")) l->items.push_back(parse_expr());
        e = sealed(l, l->items);
      }
      expect(")");
      return e;
    }
    if (accept("[")) {
      auto l = node<ListExpr>(ln);
      while (!peek_op("]")) {
        l->items.push_back(parse_expr());
        if (!accept(",")) break;
      }
      expect("]");
      return sealed(l, l->items);
    }
    if (accept("{")) {
      auto d = node<DictExpr>(ln);
      while (!peek_op("}")) {
        ExprPtr k = parse_expr();
        expect(":");
        d->items.emplace_back(std::move(k), parse_expr());
        if (!accept(",")) break;
      }
      expect("}");
      return sealed(d, d->items);
    }
    throw SyntaxError(fmt::format("line {}: unexpected '{}'", ln, t.text));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const int ln = line();
      if (accept(".")) {
        auto g = node<GetAttr>(ln);
        g->obj = std::move(e);
        if (tok_ < toks_->size() && cur().type == Token::Type::integer) {  // x.0: an index
          auto gi = node<GetItem>(ln);
          gi->obj = std::move(g->obj);
          auto idx = node<Literal>(ln);
          idx->value = Value(cur().i);
          ++tok_;
          gi->index = std::move(idx);
          e = sealed(gi, gi->obj);
          continue;
        }
        g->name = expect_name();
        e = sealed(g, g->obj);
      } else if (accept("[")) {
        ExprPtr a, b, c;
        bool slice = false;
        if (!peek_op(":")) a = parse_expr();
        if (accept(":")) {
          slice = true;
          if (!peek_op(":") && !peek_op("]")) b = parse_expr();
          if (accept(":") && !peek_op("]")) c = parse_expr();
        }
        expect("]");
        if (slice) {
          auto s = node<SliceExpr>(ln);
          s->obj = std::move(e);
          s->start = std::move(a);
          s->stop = std::move(b);
          s->step = std::move(c);
          e = sealed(s, s->obj, s->start, s->stop, s->step);
        } else {
          auto g = node<GetItem>(ln);
          g->obj = std::move(e);
          g->index = std::move(a);
          e = sealed(g, g->obj, g->index);
        }
      } else if (accept("(")) {
        auto c = node<Call>(ln);
        c->callee = std::move(e);
        c->args = call_args();
        e = sealed(c, c->callee, c->args);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      const int ln = line();
      if (accept("|")) {
        auto f = node<FilterExpr>(ln);
        f->operand = std::move(e);
        f->name = expect_name();
        if (!known_filter(f->name)) throw Unsupported(fmt::format("line {}: the filter '{}' is not supported", ln, f->name));
        if (accept("(")) f->args = call_args();
        e = sealed(f, f->operand, f->args);
      } else if (peek_name("is")) {
        ++tok_;
        auto t = node<TestExpr>(ln);
        t->operand = std::move(e);
        t->negated = accept_name("not");
        t->name = expect_name();
        if (!known_test(t->name)) throw Unsupported(fmt::format("line {}: the test '{}' is not supported", ln, t->name));
        if (accept("(")) {
          t->args = call_args();
        } else if (tok_ < toks_->size() && !peek_name("else") && !peek_name("or") && !peek_name("and") &&
                   !peek_name("if") && (cur().type != Token::Type::op || peek_op("[") || peek_op("{"))) {
          t->args.positional.push_back(parse_postfix(parse_primary()));  // `is divisibleby 3`
        }
        e = sealed(t, t->operand, t->args);
      } else if (peek_op("(")) {
        return parse_postfix(std::move(e));
      } else {
        return e;
      }
    }
  }

  // After "(": arguments up to ")".
  ArgExprs call_args() {
    ArgExprs a;
    while (!peek_op(")")) {
      if (peek_op("*") || peek_op("**")) throw Unsupported(fmt::format("line {}: *args and **kwargs are not supported", line()));
      if (tok_ + 1 < toks_->size() && cur().type == Token::Type::name && (*toks_)[tok_ + 1].type == Token::Type::op &&
          (*toks_)[tok_ + 1].text == "=") {
        std::string k = cur().text;
        tok_ += 2;
        a.keyword.emplace_back(std::move(k), parse_expr());
      } else {
        if (!a.keyword.empty()) throw SyntaxError(fmt::format("line {}: a positional argument after a keyword one", line()));
        a.positional.push_back(parse_expr());
      }
      if (!accept(",")) break;
    }
    expect(")");
    return a;
  }

  // ---- tokens ----
  const Token& cur() const { return (*toks_)[tok_]; }
  int line() const {
    if (toks_ && tok_ < toks_->size()) return cur().line;
    return seg_ < segs_.size() ? segs_[seg_].line : 0;
  }
  bool peek_op(const char* op) const {
    return toks_ && tok_ < toks_->size() && cur().type == Token::Type::op && cur().text == op;
  }
  bool peek_name(const char* n) const {
    return toks_ && tok_ < toks_->size() && cur().type == Token::Type::name && cur().text == n;
  }
  bool accept(const char* op) {
    if (!peek_op(op)) return false;
    ++tok_;
    return true;
  }
  bool accept_name(const char* n) {
    if (!peek_name(n)) return false;
    ++tok_;
    return true;
  }
  void expect(const char* op) {
    if (!accept(op))
      throw SyntaxError(fmt::format("line {}: expected '{}'{}", line(), op,
                                    tok_ < toks_->size() ? fmt::format(", found '{}'", cur().text) : std::string()));
  }
  std::string expect_name() {
    if (tok_ >= toks_->size() || cur().type != Token::Type::name)
      throw SyntaxError(fmt::format("line {}: expected a name", line()));
    return (*toks_)[tok_++].text;
  }
  void expect_end() {
    if (tok_ < toks_->size()) throw SyntaxError(fmt::format("line {}: unexpected '{}'", line(), cur().text));
  }

  std::vector<Segment> segs_;
  size_t seg_ = 0;
  const std::vector<Token>* toks_ = nullptr;
  size_t tok_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(std::string_view source) { return Parser(lex(source)).run(); }

}  // namespace ember::jinja
