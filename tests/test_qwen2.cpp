// Qwen2 (model/qwen2.cpp: one file and one table row): synth files of its layout (Q/K/V biases,
// NeoX RoPE, tied or untied output) against the independent double-precision reference, the
// biases doing real work, and a file without them refused naming the tensor.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.hpp"
#include "engine/session.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "support/errors.hpp"
#include "support/reference_llama.hpp"
#include "support/session_logits.hpp"

using namespace ember;

namespace {

std::string write_qwen2(DType type, bool tied, const std::string& name) {
  SynthOptions o;
  o.arch = "qwen2";
  o.type = type;
  o.tied = tied;
  o.n_embd = 64;
  o.n_ff = 96;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.seed = 12;
  o.n_threads = 1;
  auto dir = std::filesystem::temp_directory_path() / "ember-test-qwen2";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / (name + ".gguf")).string();
  synth_write(o, path);
  return path;
}

}  // namespace

TEST(Qwen2, LogitsMatchTheReference) {
  for (const auto& [type, tied] : {std::pair{DType::F32, false}, std::pair{DType::F32, true}, std::pair{DType::Q8_0, false}}) {
    SCOPED_TRACE(std::string(dtype_name(type)) + (tied ? " tied" : " untied"));
    const std::string path = write_qwen2(type, tied, "q-" + std::string(dtype_name(type)) + (tied ? "-t" : ""));
    auto m = load_model(path);
    EXPECT_EQ(m->hp.arch, "qwen2");
    EXPECT_EQ(m->hp.rope.layout, cpu::RopeLayout::neox);
    ASSERT_TRUE(m->layers[0].bq.valid() && m->layers[0].bk.valid() && m->layers[0].bv.valid());
    EXPECT_FALSE(m->layers[0].bo.valid());
    SessionParams p;
    p.n_threads = 2;
    p.n_ctx = 64;
    Session s(*m, p);
    const auto got = test_support::session_logits(s);
    const std::vector<int32_t> tokens = test_support::session_tokens(*m);
    const bool quantized = type != DType::F32;
    EXPECT_LT(test_support::max_rel_diff(got, test_support::reference_llama_logits(*m, tokens, quantized)),
              quantized ? 2e-4 : 1e-5);
    // The biases matter: without them the reference is another function.
    for (auto& L : m->layers) L.bq = L.bk = L.bv = {};
    EXPECT_GT(test_support::max_rel_diff(got, test_support::reference_llama_logits(*m, tokens, quantized)), 1e-2);
    std::filesystem::remove(path);
  }
}
