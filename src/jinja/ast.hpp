// A parsed template (parser.cpp builds it, render.cpp runs it): expressions evaluate to Values,
// statements write text.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.hpp"

namespace ember::jinja {

class Context;

struct Expr {
  virtual ~Expr() = default;
  virtual Value eval(Context& ctx) const = 0;
  int line = 0;
  int height = 1;  // of the tree below (the parser bounds it: evaluating and freeing it recurse)
};
using ExprPtr = std::unique_ptr<Expr>;

struct Stmt {
  virtual ~Stmt() = default;
  virtual void render(Context& ctx, std::string& out) const = 0;
  int line = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// A call's argument expressions (function calls, filters, tests).
struct ArgExprs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  Args eval(Context& ctx) const;
};

// ---- expressions ----
struct Literal : Expr {
  Value value;
  Value eval(Context&) const override { return value; }
};
struct Name : Expr {
  std::string name;
  Value eval(Context& ctx) const override;
};
struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  bool tuple = false;
  Value eval(Context& ctx) const override;
};
struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value eval(Context& ctx) const override;
};
struct GetAttr : Expr {  // obj.name
  ExprPtr obj;
  std::string name;
  Value eval(Context& ctx) const override;
};
struct GetItem : Expr {  // obj[index]
  ExprPtr obj, index;
  Value eval(Context& ctx) const override;
};
struct SliceExpr : Expr {  // obj[start:stop:step]
  ExprPtr obj, start, stop, step;
  Value eval(Context& ctx) const override;
};
struct Call : Expr {
  ExprPtr callee;
  ArgExprs args;
  Value eval(Context& ctx) const override;
};
struct FilterExpr : Expr {  // operand | name(args)
  ExprPtr operand;
  std::string name;
  ArgExprs args;
  Value eval(Context& ctx) const override;
};
struct TestExpr : Expr {  // operand is [not] name(args)
  ExprPtr operand;
  std::string name;
  ArgExprs args;
  bool negated = false;
  Value eval(Context& ctx) const override;
};
struct Unary : Expr {  // -x, +x, not x
  std::string op;
  ExprPtr operand;
  Value eval(Context& ctx) const override;
};
struct Binary : Expr {  // arithmetic, ~, comparisons, in, not in, and, or
  std::string op;
  ExprPtr lhs, rhs;
  Value eval(Context& ctx) const override;
};
struct Conditional : Expr {  // then if cond else otherwise
  ExprPtr cond, then, otherwise;  // otherwise may be null: undefined
  Value eval(Context& ctx) const override;
};

// ---- statements ----
struct TextStmt : Stmt {
  std::string text;
  void render(Context& ctx, std::string& out) const override;
};
struct OutputStmt : Stmt {  // {{ expr }}
  ExprPtr expr;
  void render(Context& ctx, std::string& out) const override;
};
struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body otherwise;
  void render(Context& ctx, std::string& out) const override;
};
struct ForStmt : Stmt {
  std::vector<std::string> targets;  // one name, or several unpacked from each item
  ExprPtr iter, filter;              // filter: `for x in xs if cond` (may be null)
  Body body, otherwise;
  void render(Context& ctx, std::string& out) const override;
};
struct SetStmt : Stmt {
  std::vector<std::string> targets;  // names (several: unpacked)
  ExprPtr ns;                        // set ns.attr = value: ns and attr
  std::string attr;
  ExprPtr value;                     // null: a block set, whose body is the value
  Body body;
  void render(Context& ctx, std::string& out) const override;
};
struct MacroStmt : Stmt {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
  void render(Context& ctx, std::string& out) const override;
};
struct FilterBlock : Stmt {  // {% filter name(args) %}...{% endfilter %}
  std::string name;
  ArgExprs args;
  Body body;
  void render(Context& ctx, std::string& out) const override;
};
struct LoopControl : Stmt {  // break / continue
  bool is_break = false;
  void render(Context& ctx, std::string& out) const override;
};
struct BodyStmt : Stmt {  // {% generation %}...: the body as is
  Body body;
  void render(Context& ctx, std::string& out) const override;
};

}  // namespace ember::jinja
