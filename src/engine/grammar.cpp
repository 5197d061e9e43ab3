#include "engine/grammar.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember {

int Grammar::add_rule(std::string name) {
  EMBER_CHECK(root_ < 0, "grammar: rules cannot be added after finish()");
  constexpr size_t kMaxName = 120;  // names appear in errors; a rule of a long literal is named by it
  if (name.size() > kMaxName) name = name.substr(0, kMaxName) + "...";
  if (++n_symbols_ > kMaxGrammarSymbols) too_large();
  rules_.push_back({std::move(name), {}, {}});
  return static_cast<int>(rules_.size()) - 1;
}

void Grammar::too_large() {
  throw GrammarError(fmt::format("grammar: more than {} symbols (bounds such as maxItems or maxLength add symbols for "
                                 "every item they allow): simplify the schema", kMaxGrammarSymbols));
}

void Grammar::add_alternative(int rule, const Sequence& seq) {
  EMBER_CHECK(rule >= 0 && rule < n_rules() && root_ < 0, "grammar: no rule {} to add to", rule);
  n_symbols_ += seq.size() + 1;
  if (n_symbols_ > kMaxGrammarSymbols) too_large();
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

int Grammar::add_choice(const std::string& name, std::vector<std::string> texts) {
  EMBER_CHECK(!texts.empty(), "grammar: a choice of no texts");
  std::sort(texts.begin(), texts.end());
  texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
  // A rule per group of texts that share a prefix past `depth`: for each next byte, that byte then
  // the rule of the texts that continue with it (or nothing, where a text ends there). Built with
  // an explicit stack of the groups still to fill.
  struct Group {
    int rule;
    size_t begin, end, depth;  // texts[begin, end) agree on their first `depth` bytes
  };
  const int root = add_rule(name);
  std::vector<Group> todo = {{root, 0, texts.size(), 0}};
  while (!todo.empty()) {
    const Group grp = todo.back();
    todo.pop_back();
    for (size_t i = grp.begin; i < grp.end;) {
      if (texts[i].size() == grp.depth) {  // a text that ends here (sorted first)
        add_alternative(grp.rule, {});
        ++i;
        continue;
      }
      const char c = texts[i][grp.depth];
      size_t j = i + 1;
      while (j < grp.end && texts[j].size() > grp.depth && texts[j][grp.depth] == c) ++j;
      Sequence seq;
      append_literal(seq, std::string_view(&c, 1));
      if (j - i == 1) {  // one text left: the rest of it as bytes
        append_literal(seq, std::string_view(texts[i]).substr(grp.depth + 1));
      } else {
        const int sub = add_rule(name);
        seq.push_back(Symbol::ref(sub));
        todo.push_back({sub, i, j, grp.depth + 1});
      }
      add_alternative(grp.rule, seq);
      i = j;
    }
  }
  return root;
}

std::string Grammar::left_recursive_rule() const {
  const size_t n = rules_.size();
  const auto valid = [&](const Symbol& s) { return s.rule >= 0 && s.rule < n_rules(); };
  // Rules that may match nothing: an alternative of nullable references only. A work list over
  // the alternatives, each with the count of its symbols not yet known nullable: linear.
  std::vector<char> nullable(n, 0);
  std::vector<std::vector<std::pair<size_t, size_t>>> used_in(n);  // rule -> (rule, alternative) using it
  std::vector<std::vector<size_t>> left(n);
  std::vector<size_t> work;
  std::vector<std::vector<size_t>> pending(n);
  for (size_t r = 0; r < n; ++r) {
    pending[r].resize(rules_[r].alts.size());
    for (size_t a = 0; a < rules_[r].alts.size(); ++a) {
      const Sequence& seq = rules_[r].alts[a];
      bool bytes = false;
      for (const Symbol& s : seq) bytes = bytes || !valid(s);
      if (bytes) {
        pending[r][a] = SIZE_MAX;  // never nullable
        continue;
      }
      pending[r][a] = seq.size();
      for (const Symbol& s : seq) used_in[static_cast<size_t>(s.rule)].push_back({r, a});
      if (seq.empty() && !nullable[r]) nullable[r] = 1, work.push_back(r);
    }
  }
  while (!work.empty()) {
    const size_t x = work.back();
    work.pop_back();
    for (const auto& [r, a] : used_in[x]) {
      if (pending[r][a] == SIZE_MAX || --pending[r][a] != 0 || nullable[r]) continue;
      nullable[r] = 1;
      work.push_back(r);
    }
  }
  // The rules each rule may expand before a byte: the references at the start of an alternative,
  // past nullable ones. A cycle among them is left recursion.
  for (size_t r = 0; r < n; ++r)
    for (const Sequence& seq : rules_[r].alts)
      for (const Symbol& s : seq) {
        if (!valid(s)) break;
        left[r].push_back(static_cast<size_t>(s.rule));
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
      const size_t next = left[r][e++];
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
  if (root < 0 || root >= n_rules()) throw GrammarError(fmt::format("grammar: no root rule {}", root));
  const std::string lr = left_recursive_rule();
  if (!lr.empty())
    throw GrammarError(fmt::format("grammar: rule '{}' can reach itself before matching a byte (left recursion)", lr));
  elems_.clear();
  for (Rule& r : rules_) {
    if (r.alts.empty()) throw GrammarError(fmt::format("grammar: rule '{}' has no alternative", r.name));
    r.alt_start.clear();
    for (const Sequence& seq : r.alts) {
      r.alt_start.push_back(static_cast<int32_t>(elems_.size()));
      for (const Symbol& s : seq) {
        if (s.rule >= n_rules()) throw GrammarError(fmt::format("grammar: rule '{}' refers to no rule {}", r.name, s.rule));
        elems_.push_back({s.rule, false, s.set});
      }
      elems_.push_back({-1, true, {}});
    }
  }
  root_ = root;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  EMBER_CHECK(g_ && g_->root_ >= 0, "grammar: a matcher needs a finished grammar");
  ++epoch_;
  scratch_.clear();
  scratch_complete_ = false;
  for (int32_t start : g_->rules_[static_cast<size_t>(g_->root_)].alt_start)
    expand(g_->elems_[static_cast<size_t>(start)].end ? kEmpty : node(start, kEmpty));
  state_ = state_of_scratch();
}

int32_t GrammarMatcher::node(int32_t elem, int32_t rest) const {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(elem)) << 32) | static_cast<uint32_t>(rest);
  const auto [it, added] = node_index_.try_emplace(key, static_cast<int32_t>(node_elem_.size()));
  if (added) {
    node_elem_.push_back(elem);
    node_rest_.push_back(rest);
    mark_.push_back(0);
  }
  return it->second;
}

void GrammarMatcher::expand(int32_t n) const {
  // Iterative, each node once per expansion (the mark): a reference on top is replaced by each of
  // its rule's alternatives over what follows the reference.
  const auto& elems = g_->elems_;
  work_.clear();
  work_.push_back(n);
  size_t steps = 0;
  while (!work_.empty()) {
    const int32_t at = work_.back();
    work_.pop_back();
    if (at == kEmpty) {
      if (!scratch_complete_) scratch_.push_back(kEmpty);
      scratch_complete_ = true;
      continue;
    }
    if (mark_[static_cast<size_t>(at)] == epoch_) continue;
    mark_[static_cast<size_t>(at)] = epoch_;
    const int32_t e = node_elem_[static_cast<size_t>(at)];
    const int32_t rule = elems[static_cast<size_t>(e)].rule;
    if (rule < 0) {
      if (scratch_.size() >= kMaxReadings)
        throw GrammarError(fmt::format("grammar: more than {} readings of the text at once (the schema is too "
                                       "ambiguous: alternatives that start alike, such as a long anyOf)", kMaxReadings));
      scratch_.push_back(at);
      continue;
    }
    if (++steps > kMaxExpansionSteps)
      throw GrammarError(fmt::format("grammar: more than {} rule expansions after one byte (the schema is too "
                                     "complex to follow)", kMaxExpansionSteps));
    const int32_t rest = node_rest_[static_cast<size_t>(at)];
    const int32_t next = elems[static_cast<size_t>(e) + 1].end ? rest : node(e + 1, rest);
    for (int32_t start : g_->rules_[static_cast<size_t>(rule)].alt_start)
      work_.push_back(elems[static_cast<size_t>(start)].end ? next : node(start, next));
  }
}

int32_t GrammarMatcher::state_of_scratch() const {
  std::sort(scratch_.begin(), scratch_.end());
  const std::string key(reinterpret_cast<const char*>(scratch_.data()), scratch_.size() * sizeof(int32_t));
  const auto [it, added] = state_index_.try_emplace(key, static_cast<int32_t>(states_.size()));
  if (added) {
    states_.push_back(scratch_);
    trans_.resize(trans_.size() + 256, kUnknown);
  }
  return it->second;
}

int32_t GrammarMatcher::step(int32_t s, uint8_t byte) const {
  int32_t& t = trans_[static_cast<size_t>(s) * 256 + byte];
  if (t != kUnknown) return t;
  const auto& elems = g_->elems_;
  ++epoch_;
  scratch_.clear();
  scratch_complete_ = false;
  for (int32_t n : states_[static_cast<size_t>(s)]) {
    if (n == kEmpty) continue;
    const int32_t e = node_elem_[static_cast<size_t>(n)];
    if (!elems[static_cast<size_t>(e)].set.has(byte)) continue;
    const int32_t rest = node_rest_[static_cast<size_t>(n)];
    expand(elems[static_cast<size_t>(e) + 1].end ? rest : node(e + 1, rest));
  }
  // (state_of_scratch may grow trans_: the reference above is not used after it.)
  const int32_t next = scratch_.empty() ? kDead : state_of_scratch();
  trans_[static_cast<size_t>(s) * 256 + byte] = next;
  return next;
}

void GrammarMatcher::compact_if_large() const {
  if (node_elem_.size() <= kMaxNodes && states_.size() <= kMaxStates) return;
  // The current readings as element lists (top first), then everything else forgotten.
  std::vector<std::vector<int32_t>> stacks;
  for (int32_t n : states_[static_cast<size_t>(state_)]) {
    std::vector<int32_t> elems;
    for (int32_t at = n; at != kEmpty; at = node_rest_[static_cast<size_t>(at)])
      elems.push_back(node_elem_[static_cast<size_t>(at)]);
    stacks.push_back(std::move(elems));
  }
  node_elem_.clear(), node_rest_.clear(), node_index_.clear(), mark_.clear();
  states_.clear(), state_index_.clear(), trans_.clear();
  scratch_.clear();
  scratch_complete_ = false;
  for (const auto& elems : stacks) {
    int32_t n = kEmpty;
    for (size_t i = elems.size(); i-- > 0;) n = node(elems[i], n);
    scratch_.push_back(n);
  }
  state_ = state_of_scratch();
}

bool GrammarMatcher::allows(std::string_view bytes) const {
  if (bytes.empty()) return false;
  compact_if_large();
  int32_t s = state_;
  for (char c : bytes)
    if ((s = step(s, static_cast<uint8_t>(c))) == kDead) return false;
  return true;
}

void GrammarMatcher::accept(std::string_view bytes) {
  compact_if_large();
  int32_t s = state_;
  for (char c : bytes) {
    s = step(s, static_cast<uint8_t>(c));
    EMBER_CHECK(s != kDead, "grammar: the text does not fit the grammar at byte {}",
                static_cast<int>(static_cast<uint8_t>(c)));
  }
  state_ = s;
}

bool GrammarMatcher::complete() const {
  const auto& r = states_[static_cast<size_t>(state_)];
  return !r.empty() && r.front() == kEmpty;
}

bool GrammarMatcher::can_continue() const {
  const auto& r = states_[static_cast<size_t>(state_)];
  return !r.empty() && r.back() != kEmpty;
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
