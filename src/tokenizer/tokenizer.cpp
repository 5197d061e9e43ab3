#include "tokenizer/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <queue>

#include "core/error.hpp"
#include "gguf/reader.hpp"
#include "tokenizer/unicode.hpp"

namespace ember {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// A piece of the input: raw text still to tokenize, or a special token already recognized.
struct Fragment {
  int32_t token;  // kNoToken for raw text
  size_t offset, length;
};

// Symbols of the merge loops: a span of the word's bytes in a doubly linked list.
struct Symbol {
  int32_t id;  // BPE: token (or interned merge-only string) id; -1 when none
  int32_t prev, next;
  uint32_t offset, length;  // bytes in the word; length 0 once merged into its left neighbour
};

// Merges symbol `right` into its left neighbour `left` (it leaves the list), then queues the
// pairs the merged symbol now forms on either side.
template <class AddBigram>
void merge_symbols(std::vector<Symbol>& symbols, int32_t left, int32_t right, AddBigram&& add_bigram) {
  Symbol& l = symbols[left];
  Symbol& r = symbols[right];
  l.length += r.length;
  r.length = 0;
  l.next = r.next;
  if (r.next >= 0) symbols[r.next].prev = left;
  add_bigram(l.prev, left);
  add_bigram(left, l.next);
}

struct BpeBigram {
  int32_t rank;
  int32_t left, right;
  int32_t left_id, right_id;
  // Lowest rank first; among equal ranks the leftmost.
  bool operator>(const BpeBigram& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
};

struct SpmBigram {
  float score;
  int32_t left, right;
  uint32_t size;
  // Highest score first; among equal scores the leftmost.
  bool operator<(const SpmBigram& o) const { return score != o.score ? score < o.score : left > o.left; }
};

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

}  // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> token_to_id;
  std::vector<int32_t> special;  // control / user-defined / unknown tokens, longest text first
  std::vector<std::string> pieces;
  std::vector<uint8_t> eog;  // per token

  // BPE
  std::array<int32_t, 256> byte_token{};  // the token of each single byte (byte-level alphabet)
  std::vector<std::string> byte_level;    // each byte's byte-level text (UTF-8 of its code point)
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left id, right id) -> rank, merged id
  // Merges may name strings that are not tokens; they get ids from n_vocab upwards.
  std::unordered_map<std::string, int32_t> extra_ids;

  // SPM
  std::array<int32_t, 256> spm_byte_token{};  // <0xXX> (or the raw byte, or unk) for each byte

  int32_t text_id(const std::string& s) const {
    auto it = token_to_id.find(s);
    return it == token_to_id.end() ? kNoToken : it->second;
  }
};

Tokenizer::Tokenizer(const gguf::Reader& reader) : Tokenizer(Vocab::from_gguf(reader)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)), impl_(std::make_unique<Impl>()) {
  vocab_.finalize();
  Impl& m = *impl_;
  const int32_t n = vocab_.n_vocab();
  m.token_to_id.reserve(n);
  for (int32_t i = 0; i < n; ++i) m.token_to_id[vocab_.tokens[i]] = i;

  for (int32_t i = 0; i < n; ++i) {
    const TokenType t = vocab_.types[i];
    if ((t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) && !vocab_.tokens[i].empty())
      m.special.push_back(i);
  }
  std::stable_sort(m.special.begin(), m.special.end(),
                   [&](int32_t a, int32_t b) { return vocab_.tokens[a].size() > vocab_.tokens[b].size(); });

  m.eog.assign(n, 0);
  for (int32_t id : vocab_.eog) m.eog[id] = 1;

  if (vocab_.type == VocabType::Bpe) {
    m.byte_level.resize(256);
    for (int b = 0; b < 256; ++b) {
      unicode::append_utf8(m.byte_level[b], unicode::byte_to_cpt(static_cast<uint8_t>(b)));
      m.byte_token[b] = m.text_id(m.byte_level[b]);
    }
    auto id_of = [&](const std::string& s) {
      if (int32_t id = m.text_id(s); id != kNoToken) return id;
      auto [it, inserted] = m.extra_ids.emplace(s, n + static_cast<int32_t>(m.extra_ids.size()));
      return it->second;
    };
    m.merges.reserve(vocab_.merges.size());
    for (size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
      const auto& [a, b] = vocab_.merges[rank];
      const int32_t ia = id_of(a), ib = id_of(b), iab = id_of(a + b);
      m.merges.emplace(pair_key(ia, ib), Impl::Merge{static_cast<int32_t>(rank), iab});  // first rank wins
    }
  } else {
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const std::string name = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
      int32_t id = m.text_id(name);
      if (id == kNoToken) id = m.text_id(std::string(1, static_cast<char>(b)));
      if (id == kNoToken) id = vocab_.unk;
      m.spm_byte_token[b] = id;
    }
  }

  m.pieces.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    const std::string& text = vocab_.tokens[i];
    std::string& piece = m.pieces[i];
    switch (vocab_.types[i]) {
      case TokenType::Control:
      case TokenType::Unknown:
      case TokenType::UserDefined:
        piece = text;
        break;
      case TokenType::Normal:
        if (vocab_.type == VocabType::Bpe) {
          size_t pos = 0;
          while (pos < text.size()) {
            const uint32_t c = unicode::decode_one(text, pos);
            const int b = unicode::cpt_to_byte(c);
            if (b >= 0) piece += static_cast<char>(b);
            else unicode::append_utf8(piece, c);  // not in the byte alphabet: keep the character
          }
        } else {
          for (size_t pos = 0; pos < text.size();) {
            if (text.compare(pos, kSpmSpace.size(), kSpmSpace) == 0) {
              piece += ' ';
              pos += kSpmSpace.size();
            } else {
              piece += text[pos++];
            }
          }
        }
        break;
      case TokenType::Byte:
        if (vocab_.type == VocabType::Spm && text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
          piece = static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16));
        }
        break;
      default:  // unused, undefined: no text, as in llama.cpp
        break;
    }
  }
}

int32_t Tokenizer::find_token(std::string_view text) const { return impl_->text_id(std::string(text)); }

bool Tokenizer::is_eog(int32_t id) const { return id >= 0 && id < n_vocab() && impl_->eog[id]; }

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < n_vocab() && vocab_.types[id] == TokenType::Control;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  if (id < 0 || id >= n_vocab()) return {};
  const TokenType t = vocab_.types[id];
  if (!special && (t == TokenType::Control || t == TokenType::Unknown)) return {};
  return impl_->pieces[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string out;
  // SPM: drop the space the encoder put in front of the text (llama.cpp's detokenize does the
  // same for the first token) so that decode(encode(x)) == x.
  bool strip_space = vocab_.type == VocabType::Spm && vocab_.add_space_prefix;
  for (int32_t id : ids) {
    std::string piece = token_to_piece(id, special);
    if (strip_space && (id == vocab_.bos || is_control(id))) {
      out += piece;
      continue;
    }
    if (strip_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    strip_space = false;
    out += piece;
  }
  return out;
}

namespace {

// Splits `text` around special tokens, longest token text first, as llama.cpp does. Control
// and unknown tokens are recognized only with parse_special; user-defined ones always.
std::vector<Fragment> partition(std::string_view text, const Vocab& vocab, const std::vector<int32_t>& special,
                                bool parse_special) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({kNoToken, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t id : special) {
    const TokenType t = vocab.types[id];
    if (!parse_special && (t == TokenType::Control || t == TokenType::Unknown)) continue;
    const std::string& tok = vocab.tokens[id];
    // Quick reject: is the token text anywhere in the input at all?
    if (text.find(tok) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.offset, f.length);
      size_t start = 0;
      while (true) {
        const size_t hit = raw.find(tok, start);
        if (hit == std::string_view::npos) break;
        if (hit > start) next.push_back({kNoToken, f.offset + start, hit - start});
        next.push_back({id, 0, 0});
        start = hit + tok.size();
      }
      if (start < raw.size()) next.push_back({kNoToken, f.offset + start, raw.size() - start});
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace

std::string Tokenizer::mark_as_text(std::string_view text) const {
  const Impl& m = *impl_;
  std::string out(text);
  for (int32_t id : m.special) {
    const TokenType t = vocab_.types[id];
    const std::string& tok = vocab_.tokens[id];
    if ((t != TokenType::Control && t != TokenType::Unknown) || tok.size() < 2) continue;
    for (size_t at = out.find(tok); at != std::string::npos; at = out.find(tok, at + tok.size() + kTextMark.size()))
      out.insert(at + 1, kTextMark);
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  std::vector<Fragment> frags = partition(text, vocab_, m.special, parse_special);
  // Plain text without the marks of mark_as_text (after the control tokens were found: a marked
  // one is not), fragments pointing into the copy.
  std::string unmarked;
  if (parse_special && text.find(kTextMark) != std::string_view::npos) {
    for (Fragment& f : frags) {
      if (f.token != kNoToken) continue;
      const std::string_view raw = text.substr(f.offset, f.length);
      f.offset = unmarked.size();
      for (size_t at = 0; at < raw.size();) {
        const size_t mark = std::min(raw.find(kTextMark, at), raw.size());
        unmarked.append(raw.substr(at, mark - at));
        at = mark + kTextMark.size();
      }
      f.length = unmarked.size() - f.offset;
    }
    std::erase_if(frags, [](const Fragment& f) { return f.token == kNoToken && f.length == 0; });
    text = unmarked;
  }
  if (add_special && vocab_.add_bos) out.push_back(vocab_.bos);

  if (vocab_.type == VocabType::Bpe) {
    std::vector<Symbol> symbols;
    std::vector<BpeBigram> heap;
    std::string word, key;
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        continue;
      }
      const std::vector<uint32_t> cpts = unicode::decode(text.substr(f.offset, f.length));
      const std::vector<size_t> words = pre_tokenize(vocab_.pre_tokenizer, cpts);
      size_t cpt_pos = 0;
      for (size_t word_len : words) {
        // The word's bytes (invalid input was read as U+FFFD and is re-encoded as such).
        word.clear();
        for (size_t i = 0; i < word_len; ++i) unicode::append_utf8(word, cpts[cpt_pos + i]);
        cpt_pos += word_len;

        if (vocab_.ignore_merges) {
          key.clear();
          for (unsigned char b : word) key += m.byte_level[b];
          if (int32_t id = m.text_id(key); id != kNoToken) {
            out.push_back(id);
            continue;
          }
        }

        symbols.clear();
        const int32_t n_sym = static_cast<int32_t>(word.size());
        for (int32_t i = 0; i < n_sym; ++i) {
          symbols.push_back({m.byte_token[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n_sym ? i + 1 : -1,
                             static_cast<uint32_t>(i), 1});
        }
        // A min-heap in a vector that keeps its capacity from word to word.
        heap.clear();
        const std::greater<> cmp;
        auto add_bigram = [&](int32_t left, int32_t right) {
          if (left < 0 || right < 0) return;
          const int32_t a = symbols[left].id, b = symbols[right].id;
          if (a < 0 || b < 0) return;
          auto it = m.merges.find(pair_key(a, b));
          if (it == m.merges.end()) return;
          heap.push_back({it->second.rank, left, right, a, b});
          std::push_heap(heap.begin(), heap.end(), cmp);
        };
        for (int32_t i = 1; i < n_sym; ++i) add_bigram(i - 1, i);
        while (!heap.empty()) {
          std::pop_heap(heap.begin(), heap.end(), cmp);
          const BpeBigram bg = heap.back();
          heap.pop_back();
          Symbol& l = symbols[bg.left];
          Symbol& r = symbols[bg.right];
          // Stale entries: one side was merged away or grew since the pair was queued.
          if (l.length == 0 || r.length == 0 || l.id != bg.left_id || r.id != bg.right_id) continue;
          l.id = m.merges.at(pair_key(bg.left_id, bg.right_id)).result;
          merge_symbols(symbols, bg.left, bg.right, add_bigram);
        }
        for (int32_t i = 0; i >= 0 && n_sym > 0; i = symbols[i].next) {
          const Symbol& s = symbols[i];
          if (s.id >= 0 && s.id < n_vocab()) {
            out.push_back(s.id);
            continue;
          }
          // Not a token: emit the tokens of the single bytes of its byte-level text, skipping
          // those that are none (llama.cpp's fallback).
          key.clear();
          for (uint32_t j = 0; j < s.length; ++j) key += m.byte_level[static_cast<unsigned char>(word[s.offset + j])];
          for (char c : key)
            if (int32_t id = m.text_id(std::string(1, c)); id != kNoToken) out.push_back(id);
        }
      }
    }
  } else {
    bool prev_special = true;  // the text's start counts as following a special token
    std::vector<Symbol> symbols;
    std::string escaped, key;
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      escaped.clear();
      if (vocab_.add_space_prefix && prev_special) escaped += kSpmSpace;
      for (char c : text.substr(f.offset, f.length)) {
        if (c == ' ') escaped += kSpmSpace;
        else escaped += c;
      }
      prev_special = false;

      symbols.clear();
      for (size_t off = 0; off < escaped.size();) {
        const size_t len = std::min(unicode::utf8_len(static_cast<uint8_t>(escaped[off])), escaped.size() - off);
        const int32_t idx = static_cast<int32_t>(symbols.size());
        const int32_t next = off + len < escaped.size() ? idx + 1 : -1;
        symbols.push_back({kNoToken, idx - 1, next, static_cast<uint32_t>(off), static_cast<uint32_t>(len)});
        off += len;
      }
      std::priority_queue<SpmBigram> queue;
      auto add_bigram = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        key.assign(escaped, symbols[left].offset, symbols[left].length + symbols[right].length);
        const int32_t id = m.text_id(key);
        if (id == kNoToken) return;
        queue.push({vocab_.scores[id], left, right, static_cast<uint32_t>(key.size())});
      };
      for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) add_bigram(i - 1, i);
      while (!queue.empty()) {
        const SpmBigram bg = queue.top();
        queue.pop();
        Symbol& l = symbols[bg.left];
        Symbol& r = symbols[bg.right];
        if (l.length == 0 || r.length == 0 || l.length + r.length != bg.size) continue;
        merge_symbols(symbols, bg.left, bg.right, add_bigram);
      }
      for (int32_t i = 0; i >= 0 && !symbols.empty(); i = symbols[i].next) {
        const Symbol& s = symbols[i];
        key.assign(escaped, s.offset, s.length);
        if (int32_t id = m.text_id(key); id != kNoToken) {
          out.push_back(id);
          continue;
        }
        // Byte fallback: <0xXX> tokens for each byte.
        for (uint32_t j = 0; j < s.length; ++j) {
          const int32_t id = m.spm_byte_token[static_cast<unsigned char>(escaped[s.offset + j])];
          if (id != kNoToken) out.push_back(id);
        }
      }
    }
  }

  if (add_special && vocab_.add_eos) out.push_back(vocab_.eos);
  return out;
}

// --- Utf8Streamer ---

namespace {

// Copies `s`, replacing bytes that do not start a well-formed sequence with U+FFFD.
void append_sanitized(std::string& out, std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const uint32_t c = unicode::decode_one(s, pos);
    const bool bad = (c == unicode::kReplacement && pos - start == 1) || (c >= 0xD800 && c <= 0xDFFF) ||
                     c > 0x10FFFF || (pos - start == 2 && c < 0x80) || (pos - start == 3 && c < 0x800) ||
                     (pos - start == 4 && c < 0x10000);
    if (bad) unicode::append_utf8(out, unicode::kReplacement);
    else out.append(s.substr(start, pos - start));
  }
}

}  // namespace

std::string Utf8Streamer::push(std::string_view bytes) {
  pending_.append(bytes);
  const size_t keep = unicode::incomplete_utf8_tail(pending_);
  std::string out;
  append_sanitized(out, std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string Utf8Streamer::flush() {
  std::string out;
  append_sanitized(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace ember
