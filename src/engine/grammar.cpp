#include "engine/grammar.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember {

namespace {
// Drops repeated readings (sorted, so equal stacks sit together).
void dedup(std::vector<std::vector<int32_t>>& stacks) {
  if (stacks.size() < 2) return;
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
}
// Deepest chain of rule references expanded before a byte is matched: only a left-recursive
// grammar (which finish() cannot always see) gets near it.
constexpr int kMaxExpandDepth = 256;
// Most readings of the text kept at once; a grammar that needs more is too ambiguous to run.
constexpr size_t kMaxStacks = 4096;
}  // namespace

int Grammar::add_rule(std::string name) {
  EMBER_CHECK(root_ < 0, "grammar: rules cannot be added after finish()");
  rules_.push_back({std::move(name), {}, {}});
  return static_cast<int>(rules_.size()) - 1;
}

void Grammar::add_alternative(int rule, const Sequence& seq) {
  EMBER_CHECK(rule >= 0 && rule < n_rules() && root_ < 0, "grammar: no rule {} to add to", rule);
  rules_[static_cast<size_t>(rule)].alts.push_back(seq);
}

void Grammar::append_literal(Sequence& seq, std::string_view text) {
  for (char c : text) seq.push_back(Symbol::bytes(ByteSet().add(static_cast<uint8_t>(c))));
}

int Grammar::add_literal(std::string_view text) {
  const int r = add_rule(std::string(text));
  Sequence s;
  append_literal(s, text);
  add_alternative(r, s);
  return r;
}

std::string Grammar::left_recursive_rule() const {
  const size_t n = rules_.size();
  // Rules that may match nothing, to a fixed point: an alternative of nullable references only.
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& seq : rules_[r].alts) {
        bool all = true;
        for (const Symbol& s : seq) all = all && s.rule >= 0 && s.rule < n_rules() && nullable[static_cast<size_t>(s.rule)];
        if (all) {
          nullable[r] = 1, changed = true;
          break;
        }
      }
    }
  }
  // The rules each rule may expand before a byte: the references at the start of an alternative,
  // past nullable ones. A cycle among them is left recursion.
  std::vector<std::vector<int>> left(n);
  for (size_t r = 0; r < n; ++r)
    for (const Sequence& seq : rules_[r].alts)
      for (const Symbol& s : seq) {
        if (s.rule < 0 || s.rule >= n_rules()) break;
        left[r].push_back(s.rule);
        if (!nullable[static_cast<size_t>(s.rule)]) break;
      }
  std::vector<char> state(n, 0);  // 0 unseen, 1 on the path, 2 done
  std::vector<std::pair<size_t, size_t>> stack;  // (rule, next edge)
  for (size_t start = 0; start < n; ++start) {
    if (state[start]) continue;
    stack.push_back({start, 0});
    state[start] = 1;
    while (!stack.empty()) {
      auto& [r, e] = stack.back();
      if (e == left[r].size()) {
        state[r] = 2;
        stack.pop_back();
        continue;
      }
      const size_t next = static_cast<size_t>(left[r][e++]);
      if (state[next] == 1) return rules_[next].name;
      if (state[next] == 0) {
        state[next] = 1;
        stack.push_back({next, 0});
      }
    }
  }
  return {};
}

void Grammar::finish(int root) {
  EMBER_CHECK(root >= 0 && root < n_rules(), "grammar: no root rule {}", root);
  const std::string lr = left_recursive_rule();
  EMBER_CHECK(lr.empty(), "grammar: rule '{}' can reach itself before matching a byte (left recursion)", lr);
  elems_.clear();
  for (Rule& r : rules_) {
    EMBER_CHECK(!r.alts.empty(), "grammar: rule '{}' has no alternative", r.name);
    r.alt_start.clear();
    for (const Sequence& seq : r.alts) {
      r.alt_start.push_back(static_cast<int32_t>(elems_.size()));
      for (const Symbol& s : seq) {
        EMBER_CHECK(s.rule < n_rules(), "grammar: rule '{}' refers to no rule {}", r.name, s.rule);
        elems_.push_back({s.rule, false, s.set});
      }
      elems_.push_back({-1, true, {}});
    }
  }
  root_ = root;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  EMBER_CHECK(g_ && g_->root_ >= 0, "grammar: a matcher needs a finished grammar");
  const Grammar::Rule& root = g_->rules_[static_cast<size_t>(g_->root_)];
  for (int32_t start : root.alt_start) {
    Stack s;
    if (!g_->elems_[static_cast<size_t>(start)].end) s.push_back(start);
    expand(std::move(s), stacks_, 0);
  }
  dedup(stacks_);
  update_first();
}

ByteSet GrammarMatcher::next_bytes(const std::vector<Stack>& stacks) const {
  ByteSet b;
  for (const Stack& s : stacks)
    if (!s.empty()) b |= g_->elems_[static_cast<size_t>(s.back())].set;
  return b;
}

void GrammarMatcher::update_first() {
  second_known_ = ByteSet();
  first_ = next_bytes(stacks_);
}

void GrammarMatcher::expand(Stack s, std::vector<Stack>& out, int depth) const {
  EMBER_CHECK(depth < kMaxExpandDepth, "grammar: rule references nest deeper than {} (a left-recursive rule?)",
              kMaxExpandDepth);
  if (s.empty() || g_->elems_[static_cast<size_t>(s.back())].rule < 0) {
    EMBER_CHECK(out.size() < kMaxStacks, "grammar: more than {} readings of the text at once (too ambiguous)",
                kMaxStacks);
    out.push_back(std::move(s));
    return;
  }
  const int32_t at = s.back();
  s.pop_back();
  if (!g_->elems_[static_cast<size_t>(at) + 1].end) s.push_back(at + 1);  // what follows the reference
  const Grammar::Rule& r = g_->rules_[static_cast<size_t>(g_->elems_[static_cast<size_t>(at)].rule)];
  for (int32_t start : r.alt_start) {
    Stack t = s;
    if (!g_->elems_[static_cast<size_t>(start)].end) t.push_back(start);
    expand(std::move(t), out, depth + 1);
  }
}

bool GrammarMatcher::advance(const std::vector<Stack>& in, uint8_t byte, std::vector<Stack>& out) const {
  out.clear();
  for (const Stack& s : in) {
    if (s.empty()) continue;
    const int32_t at = s.back();
    if (!g_->elems_[static_cast<size_t>(at)].set.has(byte)) continue;
    Stack t(s.begin(), s.end() - 1);
    if (!g_->elems_[static_cast<size_t>(at) + 1].end) t.push_back(at + 1);
    expand(std::move(t), out, 0);
  }
  dedup(out);
  return !out.empty();
}

bool GrammarMatcher::allows(std::string_view bytes) const {
  if (bytes.empty() || !first_.has(static_cast<uint8_t>(bytes[0]))) return false;
  thread_local std::vector<Stack> cur, next;
  if (bytes.size() >= 2) {
    const auto b0 = static_cast<uint8_t>(bytes[0]);
    if (!second_known_.has(b0)) {
      advance(stacks_, b0, next);
      second_[b0] = next_bytes(next);
      second_known_.add(b0);
    }
    if (!second_[b0].has(static_cast<uint8_t>(bytes[1]))) return false;
  }
  const std::vector<Stack>* from = &stacks_;
  for (char c : bytes) {
    if (!advance(*from, static_cast<uint8_t>(c), next)) return false;
    cur.swap(next);
    from = &cur;
  }
  return true;
}

void GrammarMatcher::accept(std::string_view bytes) {
  std::vector<Stack> next;
  for (char c : bytes) {
    EMBER_CHECK(advance(stacks_, static_cast<uint8_t>(c), next), "grammar: the text does not fit the grammar at byte {}",
                static_cast<int>(static_cast<uint8_t>(c)));
    stacks_.swap(next);
  }
  update_first();
}

bool GrammarMatcher::complete() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool GrammarMatcher::can_continue() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return !s.empty(); });
}

TokenGrammar::TokenGrammar(const Tokenizer& tok) : tok_(tok) {
  pieces_.resize(static_cast<size_t>(tok.n_vocab()));
  for (int32_t t = 0; t < static_cast<int32_t>(pieces_.size()); ++t)
    if (!tok.is_eog(t) && !tok.is_control(t)) pieces_[static_cast<size_t>(t)] = tok.token_to_piece(t);
}

bool TokenGrammar::allows(const GrammarMatcher& m, int32_t token) const {
  if (token < 0 || token >= n_vocab()) return false;
  if (tok_.is_eog(token)) return m.complete();
  return m.allows(pieces_[static_cast<size_t>(token)]);
}

void TokenGrammar::accept(GrammarMatcher& m, int32_t token) const {
  if (tok_.is_eog(token)) return;
  m.accept(pieces_[static_cast<size_t>(token)]);
}

}  // namespace ember
