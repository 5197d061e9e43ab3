#include "tokenizer/pretokenize.hpp"

#include <functional>

#include "tokenizer/unicode.hpp"

namespace ember {

namespace {

using unicode::kLetter;
using unicode::kNumber;
using unicode::kPunctuation;
using unicode::kWhitespace;

// Each splitter refines a list of pieces (lengths in code points) into smaller pieces; a regex
// never matches across the boundary of a piece produced by an earlier one.
using Pieces = std::vector<size_t>;

struct Span {
  const std::vector<uint32_t>& cpts;
  size_t begin, end;
  // Code point / flags at `pos`, or "nothing" (0xFFFFFFFF / 0) outside the piece.
  static constexpr uint32_t kNone = 0xFFFFFFFF;
  uint32_t cpt(size_t pos) const { return pos >= begin && pos < end ? cpts[pos] : kNone; }
  uint16_t flags(size_t pos) const { return pos >= begin && pos < end ? unicode::flags(cpts[pos]) : 0; }
};

// Cuts a piece into consecutive pieces: each cut ends the piece begun at the previous one.
struct Cutter {
  Pieces& out;
  size_t prev_end;
  size_t operator()(size_t end) {  // the new piece's length (0 cuts nothing)
    const size_t len = end - prev_end;
    if (len > 0) out.push_back(len);
    prev_end = end;
    return len;
  }
};

// 's|'t|'re|'ve|'m|'ll|'d at `pos` (ASCII case folded when `fold_case`): the match's length, or 0.
size_t contraction_len(const Span& s, size_t pos, bool fold_case) {
  auto at = [&](size_t i) {
    const uint32_t c = s.cpt(i);
    return fold_case && c >= 'A' && c <= 'Z' ? c + 32 : c;
  };
  if (s.cpt(pos) != '\'') return 0;
  const uint32_t n1 = at(pos + 1), n2 = at(pos + 2);
  if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') return 2;
  if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) return 3;
  return 0;
}

// \s+(?!\S)|\s+ over the `n_ws` white spaces at `pos`, else the code point alone: where the
// match ends. A run followed by more text leaves its last space to the next word.
size_t spaces_end(const Span& s, size_t pos, size_t n_ws) {
  if (n_ws > 1 && s.cpt(pos + n_ws) != Span::kNone) return pos + n_ws - 1;
  return pos + (n_ws > 0 ? n_ws : 1);
}

template <class F>
Pieces for_each_piece(const std::vector<uint32_t>& cpts, const Pieces& in, F&& split) {
  Pieces out;
  out.reserve(in.size() * 2);
  size_t start = 0;
  for (size_t len : in) {
    split(Span{cpts, start, start + len}, out);
    start += len;
  }
  return out;
}

// Regex `X` or `X+` where X is a single-code-point class: matched code points (or runs) become
// pieces and so do the gaps between them.
Pieces split_class(const std::vector<uint32_t>& cpts, const Pieces& in, const std::function<bool(uint32_t)>& is_x,
                   bool runs) {
  return for_each_piece(cpts, in, [&](const Span& s, Pieces& out) {
    size_t gap_start = s.begin;
    size_t pos = s.begin;
    while (pos < s.end) {
      if (!is_x(s.cpts[pos])) {
        ++pos;
        continue;
      }
      if (pos > gap_start) out.push_back(pos - gap_start);
      size_t match_end = pos + 1;
      if (runs)
        while (match_end < s.end && is_x(s.cpts[match_end])) ++match_end;
      out.push_back(match_end - pos);
      pos = gap_start = match_end;
    }
    if (s.end > gap_start) out.push_back(s.end - gap_start);
  });
}

// Regex [0-9][0-9][0-9]: leftmost non-overlapping triples of ASCII digits.
Pieces split_ascii_digit_triples(const std::vector<uint32_t>& cpts, const Pieces& in) {
  auto digit = [](uint32_t c) { return c >= '0' && c <= '9'; };
  return for_each_piece(cpts, in, [&](const Span& s, Pieces& out) {
    size_t gap_start = s.begin;
    size_t pos = s.begin;
    while (pos < s.end) {
      if (pos + 3 <= s.end && digit(s.cpts[pos]) && digit(s.cpts[pos + 1]) && digit(s.cpts[pos + 2])) {
        if (pos > gap_start) out.push_back(pos - gap_start);
        out.push_back(3);
        pos = gap_start = pos + 3;
      } else {
        ++pos;
      }
    }
    if (s.end > gap_start) out.push_back(s.end - gap_start);
  });
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
Pieces split_gpt2(const std::vector<uint32_t>& cpts, const Pieces& in) {
  return for_each_piece(cpts, in, [&](const Span& s, Pieces& out) {
    Cutter cut{out, s.begin};
    for (size_t pos = s.begin; pos < s.end;) {
      const uint32_t c = s.cpt(pos);
      const uint16_t f = s.flags(pos);

      if (const size_t n = contraction_len(s, pos, false)) {  // 's|'t|'re|'ve|'m|'ll|'d
        pos += cut(pos + n);
        continue;
      }

      uint16_t f2 = c == ' ' ? s.flags(pos + 1) : f;
      // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+"
      auto run = [&](auto&& in_class) {
        pos += (c == ' ');
        while (in_class(f2)) f2 = s.flags(++pos);
        cut(pos);
      };
      if (f2 & kLetter) {
        run([](uint16_t x) { return (x & kLetter) != 0; });
        continue;
      }
      if (f2 & kNumber) {
        run([](uint16_t x) { return (x & kNumber) != 0; });
        continue;
      }
      auto other = [](uint16_t x) { return x != 0 && !(x & (kWhitespace | kLetter | kNumber)); };
      if (other(f2)) {
        run(other);
        continue;
      }

      size_t n_ws = 0;
      while (s.flags(pos + n_ws) & kWhitespace) ++n_ws;
      pos = spaces_end(s, pos, n_ws);
      cut(pos);
    }
  });
}

// Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Qwen2 is the same with \p{N} instead of \p{N}{1,3} (max_digits = 1).
Pieces split_llama3(const std::vector<uint32_t>& cpts, const Pieces& in, size_t max_digits) {
  return for_each_piece(cpts, in, [&](const Span& s, Pieces& out) {
    Cutter cut{out, s.begin};
    for (size_t pos = s.begin; pos < s.end;) {
      const uint32_t c = s.cpt(pos);
      const uint16_t f = s.flags(pos);

      if (const size_t n = contraction_len(s, pos, true)) {  // case-insensitive contractions
        pos += cut(pos + n);
        continue;
      }

      // [^\r\n\p{L}\p{N}]?\p{L}+
      if (!(c == '\r' || c == '\n' || (f & kNumber))) {
        if ((f & kLetter) || (s.flags(pos + 1) & kLetter)) {
          ++pos;
          while (s.flags(pos) & kLetter) ++pos;
          cut(pos);
          continue;
        }
      }

      // \p{N}{1,3}
      if (f & kNumber) {
        size_t group_start = pos;
        while (s.flags(pos) & kNumber) {
          if (++pos - group_start >= max_digits) {
            cut(pos);
            group_start = pos;
          }
        }
        cut(pos);
        continue;
      }

      // " ?[^\s\p{L}\p{N}]+[\r\n]*"
      uint16_t f2 = c == ' ' ? s.flags(pos + 1) : f;
      if (!(f2 & (kWhitespace | kLetter | kNumber)) && f != 0) {
        pos += (c == ' ');
        while (!(f2 & (kWhitespace | kLetter | kNumber)) && f2 != 0) f2 = s.flags(++pos);
        uint32_t c2 = s.cpt(pos);
        while (c2 == '\r' || c2 == '\n') c2 = s.cpt(++pos);
        cut(pos);
        continue;
      }

      size_t n_ws = 0;
      size_t last_newline_end = 0;
      while (s.flags(pos + n_ws) & kWhitespace) {
        const uint32_t c2 = s.cpt(pos + n_ws);
        if (c2 == '\r' || c2 == '\n') last_newline_end = pos + n_ws + 1;
        ++n_ws;
      }
      if (last_newline_end > 0) {  // \s*[\r\n]+
        pos = last_newline_end;
        cut(pos);
        continue;
      }
      pos = spaces_end(s, pos, n_ws);
      cut(pos);
    }
  });
}

}  // namespace

std::optional<PreTokenizer> pre_tokenizer_from_name(std::string_view name) {
  auto is = [&](std::initializer_list<std::string_view> names) {
    for (auto n : names)
      if (name == n) return true;
    return false;
  };
  if (name.empty() || name == "default") return PreTokenizer::Default;
  if (is({"gpt2", "gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais", "jina-es", "jina-de", "gigachat",
          "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code"}))
    return PreTokenizer::Gpt2;
  if (is({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}))
    return PreTokenizer::Smollm;
  if (is({"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "chatglm-bpe"}))
    return PreTokenizer::Llama3;
  if (is({"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"})) return PreTokenizer::Qwen2;
  if (name == "falcon") return PreTokenizer::Falcon;
  return std::nullopt;
}

const char* supported_pre_tokenizers() {
  return "default, gpt2 (gpt-2, phi-2, roberta-bpe, mpt, olmo, jais, jina-*), smollm (starcoder, refact, "
         "command-r, codeshell, exaone, minerva-7b), llama3 (llama-v3, llama-bpe, falcon3, dbrx, smaug-bpe, "
         "chatglm-bpe), qwen2 (deepseek-r1-qwen, stablelm2, megrez), falcon";
}

std::vector<size_t> pre_tokenize(PreTokenizer pre, const std::vector<uint32_t>& cpts) {
  if (cpts.empty()) return {};
  Pieces pieces{cpts.size()};
  switch (pre) {
    case PreTokenizer::Gpt2:
      return split_gpt2(cpts, pieces);
    case PreTokenizer::Smollm:
      pieces = split_class(cpts, pieces, [](uint32_t c) { return unicode::is_number(c); }, /*runs=*/false);
      return split_gpt2(cpts, pieces);
    case PreTokenizer::Llama3:
      return split_llama3(cpts, pieces, 3);
    case PreTokenizer::Qwen2:
      return split_llama3(cpts, pieces, 1);
    case PreTokenizer::Default:
    case PreTokenizer::Falcon: {
      // Default: [\p{P}\$\+<=>\^~\|]+ , GPT-2, \p{N}+ , [0-9][0-9][0-9]
      // Falcon:  [\p{P}\$\+<=>\^~\|`]+ , GPT-2, [0-9][0-9][0-9]
      const bool falcon = pre == PreTokenizer::Falcon;
      pieces = split_class(
          cpts, pieces,
          [falcon](uint32_t c) {
            if (c < 128 && (c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '~' || c == '|' ||
                            (falcon && c == '`')))
              return true;
            return (unicode::flags(c) & kPunctuation) != 0;
          },
          /*runs=*/true);
      pieces = split_gpt2(cpts, pieces);
      if (!falcon) pieces = split_class(cpts, pieces, [](uint32_t c) { return unicode::is_number(c); }, /*runs=*/true);
      return split_ascii_digit_triples(cpts, pieces);
    }
  }
  return pieces;
}

}  // namespace ember
