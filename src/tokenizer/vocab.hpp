// A tokenizer vocabulary as stored in GGUF metadata (tokenizer.ggml.*): token texts, types,
// scores, BPE merges, special token ids and the flags that say how to add them.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/pretokenize.hpp"

namespace ember {

namespace gguf {
class Reader;
}

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

enum class VocabType {
  Bpe,  // tokenizer.ggml.model "gpt2": byte-level BPE with merges
  Spm,  // tokenizer.ggml.model "llama": SentencePiece-style, score-based merging, <0xXX> bytes
};

constexpr int32_t kNoToken = -1;

struct Vocab {
  VocabType type = VocabType::Bpe;
  std::string model;  // tokenizer.ggml.model as written
  std::string pre;    // tokenizer.ggml.pre as written (may be empty)
  PreTokenizer pre_tokenizer = PreTokenizer::Default;

  std::vector<std::string> tokens;
  std::vector<TokenType> types;  // same size as tokens
  std::vector<float> scores;     // same size as tokens
  std::vector<std::pair<std::string, std::string>> merges;  // BPE only, in rank order

  int32_t bos = kNoToken, eos = kNoToken, unk = kNoToken, pad = kNoToken;
  int32_t eot = kNoToken, eom = kNoToken;  // end of turn / end of message, from keys or token texts
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SPM: prefix the text with a space (before escaping to U+2581)
  bool ignore_merges = false;     // BPE (llama3): a word that is a whole token is not merged

  // End-of-generation ids, filled by finalize(): EOS, EOT, EOM, FIM pad/repo/sep, and every
  // token whose text llama.cpp treats as end of generation. Sorted, unique.
  std::vector<int32_t> eog;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens.size()); }

  // Reads tokenizer.ggml.* from a GGUF file. Throws ember::Error on missing or inconsistent
  // data (no token list, arrays of different lengths, special ids out of range, bad merges,
  // an unknown model or pre-tokenizer).
  static Vocab from_gguf(const gguf::Reader& reader);

  // Finds EOT/EOM tokens by their text when not given and checks consistency (array sizes,
  // special ids in range, merges). from_gguf calls it; call it after building a Vocab by hand.
  // Throws ember::Error.
  void finalize();
};

}  // namespace ember
