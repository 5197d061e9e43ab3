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
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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
  void add_alternative(int rule, const Sequence& seq);
  // A rule of one alternative: the bytes of `text` in order.
  int add_literal(std::string_view text);
  // Appends the bytes of `text` to a sequence.
  static void append_literal(Sequence& seq, std::string_view text);
  int n_rules() const { return static_cast<int>(rules_.size()); }
  const std::string& rule_name(int r) const { return rules_[static_cast<size_t>(r)].name; }

  // The name of a rule that can reach itself before consuming a byte (left recursion, which the
  // matcher cannot expand), or empty. Through references to rules that may match nothing too.
  std::string left_recursive_rule() const;
  // Fixes the root and flattens the rules for the matcher. Throws ember::Error for a rule
  // without alternatives, a reference to no rule, or a left-recursive rule.
  void finish(int root);
  int root() const { return root_; }

 private:
  friend class GrammarMatcher;
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
  int root_ = -1;
};

// Where a generation stands in a grammar. Copyable; not safe to use from two threads at once
// (allows() fills a cache).
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

 private:
  using Stack = std::vector<int32_t>;  // indices into Grammar::elems_, the next to match last
  // Pushes `s` into `out` with every rule reference on top expanded into its alternatives.
  void expand(Stack s, std::vector<Stack>& out, int depth) const;
  bool advance(const std::vector<Stack>& in, uint8_t byte, std::vector<Stack>& out) const;

  // The bytes some reading of `stacks` can take next: the union of their tops.
  ByteSet next_bytes(const std::vector<Stack>& stacks) const;
  // Refreshes first_ (most tokens are refused on their first byte without touching the stacks)
  // and forgets second_.
  void update_first();

  std::shared_ptr<const Grammar> g_;
  std::vector<Stack> stacks_;
  ByteSet first_;
  // For each first byte b (computed when a token starting with b is first asked about): the
  // bytes that may follow it, so most of the rest are refused on their second byte.
  mutable ByteSet second_known_;
  mutable std::array<ByteSet, 256> second_;
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
