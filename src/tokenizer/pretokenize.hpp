// Pre-tokenizers for byte-level BPE: split text into words before merging, by the rules that
// tokenizer.ggml.pre names. Each rule is the hand-written equivalent of a regular expression
// (the regexes are quoted in pretokenize.cpp), with the same semantics as llama.cpp's splitters.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace ember {

enum class PreTokenizer {
  Default,  // llama.cpp's fallback: punctuation runs, GPT-2 regex, number runs, digit triples
  Gpt2,     // GPT-2 regex
  Smollm,   // every \p{N} alone, then the GPT-2 regex (SmolLM, StarCoder, Refact, Command-R)
  Llama3,   // Llama-3 regex (numbers in groups of up to 3)
  Qwen2,    // Llama-3 regex with single-digit numbers
  Falcon,   // Default's rules with '`' among the punctuation and no \p{N}+ step (Falcon-7B/40B)
};

// Maps a tokenizer.ggml.pre name to its rules; nullopt when unknown.
std::optional<PreTokenizer> pre_tokenizer_from_name(std::string_view name);
// The names pre_tokenizer_from_name accepts, comma-separated (for error messages).
const char* supported_pre_tokenizers();

// Splits `cpts` into words; returns each word's length in code points (the lengths sum to
// cpts.size(), no word is empty).
std::vector<size_t> pre_tokenize(PreTokenizer pre, const std::vector<uint32_t>& cpts);

}  // namespace ember
