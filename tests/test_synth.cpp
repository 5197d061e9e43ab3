// Synthetic llama models: deterministic bytes, valid files for every weight type, llama.cpp's
// names and shapes, weights of the intended scale, a consistent vocabulary, clear errors.
#include "synth/synth.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "gguf/reader.hpp"
#include "tensor/quant.hpp"

using namespace ember;

namespace {

SynthOptions small_opts(DType type = DType::F32) {
  SynthOptions o = synth_preset("tiny");
  o.type = type;
  if (info(type).block_size > 32) {  // K-quants: rows must be multiples of 256
    o.n_embd = 256;
    o.n_ff = 512;
  }
  o.n_threads = 2;
  return o;
}

std::vector<uint8_t> synth_bytes(const SynthOptions& o) { return synth_model(o).to_bytes(); }

// Mean and standard deviation of a tensor's values, dequantized.
std::pair<double, double> moments(const TensorView& v) {
  std::vector<float> row(v.cols());
  double sum = 0, sum2 = 0;
  for (int64_t r = 0; r < v.rows(); ++r) {
    dequantize_row(v.type, v.row(r), row.data(), v.cols());
    for (float x : row) {
      sum += x;
      sum2 += double(x) * x;
    }
  }
  double n = double(v.n_elements());
  double mean = sum / n;
  return {mean, std::sqrt(std::max(0.0, sum2 / n - mean * mean))};
}

void expect_error(const SynthOptions& o, const std::string& needle) {
  try {
    validate(o);
    ADD_FAILURE() << "accepted invalid options; expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_THROW(synth_model(o), Error);
}

}  // namespace

TEST(Synth, DeterministicForASeed) {
  SynthOptions o = small_opts(DType::Q4_0);
  auto a = synth_bytes(o);
  o.n_threads = 1;
  auto b = synth_bytes(o);
  o.n_threads = 3;
  auto c = synth_bytes(o);
  EXPECT_EQ(a, b) << "bytes depend on the thread count";
  EXPECT_EQ(a, c) << "bytes depend on the thread count";
  o.seed = 2;
  auto d = synth_bytes(o);
  ASSERT_EQ(a.size(), d.size());
  EXPECT_NE(a, d) << "a different seed gives the same model";
  // Every weight tensor differs, not just one.
  gguf::Reader ra(a.data(), a.size()), rd(d.data(), d.size());
  for (const auto& t : ra.tensors()) {
    TensorView va = ra.view(t), vd = rd.view(t.name);
    EXPECT_NE(0, std::memcmp(va.data, vd.data, va.nbytes)) << t.name;
  }
  // Tensors of the same shape are not copies of each other.
  TensorView q0 = ra.view("blk.0.attn_q.weight"), q1 = ra.view("blk.1.attn_q.weight");
  EXPECT_NE(0, std::memcmp(q0.data, q1.data, q0.nbytes));
}

TEST(Synth, WritesTheSameBytesToDisk) {
  SynthOptions o = small_opts();
  std::string path = ::testing::TempDir() + "ember_synth_test.gguf";
  synth_write(o, path);
  gguf::Reader r(path);
  auto mem = synth_bytes(o);
  ASSERT_EQ(r.file_size(), mem.size());
  EXPECT_EQ(0, std::memcmp(r.data(), mem.data(), mem.size()));
  std::remove(path.c_str());
}

TEST(Synth, EveryTypeGivesAValidLlamaFile) {
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q6_K, DType::Q2_K,
                     DType::Q3_K}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    SynthOptions o = small_opts(type);
    o.act = FfnActivation::relu;
    auto bytes = synth_bytes(o);
    gguf::Reader r(bytes.data(), bytes.size());
    EXPECT_EQ(r.get_string("general.architecture"), "llama");
    EXPECT_EQ(r.get_string("general.name"), "ember-synth-tiny");
    EXPECT_EQ(r.get_int("llama.block_count"), o.n_layer);
    EXPECT_EQ(r.get_int("llama.context_length"), o.n_ctx);
    EXPECT_EQ(r.get_int("llama.embedding_length"), o.n_embd);
    EXPECT_EQ(r.get_int("llama.feed_forward_length"), o.n_ff);
    EXPECT_EQ(r.get_int("llama.attention.head_count"), o.n_head);
    EXPECT_EQ(r.get_int("llama.attention.head_count_kv"), o.n_head_kv);
    EXPECT_EQ(r.get_int("llama.rope.dimension_count"), o.n_embd / o.n_head);
    EXPECT_EQ(r.get_int("llama.vocab_size"), o.n_vocab);
    EXPECT_FLOAT_EQ(static_cast<float>(r.get_float("llama.rope.freq_base")), 10000.f);
    EXPECT_FLOAT_EQ(static_cast<float>(r.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
    EXPECT_EQ(r.get_string("llama.ffn_activation"), "relu");
    EXPECT_TRUE(r.has("general.file_type"));

    const int64_t head_dim = o.n_embd / o.n_head, kv = o.n_head_kv * head_dim;
    struct Expect {
      std::string name;
      DType type;
      std::vector<int64_t> ne;
    };
    std::vector<Expect> expect = {
        {"token_embd.weight", type, {o.n_embd, o.n_vocab}},
        {"output_norm.weight", DType::F32, {o.n_embd}},
        {"output.weight", type, {o.n_embd, o.n_vocab}},
    };
    for (int il = 0; il < o.n_layer; ++il) {
      std::string p = "blk." + std::to_string(il) + ".";
      expect.push_back({p + "attn_norm.weight", DType::F32, {o.n_embd}});
      expect.push_back({p + "attn_q.weight", type, {o.n_embd, o.n_embd}});
      expect.push_back({p + "attn_k.weight", type, {o.n_embd, kv}});
      expect.push_back({p + "attn_v.weight", type, {o.n_embd, kv}});
      expect.push_back({p + "attn_output.weight", type, {o.n_embd, o.n_embd}});
      expect.push_back({p + "ffn_norm.weight", DType::F32, {o.n_embd}});
      expect.push_back({p + "ffn_gate.weight", type, {o.n_embd, o.n_ff}});
      expect.push_back({p + "ffn_up.weight", type, {o.n_embd, o.n_ff}});
      expect.push_back({p + "ffn_down.weight", type, {o.n_ff, o.n_embd}});
    }
    EXPECT_EQ(r.tensors().size(), expect.size());
    for (const auto& e : expect) {
      const gguf::TensorInfo* t = r.find_tensor(e.name);
      ASSERT_NE(t, nullptr) << e.name;
      EXPECT_EQ(t->type, e.type) << e.name;
      ASSERT_EQ(t->n_dims, static_cast<int>(e.ne.size())) << e.name;
      for (size_t d = 0; d < e.ne.size(); ++d) EXPECT_EQ(t->ne[d], e.ne[d]) << e.name << " dim " << d;
    }

    // Weights have standard deviation about 1/sqrt(fan_in), mean about 0; norms are near 1.
    // (2- and 3-bit weights: a coarser grid, a wider spread of the dequantized values.)
    const double tol = type == DType::Q2_K || type == DType::Q3_K ? 0.25
                       : (type == DType::Q4_0 || type == DType::Q4_1) ? 0.12 : 0.05;
    for (const char* name : {"blk.0.ffn_down.weight", "blk.1.ffn_gate.weight", "token_embd.weight",
                             "blk.0.attn_k.weight"}) {
      TensorView v = r.view(name);
      auto [mean, sd] = moments(v);
      double want = 1.0 / std::sqrt(double(v.cols()));
      EXPECT_NEAR(sd / want, 1.0, tol) << name;
      EXPECT_NEAR(mean, 0.0, 0.1 * want) << name;
    }
    for (const char* name : {"blk.0.attn_norm.weight", "output_norm.weight"}) {
      auto [mean, sd] = moments(r.view(name));
      EXPECT_NEAR(mean, 1.0, 0.01) << name;
      EXPECT_GT(sd, 0.005) << name;
      EXPECT_LT(sd, 0.05) << name;
    }
  }
}

TEST(Synth, TiedOmitsOutputWeight) {
  SynthOptions o = small_opts();
  o.tied = true;
  auto bytes = synth_bytes(o);
  gguf::Reader r(bytes.data(), bytes.size());
  EXPECT_EQ(r.find_tensor("output.weight"), nullptr);
  EXPECT_NE(r.find_tensor("token_embd.weight"), nullptr);
  EXPECT_EQ(r.get_string("llama.ffn_activation"), "silu");
}

TEST(Synth, VocabularyIsConsistent) {
  for (int64_t n_vocab : {260, 300, 5000, 32000}) {
    SynthVocab v = synth_vocab(n_vocab);
    ASSERT_EQ(static_cast<int64_t>(v.tokens.size()), n_vocab);
    ASSERT_EQ(v.token_types.size(), v.tokens.size());
    EXPECT_EQ(v.merges.size(), static_cast<size_t>(n_vocab - 260));
    EXPECT_EQ(v.tokens[v.bos_id], "<|bos|>");
    EXPECT_EQ(v.tokens[v.eos_id], "<|eos|>");
    EXPECT_EQ(v.token_types[v.bos_id], 3);
    EXPECT_EQ(v.token_types[259], 3);
    EXPECT_EQ(v.token_types[0], 1);
    // GPT-2 byte symbols: token id = byte value.
    EXPECT_EQ(v.tokens['a'], "a");
    EXPECT_EQ(v.tokens[' '], "\xC4\xA0");   // U+0120 'Ġ'
    EXPECT_EQ(v.tokens['\n'], "\xC4\x8A");  // U+010A 'Ċ'
    EXPECT_EQ(v.tokens[0xAD], "\xC5\x83");  // U+0143
    EXPECT_EQ(v.tokens[0xFF], "\xC3\xBF");  // 'ÿ' stands for itself
    std::set<std::string> seen(v.tokens.begin(), v.tokens.end());
    EXPECT_EQ(seen.size(), v.tokens.size()) << "duplicate tokens";
    // Every merge joins two earlier tokens into the token at 260 + its rank.
    std::set<std::string> known(v.tokens.begin(), v.tokens.begin() + 260);
    for (size_t k = 0; k < v.merges.size(); ++k) {
      const std::string& m = v.merges[k];
      size_t sp = m.find(' ');
      ASSERT_NE(sp, std::string::npos) << m;
      std::string a = m.substr(0, sp), b = m.substr(sp + 1);
      EXPECT_TRUE(known.count(a)) << m;
      EXPECT_TRUE(known.count(b)) << m;
      EXPECT_EQ(v.tokens[260 + k], a + b);
      known.insert(a + b);
    }
  }
  EXPECT_THROW(synth_vocab(100), Error);
}

TEST(Synth, TokenizerMetadata) {
  auto bytes = synth_bytes(small_opts());
  gguf::Reader r(bytes.data(), bytes.size());
  EXPECT_EQ(r.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(r.get_string("tokenizer.ggml.pre"), "default");
  auto tokens = r.get_string_array("tokenizer.ggml.tokens");
  EXPECT_EQ(static_cast<int64_t>(tokens.size()), r.get_int("llama.vocab_size"));
  EXPECT_EQ(r.get_int_array("tokenizer.ggml.token_type").size(), tokens.size());
  EXPECT_EQ(r.get_string_array("tokenizer.ggml.merges").size(), tokens.size() - 260);
  EXPECT_EQ(tokens.at(r.get_int("tokenizer.ggml.bos_token_id")), "<|bos|>");
  EXPECT_EQ(tokens.at(r.get_int("tokenizer.ggml.eos_token_id")), "<|eos|>");
  EXPECT_NE(r.get_string("tokenizer.chat_template").find("<|im_start|>"), std::string::npos);
}

TEST(Synth, Presets) {
  SynthOptions b = synth_preset("1.1b");
  EXPECT_EQ(b.n_embd, 2048);
  EXPECT_EQ(b.n_ff, 5632);
  EXPECT_EQ(b.n_layer, 22);
  EXPECT_EQ(b.n_head, 32);
  EXPECT_EQ(b.n_head_kv, 4);
  EXPECT_EQ(b.n_vocab, 32000);
  SynthOptions s = synth_preset("7b");
  EXPECT_EQ(s.n_embd, 4096);
  EXPECT_EQ(s.n_ff, 11008);
  EXPECT_EQ(s.n_layer, 32);
  EXPECT_EQ(s.n_head_kv, 32);
  SynthOptions g = synth_preset("mistral-7b");
  EXPECT_EQ(g.n_ff, 14336);
  EXPECT_EQ(g.n_head_kv, 8);
  EXPECT_FLOAT_EQ(g.rope_base, 1e6f);
  SynthOptions m = synth_preset("smollm2-135m");
  EXPECT_EQ(m.n_embd, 576);
  EXPECT_EQ(m.n_head, 9);
  EXPECT_TRUE(m.tied);
  for (const auto& name : synth_preset_names()) EXPECT_NO_THROW(validate(synth_preset(name))) << name;
  // A 7B Q4_0 file is about 3.8 GB.
  s.type = DType::Q4_0;
  EXPECT_NEAR(synth_file_size(s) / 1e9, 3.8, 0.15);
  g.type = DType::Q4_0;  // Mistral-7B Q4_0: about 4.1 GB (7.2 B parameters)
  EXPECT_NEAR(synth_file_size(g) / 1e9, 4.1, 0.15);
  try {
    synth_preset("13b");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known: tiny"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_ffn_activation("relu"), FfnActivation::relu);
  EXPECT_EQ(parse_ffn_activation("gelu"), FfnActivation::gelu);
  EXPECT_THROW(parse_ffn_activation("swish"), Error);
}

TEST(Synth, BadOptionsGiveClearErrors) {
  SynthOptions o = small_opts();
  o.n_head = 5;
  expect_error(o, "n_head (5) must divide n_embd (64)");
  o = small_opts();
  o.n_head_kv = 3;
  expect_error(o, "n_head_kv (3) must divide n_head (4)");
  o = small_opts(DType::Q4_0);
  o.n_embd = 48, o.n_head = 3, o.n_head_kv = 1;
  expect_error(o, "needs n_embd to be a multiple of its block size 32, got 48");
  o = small_opts(DType::Q8_0);
  o.n_ff = 100;
  expect_error(o, "needs n_ff to be a multiple of its block size 32, got 100");
  o = synth_preset("tiny");
  o.type = DType::Q6_K;
  expect_error(o, "multiple of its block size 256, got 64");
  o = small_opts();
  o.type = DType::IQ4_NL;
  expect_error(o, "not supported");
  o = small_opts();
  o.arch = "mistral";
  expect_error(o, "--arch must be llama, bamboo, opt, gemma3, qwen2, qwen3, qwen3moe, phi3 or falcon");
  o = small_opts();
  o.arch = "falcon";  // GELU or ReLU, never SwiGLU
  expect_error(o, "falcon's FFN is gelu");
  o.act = FfnActivation::gelu;
  o.arch = "llama";
  expect_error(o, "--act gelu is for falcon");
  o = small_opts();
  o.n_expert = 4;  // experts without a count chosen per token
  expect_error(o, "needs both --n-expert and --n-expert-used");
  o.n_expert_used = 2;
  o.arch = "phi3";
  expect_error(o, "experts are for llama and qwen3moe");
  o = small_opts();
  o.arch = "qwen3moe";
  expect_error(o, "qwen3moe needs --n-expert");
  o = small_opts();
  o.arch = "phi3";
  o.powerinfer = true;
  expect_error(o, "PowerInfer's layout has no phi3");
  o = small_opts();
  o.head_dim = 32;
  expect_error(o, "explicit head size needs --arch gemma3, qwen3 or qwen3moe");
  o = small_opts();
  o.n_vocab = 100;
  expect_error(o, "n_vocab must be between 260");
  o = small_opts();
  o.n_layer = 0;
  expect_error(o, "n_layer must be between 1");
  o = small_opts();
  o.n_embd = -64;
  expect_error(o, "n_embd must be between 1");
  o = small_opts();
  o.n_embd = 60, o.n_head = 4, o.n_head_kv = 2;  // head size 15
  expect_error(o, "must be even");
  o = small_opts();
  o.rope_base = 0;
  expect_error(o, "rope base");
}
