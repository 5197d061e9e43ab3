// The loader's checks of what a file claims (model/loader.cpp): float hyperparameters in their
// range, matrices whose first and last rows are finite, norms that are finite; each refusal names
// the file, the key or tensor, and what is wrong. (Tensor slots that their type and shape do not
// fill are the reader's: GgufMalformed.TensorSmallerThanItsSlot.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "engine/generator.hpp"
#include "engine/session.hpp"
#include "gguf/reader.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "tokenizer/tokenizer.hpp"
#include "support/errors.hpp"
#include "support/session_params.hpp"
#include "support/synth_suite.hpp"
#include "support/synth_files.hpp"

using namespace ember;

namespace {

SynthOptions tiny() {
  SynthOptions o = synth_preset("tiny");
  o.n_threads = 1;
  return o;
}

// The error load_model gives for a file of these bytes (empty when it loads).
std::string load_error(const std::vector<uint8_t>& bytes, const std::string& stem) {
  const std::string path = test_support::own_test_file(test_support::test_temp_dir("loader"), stem);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
  std::string e = test_support::error_of([&] { load_model(path); });
  std::filesystem::remove(path);
  return e;
}

// The bytes of `o`'s synth file with float `value` written over element `index` of `tensor`
// (an F32 tensor).
std::vector<uint8_t> with_value(const SynthOptions& o, const std::string& tensor, int64_t index, float value) {
  std::vector<uint8_t> b = synth_model(o).to_bytes();
  const gguf::Reader r(b.data(), b.size());
  const TensorView v = r.view(tensor);
  EXPECT_TRUE(v.valid() && v.type == DType::F32) << tensor;
  std::memcpy(const_cast<uint8_t*>(v.data) + index * 4, &value, 4);
  return b;
}

}  // namespace

TEST(Loader, RefusesFloatHyperparametersOutOfRange) {
  EXPECT_EQ(load_error(synth_model(tiny()).to_bytes(), "ok"), "");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (auto [key, value, want] :
       {std::tuple<const char*, float, const char*>{"llama.attention.layer_norm_rms_epsilon", nan, "is nan"},
        {"llama.attention.layer_norm_rms_epsilon", 0.0f, "is 0,"},
        {"llama.attention.layer_norm_rms_epsilon", -1.0f, "is -1,"},
        {"llama.rope.freq_base", -10000.0f, "llama.rope.freq_base is -10000"},
        {"llama.rope.freq_base", std::numeric_limits<float>::infinity(), "is inf"},
        {"llama.rope.scaling.attn_factor", 0.0f, "attn_factor is 0"}}) {
    SCOPED_TRACE(std::string(key) + " = " + std::to_string(value));
    gguf::Writer w = synth_model(tiny());
    w.set(key, gguf::Value::f32(value));
    const std::string e = load_error(w.to_bytes(), "hparam");
    EXPECT_NE(e.find(std::string(key)), std::string::npos) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_NE(e.find("must be a finite number in"), std::string::npos) << e;
  }
}

TEST(Loader, RefusesMatricesAndNormsThatAreNotFinite) {
  const SynthOptions o = tiny();  // F32 weights
  const int64_t n_embd = o.n_embd, n_ff = o.n_ff;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // The first row (a NaN), the last row (an infinity) of a matrix, named with its row.
  std::string e = load_error(with_value(o, "blk.1.ffn_gate.weight", 3, nan), "nan-first");
  EXPECT_NE(e.find("tensor 'blk.1.ffn_gate.weight' holds a value that is not finite (NaN or infinity) in row 0 of "),
            std::string::npos) << e;
  e = load_error(with_value(o, "blk.0.attn_q.weight", n_embd * n_embd - 1, -inf), "inf-last");
  EXPECT_NE(e.find("'blk.0.attn_q.weight' holds a value that is not finite (NaN or infinity) in row " +
                   std::to_string(n_embd - 1)), std::string::npos) << e;
  e = load_error(with_value(o, "token_embd.weight", 0, nan), "embd");
  EXPECT_NE(e.find("'token_embd.weight'"), std::string::npos) << e;
  // A norm, anywhere in it.
  e = load_error(with_value(o, "blk.0.ffn_norm.weight", n_embd / 2, nan), "norm");
  EXPECT_NE(e.find("tensor 'blk.0.ffn_norm.weight' holds a value that is not finite (nan at " +
                   std::to_string(n_embd / 2) + ")"), std::string::npos) << e;
  // A NaN in a middle row is not looked for (the cheap check reads two rows a matrix).
  EXPECT_EQ(load_error(with_value(o, "blk.0.ffn_up.weight", n_embd * (n_ff / 2), nan), "middle"), "");
}

// ... but it shows at run time: generation and perplexity stop with an error that says what to
// do (`ember inspect --verify` names the tensor), instead of sampling from NaN logits.
TEST(Loader, ANanInAMiddleRowStopsTheRunWithItsCause) {
  const SynthOptions o = tiny();
  const std::vector<uint8_t> bytes =
      with_value(o, "blk.0.ffn_up.weight", o.n_embd * (o.n_ff / 2), std::numeric_limits<float>::quiet_NaN());
  const std::string path = ::testing::TempDir() + "ember_loader_middle_nan.gguf";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  auto model = load_model(path);
  Tokenizer tok(*model->file);
  Session s(*model, test_support::session_params(1, 64, 16));
  try {
    generate(s, tok, {1, 2, 3}, test_support::greedy(4), [](std::string_view) { return true; });
    ADD_FAILURE() << "generated from NaN logits";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("logits that are not finite (NaN or infinity) at position 2"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("ember inspect --verify"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}
