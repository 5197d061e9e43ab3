// Unicode helpers for the tokenizers: lenient UTF-8 decoding, encoding, and per-code-point
// category flags from a generated table (scripts/gen_unicode_tables.py -> unicode_tables.cpp).
#pragma once
#include "core/utf8.hpp"
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ember::unicode {

// Category flags. Exactly one of the category bits is set for every code point below 0x110000;
// kWhitespace is added on top for \s (the Unicode White_Space property).
enum CptFlags : uint16_t {
  kUndefined = 1 << 0,    // unassigned (Cn)
  kNumber = 1 << 1,       // \p{N}
  kLetter = 1 << 2,       // \p{L}
  kSeparator = 1 << 3,    // \p{Z}
  kMark = 1 << 4,         // \p{M}
  kPunctuation = 1 << 5,  // \p{P}
  kSymbol = 1 << 6,       // \p{S}
  kControl = 1 << 7,      // \p{C} other than Cn
  kWhitespace = 1 << 8,   // \s
};

struct CptRun {
  uint32_t first;  // first code point of the run; it lasts until the next run's first
  uint16_t flags;
};
extern const CptRun kCptRuns[];
extern const size_t kCptRunCount;
extern const char* const kUnicodeVersion;

constexpr uint32_t kReplacement = 0xFFFD;

// Flags of a code point; kUndefined for values past U+10FFFF.
uint16_t flags(uint32_t cpt);
inline bool is_letter(uint32_t cpt) { return flags(cpt) & kLetter; }
inline bool is_number(uint32_t cpt) { return flags(cpt) & kNumber; }
inline bool is_whitespace(uint32_t cpt) { return flags(cpt) & kWhitespace; }

// Length of the UTF-8 sequence that starts with `lead`, judged from its high bits alone
// (1 for continuation bytes, as llama.cpp does).
inline size_t utf8_len(uint8_t lead) {
  static constexpr uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[lead >> 4];
}

// Decodes one code point at `pos` and advances it. Malformed input (a stray continuation byte,
// a truncated sequence) yields U+FFFD and consumes one byte, so decoding never fails.
uint32_t decode_one(std::string_view s, size_t& pos);
std::vector<uint32_t> decode(std::string_view s);

using ember::append_utf8;  // (core/utf8.hpp)
std::string encode(const std::vector<uint32_t>& cpts);

// Whether `s` is well-formed UTF-8 (no stray or missing continuation bytes, overlong forms,
// surrogates or values past U+10FFFF).
bool valid_utf8(std::string_view s);

// Number of bytes at the end of `s` that form an incomplete (but so far valid) UTF-8 sequence.
size_t incomplete_utf8_tail(std::string_view s);

// GPT-2 byte-level alphabet: every byte maps to one printable code point and back.
uint32_t byte_to_cpt(uint8_t byte);
// The byte a code point stands for; -1 when it is not part of the alphabet.
int cpt_to_byte(uint32_t cpt);

}  // namespace ember::unicode
