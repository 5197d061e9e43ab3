// Text <-> token ids for byte-level BPE ("gpt2") and SentencePiece-style ("llama") vocabularies,
// matching llama.cpp's tokenizer token for token.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/vocab.hpp"

namespace ember {

namespace gguf {
class Reader;
}

class Tokenizer {
 public:
  explicit Tokenizer(Vocab vocab);
  // Reads the vocabulary from GGUF metadata (Vocab::from_gguf).
  explicit Tokenizer(const gguf::Reader& reader);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Text to token ids. add_special: add BOS (and EOS) when the model asks for it
  // (tokenizer.ggml.add_bos_token / add_eos_token). parse_special: text of control tokens
  // such as <|im_start|> becomes that token; otherwise it is tokenized as plain text.
  // User-defined tokens are always recognized. Never throws on any byte string (invalid UTF-8
  // is read as U+FFFD, as llama.cpp does).
  std::vector<int32_t> encode(std::string_view text, bool add_special = true, bool parse_special = false) const;

  // A user's text that goes into a prompt encoded with parse_special (a chat message inside the
  // template's markup) stays text: each control token's text in it gets kTextMark after its
  // first byte, so encode finds no control token there, and drops the marks from plain text (the
  // same ids as the text alone). Marks already in `text` are kept: dropped the same way, they
  // make no control token either.
  std::string mark_as_text(std::string_view text) const;
  static constexpr std::string_view kTextMark = "\xEF\xB7\x90";  // U+FDD0, a noncharacter

  // The bytes a token stands for: byte-level decoding for BPE; for SPM U+2581 becomes a space
  // and <0xAB> tokens the raw byte. May be part of a UTF-8 sequence (see Utf8Streamer).
  // Control and unknown tokens give their text when `special` is true, nothing otherwise.
  // An id out of range gives an empty string.
  std::string token_to_piece(int32_t id, bool special = true) const;
  // Concatenated pieces. For SPM with add_space_prefix the leading space the encoder added is
  // removed from the first piece, so decode(encode(x)) == x.
  std::string decode(const std::vector<int32_t>& ids, bool special = true) const;

  // End of generation: EOS, EOT, EOM, and tokens llama.cpp treats so (<|im_end|>,
  // <end_of_turn>, <|eot_id|>, <|endoftext|>, <|end|>, <|eom_id|>, <EOT>, FIM pad/repo/sep).
  bool is_eog(int32_t id) const;
  bool is_control(int32_t id) const;

  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  int32_t eot() const { return vocab_.eot; }
  int32_t n_vocab() const { return vocab_.n_vocab(); }
  // Token id of an exact token text; kNoToken when absent.
  int32_t find_token(std::string_view text) const;
  const Vocab& vocab() const { return vocab_; }

 private:
  struct Impl;
  Vocab vocab_;
  std::unique_ptr<Impl> impl_;
};

// Buffers the end of a byte stream that stops inside a UTF-8 sequence, so each chunk it
// returns is valid UTF-8 on its own. Use it to print token pieces as they are generated.
class Utf8Streamer {
 public:
  // Appends bytes and returns the longest prefix of everything pending that ends on a
  // character boundary; the rest waits for the next call.
  std::string push(std::string_view bytes);
  // Returns whatever is left (an incomplete sequence becomes U+FFFD) and clears the buffer.
  std::string flush();
  bool empty() const { return pending_.empty(); }

 private:
  std::string pending_;
};

}  // namespace ember
