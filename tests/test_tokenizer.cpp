// Tokenizer tests: the real SmolLM2 vocabulary against llama.cpp's ids, and small hand-made
// vocabularies (SentencePiece-style, byte-level BPE) with ids worked out by hand.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"
#include "tokenizer/pretokenize.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer/unicode.hpp"

using namespace ember;
namespace fs = std::filesystem;

namespace {

std::string source_dir() {
  if (const char* s = std::getenv("EMBER_SOURCE_DIR")) return s;
  return EMBER_SOURCE_DIR;
}

std::string model_path(const std::string& file) {
  const char* dir = std::getenv("EMBER_MODEL_DIR");
  return (fs::path(dir ? dir : source_dir() + "/models") / file).string();
}

const char* kSmolLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf";

class SmolLM2Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = model_path(kSmolLM2);
    if (!fs::exists(path)) return;
    reader_ = new gguf::Reader(path);
    tok_ = new Tokenizer(*reader_);
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete reader_;
    tok_ = nullptr;
    reader_ = nullptr;
  }
  void SetUp() override {
    if (!tok_)
      GTEST_SKIP() << "model " << model_path(kSmolLM2)
                   << " not found (set EMBER_MODEL_DIR or run the setup script to download it)";
  }
  static gguf::Reader* reader_;
  static Tokenizer* tok_;
};
gguf::Reader* SmolLM2Tokenizer::reader_ = nullptr;
Tokenizer* SmolLM2Tokenizer::tok_ = nullptr;

std::string show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

}  // namespace

TEST_F(SmolLM2Tokenizer, VocabMetadata) {
  const Vocab& v = tok_->vocab();
  EXPECT_EQ(v.type, VocabType::Bpe);
  EXPECT_EQ(v.pre, "smollm");
  EXPECT_EQ(v.pre_tokenizer, PreTokenizer::Smollm);
  EXPECT_EQ(tok_->n_vocab(), 49152);
  EXPECT_EQ(tok_->bos(), 1);
  EXPECT_EQ(tok_->eos(), 2);
  EXPECT_FALSE(v.add_bos);
  EXPECT_EQ(v.merges.size(), 48900u);
  EXPECT_TRUE(tok_->is_eog(2));  // <|im_end|>
  EXPECT_TRUE(tok_->is_eog(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->is_eog(1));  // <|im_start|>
  EXPECT_FALSE(tok_->is_eog(198));
  EXPECT_FALSE(tok_->is_eog(-1));
  EXPECT_FALSE(tok_->is_eog(1 << 30));
}

TEST_F(SmolLM2Tokenizer, MatchesLlamaCpp) {
  std::ifstream in(source_dir() + "/tests/data/tokenizer_smollm2.json");
  ASSERT_TRUE(in) << "missing tests/data/tokenizer_smollm2.json";
  const auto doc = nlohmann::json::parse(in);
  ASSERT_GE(doc["cases"].size(), 30u);
  for (const auto& c : doc["cases"]) {
    const std::string text = c["text"];
    const bool parse_special = c["parse_special"];
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok_->encode(text, /*add_special=*/true, parse_special);
    EXPECT_EQ(got, want) << "text: '" << text << "'\n got: " << show(got) << "\nwant: " << show(want);
    EXPECT_EQ(tok_->decode(got), text) << "round trip of '" << text << "'";
  }
}

TEST_F(SmolLM2Tokenizer, PiecesAndSpecials) {
  EXPECT_EQ(tok_->token_to_piece(198), "\n");
  EXPECT_EQ(tok_->token_to_piece(216), " ");
  EXPECT_EQ(tok_->token_to_piece(1), "<|im_start|>");
  EXPECT_EQ(tok_->token_to_piece(1, /*special=*/false), "");
  EXPECT_EQ(tok_->token_to_piece(-5), "");
  EXPECT_EQ(tok_->token_to_piece(tok_->n_vocab()), "");
  // Without parse_special, control token text is plain text.
  auto plain = tok_->encode("<|im_end|>", true, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok_->encode("<|im_end|>", true, true), std::vector<int32_t>{2});
  EXPECT_EQ(tok_->decode(plain), "<|im_end|>");
}

TEST_F(SmolLM2Tokenizer, InvalidUtf8NeverThrows) {
  const std::string bad = "ok \xff\xfe \xe2\x82 end \xc3";
  std::vector<int32_t> ids;
  ASSERT_NO_THROW(ids = tok_->encode(bad, true, true));
  EXPECT_FALSE(ids.empty());
  // Invalid bytes come back as U+FFFD, as in llama.cpp.
  EXPECT_EQ(tok_->decode(ids), "ok \xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD end \xEF\xBF\xBD");
}

TEST_F(SmolLM2Tokenizer, StreamingDecodeIsValidUtf8) {
  const std::string text = "Emoji 👨‍👩‍👧 and 日本語 and café";
  const auto ids = tok_->encode(text, false, false);
  Utf8Streamer streamer;
  std::string printed;
  for (int32_t id : ids) {
    std::string chunk = streamer.push(tok_->token_to_piece(id));
    EXPECT_EQ(unicode::incomplete_utf8_tail(chunk), 0u);
    printed += chunk;
  }
  printed += streamer.flush();
  EXPECT_EQ(printed, text);
}

TEST_F(SmolLM2Tokenizer, LongTextIsFast) {
  std::string text;
  const std::string para =
      "The quick brown fox jumps over the lazy dog; 1234 times, naïvely—or not? 日本語も少し。\n"
      "    def f(x):\treturn x ** 2  # comment\n";
  while (text.size() < 60000) text += para;
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok_->encode(text, false, false);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(ids.size(), 10000u);
  EXPECT_LT(secs, 1.0) << ids.size() << " tokens took " << secs << " s";
  EXPECT_EQ(tok_->decode(ids), text);
}

// --- Hand-made SentencePiece vocabulary ---

namespace {

// A small SPM vocabulary written as GGUF and read back, so the loader is exercised too.
std::vector<uint8_t> tiny_spm_gguf(bool with_scores = true, bool add_space_prefix = true) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {  // ids 3..258
    tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    types.push_back(6);
    scores.push_back(0);
  }
  // Normal pieces, id 259 onwards; higher score = merged first.
  const std::vector<std::pair<std::string, float>> normal = {
      {"\xE2\x96\x81", -1.0f},                 // 259 ▁
      {"h", -2.0f},                            // 260
      {"e", -2.0f},                            // 261
      {"l", -2.0f},                            // 262
      {"o", -2.0f},                            // 263
      {"w", -2.0f},                            // 264
      {"r", -2.0f},                            // 265
      {"d", -2.0f},                            // 266
      {"he", -3.0f},                           // 267
      {"ll", -1.5f},                           // 268
      {"llo", -4.0f},                          // 269
      {"hello", -5.0f},                        // 270
      {"\xE2\x96\x81hello", -0.5f},            // 271 ▁hello
      {"\xE2\x96\x81w", -6.0f},                // 272 ▁w
      {"or", -6.5f},                           // 273
      {"\xE2\x96\x81wor", -7.0f},              // 274 ▁wor
      {"\xE2\x96\x81world", -8.0f},            // 275 ▁world
      {"ld", -9.0f},                           // 276
      {"<|user|>", 0.0f},                      // 277 (user-defined)
  };
  for (const auto& [t, s] : normal) {
    tokens.push_back(t);
    types.push_back(t == "<|user|>" ? 4 : 1);
    scores.push_back(s);
  }
  gguf::Writer w;
  w.set("tokenizer.ggml.model", gguf::Value::str("llama"));
  w.set("tokenizer.ggml.tokens", gguf::Value::strings(tokens));
  if (with_scores) w.set("tokenizer.ggml.scores", gguf::Value::floats(scores));
  w.set("tokenizer.ggml.token_type", gguf::Value::ints(types));
  w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(2));
  w.set("tokenizer.ggml.unknown_token_id", gguf::Value::u32(0));
  w.set("tokenizer.ggml.add_space_prefix", gguf::Value::boolean(add_space_prefix));
  return w.to_bytes();
}

}  // namespace

TEST(SpmTokenizer, ScoreBasedMerges) {
  const auto bytes = tiny_spm_gguf();
  gguf::Reader r(bytes.data(), bytes.size());
  Tokenizer tok(r);
  EXPECT_EQ(tok.vocab().type, VocabType::Spm);
  EXPECT_TRUE(tok.vocab().add_bos);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_TRUE(tok.is_eog(2));

  // "hello world" -> "▁hello▁world". Merge order by score: ▁hello is reached through
  // "ll"(-1.5) ... and ends as ▁hello (271); "▁world" via ▁w, or, ▁wor, ▁world.
  EXPECT_EQ(tok.encode("hello world", true), (std::vector<int32_t>{1, 271, 275}));
  EXPECT_EQ(tok.encode("hello world", false), (std::vector<int32_t>{271, 275}));
  // "hell" has no whole token: ▁ + he + ll ("▁h" is not a token; "ll" outscores "he").
  EXPECT_EQ(tok.encode("hell", false), (std::vector<int32_t>{259, 267, 268}));
  // Unknown characters fall back to <0xXX> byte tokens (id = 3 + byte).
  EXPECT_EQ(tok.encode("h\xC3\xA9", false), (std::vector<int32_t>{259, 260, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.encode("", true), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok.encode("", false), (std::vector<int32_t>{}));
  // User-defined tokens are split out even without parse_special; the text after a special
  // token gets the space prefix again, as in llama.cpp.
  EXPECT_EQ(tok.encode("<|user|>hello", false), (std::vector<int32_t>{277, 271}));
  // Control tokens only with parse_special.
  EXPECT_EQ(tok.encode("</s>", false, true), (std::vector<int32_t>{2}));
  EXPECT_NE(tok.encode("</s>", false, false), (std::vector<int32_t>{2}));

  // Decoding: ▁ -> space, bytes -> raw bytes, leading prefix space removed.
  EXPECT_EQ(tok.token_to_piece(271), " hello");
  EXPECT_EQ(tok.token_to_piece(3 + 0x41), "A");
  EXPECT_EQ(tok.decode({1, 271, 275}), "<s>hello world");
  EXPECT_EQ(tok.decode({1, 271, 275}, /*special=*/false), "hello world");
  for (const std::string s : {"hello world", "hell", "h\xC3\xA9 wor ld  ", " leading", "x\ny"})
    EXPECT_EQ(tok.decode(tok.encode(s, false)), s) << s;
}

TEST(SpmTokenizer, NoSpacePrefix) {
  const auto bytes = tiny_spm_gguf(true, false);
  gguf::Reader r(bytes.data(), bytes.size());
  Tokenizer tok(r);
  EXPECT_EQ(tok.encode("hello world", false), (std::vector<int32_t>{270, 275}));
  EXPECT_EQ(tok.decode({270, 275}), "hello world");
}

TEST(SpmTokenizer, MissingScoresIsAnError) {
  const auto bytes = tiny_spm_gguf(false);
  gguf::Reader r(bytes.data(), bytes.size());
  EXPECT_THROW(Tokenizer{r}, Error);
}

// --- Hand-made byte-level BPE vocabulary ---

namespace {

Vocab tiny_bpe() {
  Vocab v;
  v.type = VocabType::Bpe;
  v.pre_tokenizer = PreTokenizer::Gpt2;
  // The byte-level alphabet for printable ASCII, plus Ġ (space) and Ċ (newline).
  for (int c = 0x21; c <= 0x7E; ++c) v.tokens.push_back(std::string(1, static_cast<char>(c)));  // ids 0..93
  v.tokens.push_back("\xC4\xA0");  // 94: Ġ
  v.tokens.push_back("\xC4\x8A");  // 95: Ċ
  v.merges = {{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}, {"o", "r"},
              {"\xC4\xA0w", "or"}, {"l", "d"}};
  for (const auto& [a, b] : v.merges) v.tokens.push_back(a + b);  // 96..103
  v.tokens.push_back("<|eot|>");  // 104
  v.types.assign(v.tokens.size(), TokenType::Normal);
  v.types[104] = TokenType::Control;
  v.eos = 104;
  return v;
}

}  // namespace

TEST(BpeTokenizer, RankedMerges) {
  Tokenizer tok(tiny_bpe());
  // hello -> ll(0), he(1), hell(2), hello(3) ; " world" -> Ġw, or, Ġwor, ld ; "!" alone
  EXPECT_EQ(tok.encode("hello world!", true), (std::vector<int32_t>{99, 102, 103, '!' - 0x21}));
  EXPECT_EQ(tok.decode(tok.encode("hello world!")), "hello world!");
  EXPECT_EQ(tok.token_to_piece(94), " ");
  EXPECT_EQ(tok.token_to_piece(95), "\n");
  EXPECT_EQ(tok.encode("<|eot|>", false, true), (std::vector<int32_t>{104}));
  EXPECT_TRUE(tok.is_eog(104));
  // Bytes without a token are dropped, as in llama.cpp (é is two bytes outside the alphabet here).
  EXPECT_EQ(tok.encode("\xC3\xA9", false), (std::vector<int32_t>{}));
}

TEST(BpeTokenizer, InconsistentVocabIsAnError) {
  Vocab v = tiny_bpe();
  v.types.pop_back();
  EXPECT_THROW(Tokenizer{v}, Error);
  Vocab w = tiny_bpe();
  w.bos = 5000;
  EXPECT_THROW(Tokenizer{w}, Error);
  Vocab x = tiny_bpe();
  x.add_bos = true;  // but no BOS id
  EXPECT_THROW(Tokenizer{x}, Error);
}

TEST(Vocab, GgufErrors) {
  auto load = [](gguf::Writer& w) {
    auto bytes = w.to_bytes();
    gguf::Reader r(bytes.data(), bytes.size());
    return Vocab::from_gguf(r);
  };
  {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("llama"));
    EXPECT_THROW(load(w), Error);  // no tokenizer at all
  }
  {
    gguf::Writer w;
    w.set("tokenizer.ggml.model", gguf::Value::str("bert"));
    w.set("tokenizer.ggml.tokens", gguf::Value::strings({"a", "b"}));
    try {
      load(w);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bert"), std::string::npos) << e.what();
    }
  }
  {
    gguf::Writer w;  // gpt2 without merges
    w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    w.set("tokenizer.ggml.tokens", gguf::Value::strings({"a", "b"}));
    EXPECT_THROW(load(w), Error);
  }
  {
    gguf::Writer w;  // token_type of the wrong length
    w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    w.set("tokenizer.ggml.tokens", gguf::Value::strings({"a", "b", "ab"}));
    w.set("tokenizer.ggml.merges", gguf::Value::strings({"a b"}));
    w.set("tokenizer.ggml.token_type", gguf::Value::ints({1, 1}));
    EXPECT_THROW(load(w), Error);
  }
  {
    gguf::Writer w;  // malformed merge
    w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    w.set("tokenizer.ggml.tokens", gguf::Value::strings({"a", "b", "ab"}));
    w.set("tokenizer.ggml.merges", gguf::Value::strings({"ab"}));
    EXPECT_THROW(load(w), Error);
  }
  {
    gguf::Writer w;  // unknown pre-tokenizer
    w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    w.set("tokenizer.ggml.tokens", gguf::Value::strings({"a", "b", "ab"}));
    w.set("tokenizer.ggml.merges", gguf::Value::strings({"a b"}));
    w.set("tokenizer.ggml.pre", gguf::Value::str("no-such-thing"));
    EXPECT_THROW(load(w), Error);
  }
  {
    gguf::Writer w;  // BOS out of range
    w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    w.set("tokenizer.ggml.tokens", gguf::Value::strings({"a", "b", "ab"}));
    w.set("tokenizer.ggml.merges", gguf::Value::strings({"a b"}));
    w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(3));
    EXPECT_THROW(load(w), Error);
  }
}

// --- Pre-tokenizers ---

namespace {

std::vector<std::string> split(PreTokenizer pre, const std::string& text) {
  const auto cpts = unicode::decode(text);
  std::vector<std::string> words;
  size_t pos = 0;
  for (size_t len : pre_tokenize(pre, cpts)) {
    words.push_back(unicode::encode(std::vector<uint32_t>(cpts.begin() + pos, cpts.begin() + pos + len)));
    pos += len;
  }
  return words;
}

using Words = std::vector<std::string>;

}  // namespace

TEST(PreTokenize, Gpt2) {
  EXPECT_EQ(split(PreTokenizer::Gpt2, "Hello world's 123 end!!  x   "),
            (Words{"Hello", " world", "'s", " 123", " end", "!!", " ", " x", "   "}));
  EXPECT_EQ(split(PreTokenizer::Gpt2, "a\n\nb"), (Words{"a", "\n", "\n", "b"}));
}

TEST(PreTokenize, Smollm) {
  EXPECT_EQ(split(PreTokenizer::Smollm, "x 1234 y"), (Words{"x", " ", "1", "2", "3", "4", " y"}));
}

TEST(PreTokenize, Llama3) {
  EXPECT_EQ(split(PreTokenizer::Llama3, "Hello WORLD'S 1234567 ok?\n\n  x"),
            (Words{"Hello", " WORLD", "'S", " ", "123", "456", "7", " ok", "?\n\n", " ", " x"}));
  EXPECT_EQ(split(PreTokenizer::Qwen2, "x12"), (Words{"x", "1", "2"}));
  EXPECT_EQ(split(PreTokenizer::Llama3, "a  \n b"), (Words{"a", "  \n", " b"}));
}

TEST(PreTokenize, Falcon) {
  // Falcon: '`' is punctuation of its own, and numbers are not split from their leading space
  // (no \p{N}+ step), only into ASCII digit triples.
  EXPECT_EQ(split(PreTokenizer::Falcon, "x 12 a`b"), (Words{"x", " 12", " a", "`", "b"}));
  EXPECT_EQ(split(PreTokenizer::Default, "x 12 a`b"), (Words{"x", " ", "12", " a", "`", "b"}));
  EXPECT_EQ(pre_tokenizer_from_name("falcon"), PreTokenizer::Falcon);
}

TEST(PreTokenize, Names) {
  EXPECT_EQ(pre_tokenizer_from_name("smollm"), PreTokenizer::Smollm);
  EXPECT_EQ(pre_tokenizer_from_name("llama-bpe"), PreTokenizer::Llama3);
  EXPECT_EQ(pre_tokenizer_from_name("gpt2"), PreTokenizer::Gpt2);
  EXPECT_EQ(pre_tokenizer_from_name("default"), PreTokenizer::Default);
  EXPECT_FALSE(pre_tokenizer_from_name("nope").has_value());
}

TEST(Unicode, Categories) {
  EXPECT_TRUE(unicode::is_letter('a'));
  EXPECT_TRUE(unicode::is_letter(0x00E9));   // é
  EXPECT_TRUE(unicode::is_letter(0x4E2D));   // 中
  EXPECT_TRUE(unicode::is_number('7'));
  EXPECT_TRUE(unicode::is_number(0x00B2));   // ²
  EXPECT_TRUE(unicode::is_number(0x1D7CE));  // mathematical bold digit zero
  EXPECT_TRUE(unicode::is_whitespace(' '));
  EXPECT_TRUE(unicode::is_whitespace(0x3000));
  EXPECT_FALSE(unicode::is_whitespace(0x1C));
  EXPECT_FALSE(unicode::is_letter(0x1F600));  // 😀
  EXPECT_EQ(unicode::flags(0x110000), unicode::kUndefined);
}

TEST(Utf8Streamer, HoldsIncompleteSequences) {
  Utf8Streamer s;
  EXPECT_EQ(s.push("a\xE6"), "a");
  EXPECT_EQ(s.push("\x97"), "");
  EXPECT_EQ(s.push("\xA5z"), "\xE6\x97\xA5z");
  EXPECT_EQ(s.push("\xF0\x9F"), "");
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.push("\xFF!"), "\xEF\xBF\xBD!");
}

// ---- Gemma 3's SentencePiece vocabulary (262k tokens, byte fallback, no space prefix) -------

namespace {
class Gemma3Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = model_path("gemma-3-270m-q4_k_m.gguf");
    if (!fs::exists(path)) return;
    reader_ = new gguf::Reader(path);
    tok_ = new Tokenizer(*reader_);
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete reader_;
    tok_ = nullptr;
    reader_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "Gemma 3 model not installed (scripts/get_model.sh gemma3)";
  }
  static gguf::Reader* reader_;
  static Tokenizer* tok_;
};
gguf::Reader* Gemma3Tokenizer::reader_ = nullptr;
Tokenizer* Gemma3Tokenizer::tok_ = nullptr;
}  // namespace

TEST_F(Gemma3Tokenizer, VocabMetadata) {
  const Vocab& v = tok_->vocab();
  EXPECT_EQ(v.type, VocabType::Spm);
  EXPECT_EQ(tok_->n_vocab(), 262144);
  EXPECT_EQ(tok_->bos(), 2);
  EXPECT_EQ(tok_->eos(), 1);
  EXPECT_TRUE(v.add_bos);
  EXPECT_TRUE(tok_->is_eog(1));  // <eos>
  EXPECT_FALSE(tok_->is_eog(2));
}

TEST_F(Gemma3Tokenizer, MatchesLlamaCpp) {
  std::ifstream in(source_dir() + "/tests/data/tokenizer_gemma3.json");
  ASSERT_TRUE(in) << "missing tests/data/tokenizer_gemma3.json";
  const auto doc = nlohmann::json::parse(in);
  ASSERT_GE(doc["cases"].size(), 30u);
  for (const auto& c : doc["cases"]) {
    const std::string text = c["text"];
    const bool parse_special = c["parse_special"];
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok_->encode(text, /*add_special=*/true, parse_special);
    EXPECT_EQ(got, want) << "text: '" << text << "'\n got: " << show(got) << "\nwant: " << show(want);
    // BOS (id 2) renders as nothing; everything else decodes back to the text.
    std::vector<int32_t> body(got.begin() + (got.empty() || got[0] != 2 ? 0 : 1), got.end());
    EXPECT_EQ(tok_->decode(body), text) << "round trip of '" << text << "'";
  }
}

TEST_F(Gemma3Tokenizer, InvalidUtf8NeverThrows) {
  const std::string bad = "ok \xff\xfe bad \xc3 trail \xe2\x82";
  std::vector<int32_t> ids;
  EXPECT_NO_THROW(ids = tok_->encode(bad, true, true));
  EXPECT_FALSE(ids.empty());
}
