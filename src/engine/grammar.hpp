// Constrained generation: a context-free grammar over bytes and a matcher that says which tokens
// may come next, so that sampling only ever picks text the grammar can still complete (the
// server's structured output compiles a JSON schema into one, server/json_schema.hpp).
//
// A grammar is a set of rules; a rule is a list of alternatives; an alternative is a sequence
// of symbols, each a byte set (one byte out of a set of 256) or a reference to a rule. Rules
// must not be left-recursive (a rule may not reach itself before consuming a byte): the matcher
// expands references eagerly. The matcher keeps every way the text so far can be read as a set
// of stacks (llama.cpp's grammar sampler keeps the same), each the symbols still to match with
// the next on top; the text is complete when a stack is empty.
//
// Bounds, so that no grammar (a client's schema) can take unbounded memory or time: at most
// kMaxGrammarSymbols symbols in all (checked as they are added), at most kMaxReadings readings
// of the text at once, at most kMaxExpansionSteps rule expansions per byte. Past one, a
// GrammarError names it. Stacks are shared (a stack is a node over its rest) and sets of
// readings are numbered with their transitions cached, so the matcher becomes a lazily built
// automaton: a byte it has seen from a state costs one table lookup.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"

namespace ember {

class Tokenizer;

// 256 bits: which bytes a symbol matches.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1u; }
  ByteSet& add(uint8_t b) {
    bits[b >> 6] |= uint64_t{1} << (b & 63);
    return *this;
  }
  ByteSet& add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
    return *this;
  }
  ByteSet& operator|=(const ByteSet& o) {
    for (size_t w = 0; w < bits.size(); ++w) bits[w] |= o.bits[w];
    return *this;
  }
  static ByteSet of(std::string_view bytes) {
    ByteSet s;
    for (char c : bytes) s.add(static_cast<uint8_t>(c));
    return s;
  }
  static ByteSet range(uint8_t lo, uint8_t hi) { return ByteSet().add_range(lo, hi); }
};

// A grammar that breaks a bound (too large, too ambiguous) or cannot be matched (left recursion,
// a rule without alternatives): the client's schema is at fault, not the server.
class GrammarError : public Error {
 public:
  using Error::Error;
};

constexpr size_t kMaxGrammarSymbols = size_t{1} << 18;  // rules and the symbols of their alternatives
constexpr size_t kMaxReadings = 4096;                   // readings of the text at once
constexpr size_t kMaxExpansionSteps = size_t{1} << 18;  // rule expansions after one byte

class Grammar {
 public:
  struct Symbol {
    int rule = -1;  // >= 0: a reference to this rule; else the byte set
    ByteSet set;
    static Symbol bytes(const ByteSet& s) { return {-1, s}; }
    static Symbol ref(int r) { return {r, {}}; }
  };
  using Sequence = std::vector<Symbol>;

  // A new rule without alternatives (add them with add_alternative, before finish()); `name`
  // appears in errors.
  int add_rule(std::string name);
  // Throws GrammarError past kMaxGrammarSymbols.
  void add_alternative(int rule, const Sequence& seq);
  // A rule of one alternative: the bytes of `text` in order.
  int add_literal(std::string_view text);
  // A rule matching exactly one of `texts` (nonempty), their common prefixes shared, so that
  // thousands of them (a long enum) keep one reading of the text, not one each.
  int add_choice(const std::string& name, std::vector<std::string> texts);
  // Appends the bytes of `text` to a sequence.
  static void append_literal(Sequence& seq, std::string_view text);
  int n_rules() const { return static_cast<int>(rules_.size()); }
  size_t n_symbols() const { return n_symbols_; }
  const std::string& rule_name(int r) const { return rules_[static_cast<size_t>(r)].name; }

  // The name of a rule that can reach itself before consuming a byte (left recursion, which the
  // matcher cannot expand), or empty. Through references to rules that may match nothing too.
  // Linear in the grammar's size.
  std::string left_recursive_rule() const;
  // Fixes the root and flattens the rules for the matcher. Throws GrammarError for a rule
  // without alternatives, a reference to no rule, or a left-recursive rule.
  void finish(int root);
  int root() const { return root_; }

 private:
  friend class GrammarMatcher;
  [[noreturn]] static void too_large();
  struct Rule {
    std::string name;
    std::vector<Sequence> alts;
    std::vector<int32_t> alt_start;  // after finish(): where each alternative starts in elems_
  };
  // Flattened alternatives: each a run of elements ended by an element with end = true.
  struct Elem {
    int32_t rule = -1;
    bool end = false;
    ByteSet set;
  };
  std::vector<Rule> rules_;
  std::vector<Elem> elems_;
  size_t n_symbols_ = 0;
  int root_ = -1;
};

// Where a generation stands in a grammar. Copyable (a copy carries its own caches); not safe to
// use from two threads at once (allows() fills the caches). Every call throws GrammarError when
// the grammar breaks a bound at the text it is asked about.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> g);
  // Whether `bytes` can follow the text so far (some reading of it stays possible).
  bool allows(std::string_view bytes) const;
  // Takes `bytes` as the next text; throws ember::Error when the grammar does not allow them.
  void accept(std::string_view bytes);
  // Whether the text so far is a complete sentence of the grammar.
  bool complete() const;
  // Whether some byte may still follow (false: the text is complete and nothing may extend it).
  bool can_continue() const;
  // States of the automaton built so far (sets of readings met), for tests of its caching.
  size_t n_states() const { return states_.size(); }

 private:
  static constexpr int32_t kEmpty = -1;    // the empty stack (a complete reading)
  static constexpr int32_t kDead = -1;     // a transition to no reading
  static constexpr int32_t kUnknown = -2;  // a transition not computed yet
  // The caches' bounds: past them the automaton is rebuilt from the current readings.
  static constexpr size_t kMaxNodes = size_t{1} << 20;
  static constexpr size_t kMaxStates = 8192;

  // A stack: its top element over the rest (another node, or kEmpty). Equal stacks are one node.
  int32_t node(int32_t elem, int32_t rest) const;
  // Adds to scratch_ every stack `n` becomes with the rule references on top expanded.
  void expand(int32_t n) const;
  // The number of the set of readings in scratch_ (sorted here), made if new.
  int32_t state_of_scratch() const;
  // The state after `byte` from state `s`, or kDead.
  int32_t step(int32_t s, uint8_t byte) const;
  // Rebuilds the caches around the current readings when they grew past their bounds.
  void compact_if_large() const;

  std::shared_ptr<const Grammar> g_;
  // The automaton: stack nodes, sets of readings (states) and their transitions, 256 a state.
  mutable std::vector<int32_t> node_elem_, node_rest_;
  mutable std::unordered_map<uint64_t, int32_t> node_index_;
  mutable std::vector<std::vector<int32_t>> states_;  // sorted stacks (kEmpty first)
  mutable std::unordered_map<std::string, int32_t> state_index_;
  mutable std::vector<int32_t> trans_;
  // Scratch of one expansion: marks by node (the epoch), the work list, the readings made.
  mutable std::vector<uint32_t> mark_;
  mutable uint32_t epoch_ = 0;
  mutable std::vector<int32_t> work_, scratch_;
  mutable bool scratch_complete_ = false;  // scratch_ holds kEmpty
  mutable int32_t state_ = 0;
};

// The token-level view a sampler needs: which tokens a matcher allows next, given each token's
// bytes (computed once per tokenizer). End-of-generation tokens are allowed exactly when the
// text is complete; tokens without text (control tokens) never.
class TokenGrammar {
 public:
  explicit TokenGrammar(const Tokenizer& tok);
  bool allows(const GrammarMatcher& m, int32_t token) const;
  void accept(GrammarMatcher& m, int32_t token) const;
  int64_t n_vocab() const { return static_cast<int64_t>(pieces_.size()); }

 private:
  const Tokenizer& tok_;
  std::vector<std::string> pieces_;
};

}  // namespace ember
