// Running a parsed template: each node's evaluation (ast.hpp), the Context, and Template.
#include <cmath>

#include <fmt/format.h>

#include "jinja/ast.hpp"
#include "jinja/builtins.hpp"
#include "jinja/error.hpp"
#include "jinja/jinja.hpp"
#include "jinja/parser.hpp"

namespace ember::jinja {

// ---- the bounds of the render on this thread ------------------------------------------------------

namespace {
struct Budget {
  size_t made = 0, max = 0;
  int nesting = 0;
};
thread_local Budget* t_budget = nullptr;
}  // namespace

void count_made(size_t bytes) {
  if (!t_budget) return;
  need_room(bytes);
  t_budget->made += bytes;
}

void need_room(size_t bytes) {
  if (t_budget && bytes > t_budget->max - t_budget->made)
    throw Error(fmt::format("the template made more than {} bytes of strings and lists", t_budget->max));
}

NestingGuard::NestingGuard() {
  if (t_budget && ++t_budget->nesting > kMaxValueDepth) {
    --t_budget->nesting;
    throw Error(fmt::format("a value nested more than {} levels deep (or inside itself)", kMaxValueDepth));
  }
}

NestingGuard::~NestingGuard() {
  if (t_budget) --t_budget->nesting;
}

// ---- Context ----------------------------------------------------------------------------------

Context::Context(const Value& variables, const Limits& limits)
    : limits_(limits),
      deadline_(std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(limits.max_seconds))) {
  scopes_.push_back(global_functions(limits));
  Scope given;
  if (variables.is_object())
    for (const auto& [k, v] : variables.as_object().items()) given[k] = v;
  scopes_.push_back(std::move(given));
  scopes_.emplace_back();  // the template's top level
}

Value Context::lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    const auto f = it->find(name);
    if (f != it->end()) return f->second;
  }
  return Value();
}

std::vector<Context::Scope> Context::enter_macro() {
  std::vector<Scope> saved = scopes_;
  scopes_.resize(3);  // builtins, variables, the top level
  scopes_.emplace_back();
  return saved;
}

void Context::tick(int line) {
  if (++steps_ > limits_.max_steps)
    throw Error(fmt::format("line {}: the template ran more than {} steps", line, limits_.max_steps));
  if (steps_ % 1024 != 0) return;
  if (limits_.cancel && limits_.cancel->load())
    throw Error(fmt::format("line {}: the render was cancelled", line));
  if (std::chrono::steady_clock::now() > deadline_)
    throw Error(fmt::format("line {}: the template ran longer than {} s", line, limits_.max_seconds));
}

void Context::wrote(const std::string& out) const {
  if (out.size() > limits_.max_output)
    throw Error(fmt::format("the template wrote more than {} bytes", limits_.max_output));
}

// ---- expressions ------------------------------------------------------------------------------

namespace {

[[noreturn]] void type_error(int line, const std::string& op, const Value& a, const Value& b) {
  throw Error(fmt::format("line {}: unsupported operand types for {}: '{}' and '{}'", line, op, a.type_name(),
                          b.type_name()));
}

double number(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number(); }
bool numeric(const Value& v) { return v.is_number() || v.is_bool(); }
bool both_int(const Value& a, const Value& b) { return (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool()); }
int64_t integer(const Value& v) { return v.is_bool() ? v.as_bool() : v.as_int(); }

Value contains(const Value& container, const Value& item, int line) {
  if (container.is_string()) {
    if (!item.is_string()) throw Error(fmt::format("line {}: 'in <string>' requires a string on the left", line));
    return Value(container.as_string().find(item.as_string()) != std::string::npos);
  }
  if (container.is_array()) {
    for (const Value& x : container.as_array())
      if (x == item) return Value(true);
    return Value(false);
  }
  if (container.is_object()) return Value(item.is_string() && container.as_object().find(item.as_string()) != nullptr);
  if (container.is_undefined()) return Value(false);
  throw Error(fmt::format("line {}: argument of type '{}' is not iterable", line, container.type_name()));
}

// Integer arithmetic as Python's on the 64-bit range; a result outside it is an error (Python's
// integers would grow).
template <class Op>
int64_t checked(Op op, int64_t a, int64_t b, int line) {
  int64_t r = 0;
  if (op(a, b, &r)) throw Error(fmt::format("line {}: integer overflow", line));
  return r;
}
constexpr auto kAdd = [](int64_t a, int64_t b, int64_t* r) { return __builtin_add_overflow(a, b, r); };
constexpr auto kSub = [](int64_t a, int64_t b, int64_t* r) { return __builtin_sub_overflow(a, b, r); };
constexpr auto kMul = [](int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); };

Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "+") {
    if (numeric(a) && numeric(b))
      return both_int(a, b) ? Value(checked(kAdd, integer(a), integer(b), line))
                            : Value(number(a) + number(b));
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_array() && b.is_array()) {
      Value::Array r = a.as_array();
      r.insert(r.end(), b.as_array().begin(), b.as_array().end());
      return Value::array(std::move(r));
    }
    type_error(line, op, a, b);
  }
  if (op == "*" && (a.is_string() || b.is_string()) && (a.is_int() || b.is_int())) {
    const std::string& s = a.is_string() ? a.as_string() : b.as_string();
    const int64_t n = a.is_int() ? a.as_int() : b.as_int();
    if (n <= 0 || s.empty()) return Value("");
    if (static_cast<uint64_t>(n) > (uint64_t{1} << 40) / s.size()) throw Error(fmt::format("line {}: a string too long", line));
    need_room(s.size() * static_cast<size_t>(n));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  if (!numeric(a) || !numeric(b)) type_error(line, op, a, b);
  if (op == "-")
    return both_int(a, b) ? Value(checked(kSub, integer(a), integer(b), line))
                          : Value(number(a) - number(b));
  if (op == "*")
    return both_int(a, b) ? Value(checked(kMul, integer(a), integer(b), line))
                          : Value(number(a) * number(b));
  if (op == "**") {
    if (both_int(a, b) && integer(b) >= 0) {
      const int64_t base = integer(a), e = integer(b);
      if (base == 0 || base == 1) return Value(e == 0 ? int64_t{1} : base);
      if (base == -1) return Value(e % 2 == 0 ? int64_t{1} : int64_t{-1});
      int64_t p = 1;  // |base| >= 2: past 63 factors it overflows
      for (int64_t i = 0; i < e; ++i) p = checked(kMul, p, base, line);
      return Value(p);
    }
    return Value(std::pow(number(a), number(b)));
  }
  if ((op == "/" || op == "//" || op == "%") && number(b) == 0)
    throw Error(fmt::format("line {}: division by zero", line));
  if (op == "/") return Value(number(a) / number(b));
  if (op == "//") {
    if (both_int(a, b)) {
      const int64_t x = integer(a), y = integer(b);
      if (y == -1) return Value(checked(kSub, int64_t{0}, x, line));  // (INT64_MIN // -1)
      const int64_t q = x / y;
      return Value((x % y != 0 && ((x < 0) != (y < 0))) ? q - 1 : q);
    }
    return Value(std::floor(number(a) / number(b)));
  }
  if (both_int(a, b)) {  // Python's %: the sign of the divisor
    const int64_t x = integer(a), y = integer(b);
    if (y == -1) return Value(int64_t{0});  // (INT64_MIN % -1 traps in C++)
    const int64_t m = x % y;
    return Value(m != 0 && ((m < 0) != (y < 0)) ? m + y : m);
  }
  const double m = std::fmod(number(a), number(b));
  return Value(m != 0 && ((m < 0) != (number(b) < 0)) ? m + number(b) : m);
}

}  // namespace

Args ArgExprs::eval(Context& ctx) const {
  Args a;
  for (const ExprPtr& e : positional) a.positional.push_back(e->eval(ctx));
  for (const auto& [k, e] : keyword) a.keyword.emplace_back(k, e->eval(ctx));
  return a;
}

Value Name::eval(Context& ctx) const {
  ctx.tick(line);
  return ctx.lookup(name);
}

Value ListExpr::eval(Context& ctx) const {
  ctx.tick(line);
  Value::Array a;
  for (const ExprPtr& e : items) a.push_back(e->eval(ctx));
  return tuple ? Value::tuple(std::move(a)) : Value::array(std::move(a));
}

Value DictExpr::eval(Context& ctx) const {
  ctx.tick(line);
  Value d = Value::object();
  for (const auto& [k, v] : items) {
    const Value key = k->eval(ctx);
    if (!key.is_string()) throw Error(fmt::format("line {}: dict keys must be strings here, got {}", line, key.type_name()));
    d.as_object().set(key.as_string(), v->eval(ctx));
  }
  return d;
}

Value GetAttr::eval(Context& ctx) const {
  ctx.tick(line);
  return get_attr(obj->eval(ctx), name);
}

Value GetItem::eval(Context& ctx) const {
  ctx.tick(line);
  const Value o = obj->eval(ctx);
  const Value k = index->eval(ctx);
  Value v = get_item(o, k);
  if (v.is_undefined() && k.is_string() && !o.is_object()) return get_attr(o, k.as_string());
  return v;
}

Value SliceExpr::eval(Context& ctx) const {
  ctx.tick(line);
  const Value o = obj->eval(ctx);
  return slice(o, start ? start->eval(ctx) : Value(), stop ? stop->eval(ctx) : Value(), step ? step->eval(ctx) : Value());
}

Value Call::eval(Context& ctx) const {
  ctx.tick(line);
  const Value f = callee->eval(ctx);
  Args a = args.eval(ctx);
  if (!f.is_function()) {
    if (const auto* n = dynamic_cast<const Name*>(callee.get()); n && f.is_undefined())
      throw Unsupported(fmt::format("line {}: '{}' is undefined: the template calls a function this engine does not "
                                    "provide", line, n->name));
    if (const auto* g = dynamic_cast<const GetAttr*>(callee.get()); g && f.is_undefined())
      throw Unsupported(fmt::format("line {}: the method '{}' is not supported", line, g->name));
    throw Error(fmt::format("line {}: '{}' object is not callable", line, f.type_name()));
  }
  return f.call(a);
}

Value FilterExpr::eval(Context& ctx) const {
  ctx.tick(line);
  const Value v = operand->eval(ctx);
  Args a = args.eval(ctx);
  try {
    return apply_filter(name, v, a, ctx);
  } catch (const Raised&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("line {}: filter {}: {}", line, name, e.what()));
  }
}

Value TestExpr::eval(Context& ctx) const {
  ctx.tick(line);
  const Value v = operand->eval(ctx);
  Args a = args.eval(ctx);
  return Value(apply_test(name, v, a) != negated);
}

Value Unary::eval(Context& ctx) const {
  ctx.tick(line);
  const Value v = operand->eval(ctx);
  if (op == "not") return Value(!v.truthy());
  if (!numeric(v)) throw Error(fmt::format("line {}: bad operand type for unary {}: '{}'", line, op, v.type_name()));
  if (op == "+") return v.is_bool() ? Value(integer(v)) : v;
  return v.is_float() ? Value(-v.as_number()) : Value(checked(kSub, int64_t{0}, integer(v), line));
}

Value Binary::eval(Context& ctx) const {
  ctx.tick(line);
  if (op == "and") {
    Value a = lhs->eval(ctx);
    return a.truthy() ? rhs->eval(ctx) : a;
  }
  if (op == "or") {
    Value a = lhs->eval(ctx);
    return a.truthy() ? a : rhs->eval(ctx);
  }
  const Value a = lhs->eval(ctx), b = rhs->eval(ctx);
  if (op == "~") return Value(a.str() + b.str());
  if (op == "==") return Value(a == b);
  if (op == "!=") return Value(!(a == b));
  if (op == "<") return Value(a.less(b));
  if (op == ">") return Value(b.less(a));
  if (op == "<=") return Value(!b.less(a));
  if (op == ">=") return Value(!a.less(b));
  if (op == "in") return contains(b, a, line);
  if (op == "not in") return Value(!contains(b, a, line).as_bool());
  return arithmetic(op, a, b, line);
}

Value Conditional::eval(Context& ctx) const {
  ctx.tick(line);
  if (cond->eval(ctx).truthy()) return then->eval(ctx);
  return otherwise ? otherwise->eval(ctx) : Value();
}

// ---- statements -------------------------------------------------------------------------------

namespace {

void render_body(const Body& body, Context& ctx, std::string& out) {
  for (const StmtPtr& s : body) {
    s->render(ctx, out);
    if (ctx.flow != Context::Flow::normal) return;
  }
}

void bind_targets(Context& ctx, const std::vector<std::string>& targets, const Value& v, int line) {
  if (targets.size() == 1) return ctx.set(targets[0], v);
  if (!v.is_array() || v.as_array().size() != targets.size())
    throw Error(fmt::format("line {}: cannot unpack {} into {} names", line, v.type_name(), targets.size()));
  for (size_t i = 0; i < targets.size(); ++i) ctx.set(targets[i], v.as_array()[i]);
}

}  // namespace

void TextStmt::render(Context& ctx, std::string& out) const {
  ctx.tick(line);
  out += text;
  ctx.wrote(out);
}

void OutputStmt::render(Context& ctx, std::string& out) const {
  ctx.tick(line);
  out += expr->eval(ctx).str();
  ctx.wrote(out);
}

void IfStmt::render(Context& ctx, std::string& out) const {
  ctx.tick(line);
  for (const auto& [cond, body] : branches)
    if (cond->eval(ctx).truthy()) return render_body(body, ctx, out);
  render_body(otherwise, ctx, out);
}

void ForStmt::render(Context& ctx, std::string& out) const {
  ctx.tick(line);
  Value::Array all = items_of(iter->eval(ctx), line);
  Value::Array items;
  if (filter) {
    for (const Value& v : all) {
      ctx.tick(line);
      ctx.push();
      bind_targets(ctx, targets, v, line);
      const bool keep = filter->eval(ctx).truthy();
      ctx.pop();
      if (keep) items.push_back(v);
    }
  } else {
    items = std::move(all);
  }
  if (items.empty()) return render_body(otherwise, ctx, out);
  const auto n = static_cast<int64_t>(items.size());
  // One `loop` for the whole loop, its fields changed as it goes (as Jinja2's LoopContext).
  Value loop = Value::object();
  Value::Object& l = loop.as_object();
  for (const char* k : {"index", "index0", "revindex", "revindex0", "first", "last", "previtem", "nextitem"})
    l.set(k, Value());
  l.set("length", Value(n));
  l.set("depth", Value(int64_t{1}));
  l.set("depth0", Value(int64_t{0}));
  auto at = std::make_shared<int64_t>(0);
  l.set("cycle", Value::function("loop.cycle", [at](Args& a) {
          if (a.positional.empty()) throw Error("loop.cycle() takes at least one value");
          return a.positional[static_cast<size_t>(*at) % a.positional.size()];
        }));
  Value* const fields[] = {l.find("index"), l.find("index0"), l.find("revindex"), l.find("revindex0"),
                           l.find("first"), l.find("last"), l.find("previtem"), l.find("nextitem")};
  for (int64_t i = 0; i < n; ++i) {
    ctx.tick(line);  // an iteration is a step, its body empty or not
    *at = i;
    *fields[0] = Value(i + 1);
    *fields[1] = Value(i);
    *fields[2] = Value(n - i);
    *fields[3] = Value(n - i - 1);
    *fields[4] = Value(i == 0);
    *fields[5] = Value(i == n - 1);
    *fields[6] = i > 0 ? items[static_cast<size_t>(i - 1)] : Value();
    *fields[7] = i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value();
    ctx.push();
    ctx.set("loop", loop);
    bind_targets(ctx, targets, items[static_cast<size_t>(i)], line);
    render_body(body, ctx, out);
    ctx.pop();
    const Context::Flow f = ctx.flow;
    ctx.flow = Context::Flow::normal;
    if (f == Context::Flow::break_loop) break;
  }
}

namespace {
// Whether `v` is or holds (at any depth) the same dict as `target`: a namespace that held itself
// would never be freed.
bool holds(const Value& v, const Value& target) {
  if (v.same_as(target)) return true;
  const NestingGuard level;
  if (v.is_array())
    for (const Value& x : v.as_array())
      if ((x.is_array() || x.is_object()) && holds(x, target)) return true;
  if (v.is_object())
    for (const auto& [k, x] : v.as_object().items())
      if ((x.is_array() || x.is_object()) && holds(x, target)) return true;
  return false;
}
}  // namespace

void SetStmt::render(Context& ctx, std::string& out) const {
  ctx.tick(line);
  Value v;
  if (value) {
    v = value->eval(ctx);
  } else {
    std::string captured;
    render_body(body, ctx, captured);
    v = Value(std::move(captured));
  }
  if (ns) {
    const Value target = ns->eval(ctx);
    if (!target.is_object() || !target.as_object().is_namespace)
      throw Error(fmt::format("line {}: cannot assign the attribute '{}' of a {} (only of a namespace())", line, attr,
                              target.type_name()));
    if ((v.is_array() || v.is_object()) && holds(v, target))
      throw Error(fmt::format("line {}: a namespace cannot hold itself (set {})", line, attr));
    target.as_object().set(attr, std::move(v));
    return;
  }
  bind_targets(ctx, targets, v, line);
}

void MacroStmt::render(Context& ctx, std::string&) const {
  ctx.tick(line);
  Context* c = &ctx;  // the render's: a macro never outlives it
  const MacroStmt* m = this;
  ctx.set(name, Value::function(name, [c, m](Args& a) {
            if (a.positional.size() > m->params.size())
              throw Error(fmt::format("line {}: macro '{}' takes {} arguments, {} given", m->line, m->name,
                                      m->params.size(), a.positional.size()));
            if (++c->call_depth > c->limits().max_call_depth)
              throw Error(fmt::format("line {}: macros call each other more than {} deep", m->line,
                                      c->limits().max_call_depth));
            std::vector<Context::Scope> saved = c->enter_macro();
            std::string out;
            try {
              for (size_t i = 0; i < m->params.size(); ++i) {
                const auto& [pname, def] = m->params[i];
                Value v;
                if (i < a.positional.size()) v = a.positional[i];
                else if (def) v = def->eval(*c);
                for (const auto& [k, kv] : a.keyword)
                  if (k == pname) v = kv;
                c->set(pname, v);
              }
              render_body(m->body, *c, out);
            } catch (...) {
              c->leave_macro(std::move(saved));
              --c->call_depth;
              throw;
            }
            c->flow = Context::Flow::normal;
            c->leave_macro(std::move(saved));
            --c->call_depth;
            return Value(std::move(out));
          }));
}

void FilterBlock::render(Context& ctx, std::string& out) const {
  ctx.tick(line);
  std::string inner;
  render_body(body, ctx, inner);
  Args a = args.eval(ctx);
  out += apply_filter(name, Value(std::move(inner)), a, ctx).str();
  ctx.wrote(out);
}

void LoopControl::render(Context& ctx, std::string&) const {
  ctx.tick(line);
  ctx.flow = is_break ? Context::Flow::break_loop : Context::Flow::continue_loop;
}

void BodyStmt::render(Context& ctx, std::string& out) const {
  ctx.tick(line);
  render_body(body, ctx, out);
}

// ---- Template ---------------------------------------------------------------------------------

struct Template::Impl {
  Body body;
};

Template::Template(std::string_view source) : impl_(std::make_unique<Impl>()) {
  if (source.size() > kMaxTemplateBytes)
    throw Error(fmt::format("the template has {} bytes, more than {}", source.size(), kMaxTemplateBytes));
  impl_->body = parse(source);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& variables, const Limits& limits) const {
  Budget budget{0, limits.max_made, 0};
  struct Scope {
    Budget* outer;
    explicit Scope(Budget* b) : outer(t_budget) { t_budget = b; }
    ~Scope() { t_budget = outer; }
  } scope(&budget);
  Context ctx(variables, limits);
  std::string out;
  render_body(impl_->body, ctx, out);
  return out;
}

}  // namespace ember::jinja
