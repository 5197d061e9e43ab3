#include "tokenizer/vocab.hpp"

#include <algorithm>
#include <span>
#include <string_view>
#include <unordered_map>

#include "core/error.hpp"
#include "core/log.hpp"
#include "gguf/reader.hpp"

namespace ember {

namespace {

// Token texts that end a turn or a message in common chat formats (the list llama.cpp uses).
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // DeepSeek
};
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
};
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<PAD>"};
constexpr std::string_view kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};

// A token id as the file holds it (a u32 may be 4000000000: kept as is, to be reported so).
std::optional<int64_t> opt_token_id(const gguf::Reader& r, const std::string& key) { return r.opt_int(key); }

}  // namespace

Vocab Vocab::from_gguf(const gguf::Reader& r) {
  Vocab v;
  const std::string& path = r.path();
  auto model = r.opt_string("tokenizer.ggml.model");
  EMBER_CHECK(model.has_value(), "{}: no tokenizer in this file (metadata 'tokenizer.ggml.model' is missing)", path);
  v.model = *model;
  if (v.model == "gpt2") {
    v.type = VocabType::Bpe;
  } else if (v.model == "llama") {
    v.type = VocabType::Spm;
  } else {
    fail("{}: tokenizer.ggml.model '{}' is not supported (supported: 'gpt2' = byte-level BPE, "
         "'llama' = SentencePiece-style)",
         path, v.model);
  }

  EMBER_CHECK(r.has("tokenizer.ggml.tokens"), "{}: metadata 'tokenizer.ggml.tokens' (the token list) is missing", path);
  v.tokens = r.get_string_array("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  EMBER_CHECK(n > 0, "{}: 'tokenizer.ggml.tokens' is empty", path);
  EMBER_CHECK(n < static_cast<size_t>(INT32_MAX), "{}: 'tokenizer.ggml.tokens' has too many tokens ({})", path, n);

  if (r.has("tokenizer.ggml.scores")) {
    v.scores = r.get_float_array("tokenizer.ggml.scores");
    EMBER_CHECK(v.scores.size() == n, "{}: 'tokenizer.ggml.scores' has {} entries but there are {} tokens", path,
                v.scores.size(), n);
  } else {
    EMBER_CHECK(v.type != VocabType::Spm, "{}: SentencePiece vocabulary without 'tokenizer.ggml.scores'", path);
    v.scores.assign(n, 0.0f);
  }

  if (r.has("tokenizer.ggml.token_type")) {
    auto types = r.get_int_array("tokenizer.ggml.token_type");
    EMBER_CHECK(types.size() == n, "{}: 'tokenizer.ggml.token_type' has {} entries but there are {} tokens", path,
                types.size(), n);
    v.types.resize(n);
    for (size_t i = 0; i < n; ++i) {
      EMBER_CHECK(types[i] >= 0 && types[i] <= 6, "{}: 'tokenizer.ggml.token_type'[{}] = {} is not a token type (0..6)",
                  path, i, types[i]);
      v.types[i] = static_cast<TokenType>(types[i]);
    }
  } else {
    v.types.assign(n, TokenType::Normal);
  }

  if (v.type == VocabType::Bpe) {
    EMBER_CHECK(r.has("tokenizer.ggml.merges"), "{}: byte-level BPE vocabulary without 'tokenizer.ggml.merges'", path);
    auto merges = r.get_string_array("tokenizer.ggml.merges");
    v.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const std::string& m = merges[i];
      const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      EMBER_CHECK(sp != std::string::npos && sp + 1 < m.size(),
                  "{}: 'tokenizer.ggml.merges'[{}] = '{}' is not two tokens separated by a space", path, i, m);
      v.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    v.pre = r.opt_string("tokenizer.ggml.pre").value_or("");
    auto pre = pre_tokenizer_from_name(v.pre);
    EMBER_CHECK(pre.has_value(), "{}: pre-tokenizer 'tokenizer.ggml.pre' = '{}' is not supported (supported: {})", path,
                v.pre, supported_pre_tokenizers());
    if (v.pre.empty()) log_warn("{}: no 'tokenizer.ggml.pre'; using the default pre-tokenizer", path);
    v.pre_tokenizer = *pre;
    v.add_bos = false;
    v.add_space_prefix = false;
    if (v.pre_tokenizer == PreTokenizer::Llama3 &&
        (v.pre == "llama3" || v.pre == "llama-v3" || v.pre == "llama-bpe" || v.pre == "falcon3")) {
      v.ignore_merges = true;
      v.add_bos = true;
    }
  } else {
    // SentencePiece defaults (llama.cpp's): <unk>=0, <s>=1, </s>=2, BOS added, space prefixed.
    v.unk = n > 0 ? 0 : kNoToken;
    v.bos = n > 1 ? 1 : kNoToken;
    v.eos = n > 2 ? 2 : kNoToken;
    v.add_bos = true;
    v.add_space_prefix = true;
  }

  auto read_id = [&](const char* key, int32_t& id, bool required_in_range) {
    auto val = opt_token_id(r, key);
    if (!val) return;
    if (*val >= 0 && static_cast<uint64_t>(*val) < n) {
      id = static_cast<int32_t>(*val);
    } else if (required_in_range) {
      fail("{}: '{}' = {} is outside the vocabulary (0..{})", path, key, *val, n - 1);
    } else {
      log_warn("{}: '{}' = {} is outside the vocabulary; ignored", path, key, *val);
      id = kNoToken;
    }
  };
  read_id("tokenizer.ggml.bos_token_id", v.bos, true);
  read_id("tokenizer.ggml.eos_token_id", v.eos, true);
  read_id("tokenizer.ggml.unknown_token_id", v.unk, true);
  read_id("tokenizer.ggml.eot_token_id", v.eot, true);
  read_id("tokenizer.ggml.eom_token_id", v.eom, true);
  read_id("tokenizer.ggml.padding_token_id", v.pad, false);
  if (auto b = r.opt_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
  if (auto b = r.opt_bool("tokenizer.ggml.add_eos_token")) v.add_eos = *b;
  if (auto b = r.opt_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;

  // FIM tokens end generation too; take their ids from the keys when present.
  std::vector<int32_t> fim;
  for (const char* key : {"tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id",
                          "tokenizer.ggml.fim_sep_token_id"}) {
    int32_t id = kNoToken;
    read_id(key, id, false);
    if (id != kNoToken) fim.push_back(id);
  }

  v.finalize();
  for (int32_t id : fim) v.eog.push_back(id);
  std::sort(v.eog.begin(), v.eog.end());
  v.eog.erase(std::unique(v.eog.begin(), v.eog.end()), v.eog.end());
  return v;
}

void Vocab::finalize() {
  const size_t n = tokens.size();
  EMBER_CHECK(n > 0, "vocabulary has no tokens");
  if (types.empty()) types.assign(n, TokenType::Normal);
  if (scores.empty()) scores.assign(n, 0.0f);
  EMBER_CHECK(types.size() == n, "vocabulary: {} token types for {} tokens", types.size(), n);
  EMBER_CHECK(scores.size() == n, "vocabulary: {} scores for {} tokens", scores.size(), n);
  auto in_range = [&](int32_t id) { return id == kNoToken || (id >= 0 && static_cast<size_t>(id) < n); };
  for (auto [name, id] : {std::pair{"bos", bos}, {"eos", eos}, {"unk", unk}, {"pad", pad}, {"eot", eot}, {"eom", eom}})
    EMBER_CHECK(in_range(id), "vocabulary: {} token id {} is outside 0..{}", name, id, n - 1);
  EMBER_CHECK(!add_bos || bos != kNoToken, "vocabulary asks for a BOS token (add_bos_token) but has no BOS id");
  EMBER_CHECK(!add_eos || eos != kNoToken, "vocabulary asks for an EOS token (add_eos_token) but has no EOS id");
  if (type == VocabType::Bpe) EMBER_CHECK(!merges.empty(), "byte-level BPE vocabulary has no merges");

  // Text -> id; when a text repeats, the last id wins, as in llama.cpp.
  std::unordered_map<std::string_view, int32_t> by_text;
  by_text.reserve(n);
  for (size_t i = 0; i < n; ++i) by_text[tokens[i]] = static_cast<int32_t>(i);
  auto find = [&](std::string_view t) {
    auto it = by_text.find(t);
    return it == by_text.end() ? kNoToken : it->second;
  };
  // Tokens that end turns are control tokens whatever the file says (as llama.cpp overrides).
  auto make_control = [&](int32_t id) {
    if (types[id] != TokenType::Control) {
      log_debug("token {} '{}' ends generation but is not a control token; treating it as one", id, tokens[id]);
      types[id] = TokenType::Control;
    }
  };
  if (eot == kNoToken) {
    for (auto t : kEotTexts)
      if (int32_t id = find(t); id != kNoToken) {
        eot = id;
        break;
      }
  }
  if (eom == kNoToken) eom = find("<|eom_id|>");

  eog.clear();
  for (int32_t id : {eos, eot, eom})
    if (id != kNoToken) eog.push_back(id);
  for (auto t : kEogTexts)
    if (int32_t id = find(t); id != kNoToken) eog.push_back(id);
  for (std::span<const std::string_view> list : {std::span<const std::string_view>(kFimPadTexts),
                                                 std::span<const std::string_view>(kFimRepTexts),
                                                 std::span<const std::string_view>(kFimSepTexts)})
    for (auto t : list)
      if (int32_t id = find(t); id != kNoToken) {
        eog.push_back(id);
        break;
      }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  for (int32_t id : eog)
    if (id != eos) make_control(id);
  if (eot != kNoToken) make_control(eot);
}

}  // namespace ember
