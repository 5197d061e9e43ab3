// The shared blocks' optional parts (model/blocks.hpp) that no shipped architecture uses yet:
// a fused attn_qkv tensor (split into three row ranges at binding) gives the same logits bit for
// bit as three tensors, with and without biases; a parallel residual matches the independent
// double-precision reference with and without its own ffn_norm; and the architecture table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>

#include "core/error.hpp"
#include "engine/session.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"
#include "model/loader.hpp"
#include "model/model.hpp"
#include "model/repack.hpp"
#include "synth/synth.hpp"
#include "support/errors.hpp"
#include "support/reference_llama.hpp"
#include "support/session_logits.hpp"

using namespace ember;
using test_support::error_of;
using test_support::Logits;

namespace {

std::filesystem::path test_dir() {
  auto dir = std::filesystem::temp_directory_path() / "ember-test-blocks";
  std::filesystem::create_directories(dir);
  return dir;
}

std::string synth(const std::string& arch, DType type, const std::string& name) {
  SynthOptions o;
  o.arch = arch;
  o.act = arch == "opt" ? FfnActivation::relu : FfnActivation::silu;
  o.type = type;
  o.n_embd = 64;
  o.n_ff = 96;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_head_kv = arch == "opt" ? 4 : 2;
  o.tied = arch == "opt";
  o.seed = 3;
  o.n_threads = 1;
  const std::string path = (test_dir() / (name + ".gguf")).string();
  synth_write(o, path);
  return path;
}

std::vector<uint8_t> bytes_of(const gguf::Reader& r, const std::string& name) {
  const TensorView v = r.view(name);
  return std::vector<uint8_t>(v.data, v.data + v.nbytes);
}

// The same model with each layer's attn_q / attn_k / attn_v (and their biases) stored as one
// attn_qkv tensor, Q rows first, as Phi-3's and Falcon's GGUF files hold them. `bad_rows`
// drops the last row of layer 0's fused tensor.
std::string fuse_qkv(const std::string& path, const std::string& out, bool bad_rows = false) {
  gguf::Reader r(path);
  gguf::Writer w(r.alignment());
  for (const std::string& k : r.keys()) w.set(k, r.metadata().at(k));
  const std::regex q_re(R"(blk\.(\d+)\.attn_q\.(weight|bias))"), kv_re(R"(blk\.\d+\.attn_[kv]\.(weight|bias))");
  for (const auto& t : r.tensors()) {
    std::smatch m;
    if (std::regex_match(t.name, kv_re)) continue;
    if (!std::regex_match(t.name, m, q_re)) {
      const TensorView v = r.view(t);
      w.add_tensor(t.name, v.type, std::vector<int64_t>(v.ne, v.ne + v.n_dims), bytes_of(r, t.name));
      continue;
    }
    const std::string p = "blk." + m[1].str() + ".attn_", kind = m[2].str();
    const TensorView q = r.view(p + "q." + kind), k = r.view(p + "k." + kind), v = r.view(p + "v." + kind);
    std::vector<uint8_t> all = bytes_of(r, q.name);
    for (const TensorView* x : {&k, &v}) {
      const auto b = bytes_of(r, x->name);
      all.insert(all.end(), b.begin(), b.end());
    }
    if (kind == "bias") {
      w.add_tensor(p + "qkv.bias", DType::F32, {q.ne[0] + k.ne[0] + v.ne[0]}, std::move(all));
    } else {
      int64_t rows = q.rows() + k.rows() + v.rows();
      if (bad_rows && m[1].str() == "0") {
        --rows;
        all.resize(all.size() - q.row_size());
      }
      w.add_tensor(p + "qkv.weight", q.type, {q.ne[0], rows}, std::move(all));
    }
  }
  w.write(out);
  return out;
}

Logits logits_of(const Model& m) {
  SessionParams p;
  p.n_threads = 2;
  p.n_ctx = 64;
  Session s(m, p);
  return test_support::session_logits(s);
}

}  // namespace

TEST(Blocks, FusedQkvGivesTheSameLogitsBitForBit) {
  for (const auto& [arch, type] : {std::pair<std::string, DType>{"llama", DType::Q8_0}, {"llama", DType::F32},
                                   {"opt", DType::F32}, {"gemma3", DType::Q4_0}}) {
    SCOPED_TRACE(arch + " " + std::string(dtype_name(type)));
    const std::string plain = synth(arch, type, "plain-" + arch);
    const std::string fused = fuse_qkv(plain, (test_dir() / ("fused-" + arch + ".gguf")).string());
    auto a = load_model(plain), b = load_model(fused);
    ASSERT_FALSE(b->file->view("blk.0.attn_q.weight").valid());
    ASSERT_TRUE(b->file->view("blk.0.attn_qkv.weight").valid());
    EXPECT_EQ(b->layers[1].wk.rows(), a->layers[1].wk.rows());
    EXPECT_EQ(b->layers[1].bv.valid(), arch == "opt");
    EXPECT_EQ(b->weight_bytes_per_token(), a->weight_bytes_per_token());
    EXPECT_EQ(logits_of(*a), logits_of(*b));
    // Repacked for the dense kernels and copied out of the file: each row range on its own.
    repack_for_dense_kernels(*a, RepackScope::all, ResidentWeights::copy);
    repack_for_dense_kernels(*b, RepackScope::all, ResidentWeights::copy);
    EXPECT_EQ(b->layers[0].wq.type, a->layers[0].wq.type);
    EXPECT_EQ(logits_of(*a), logits_of(*b));
    // A fused tensor of the wrong size is named.
    const std::string bad = fuse_qkv(plain, (test_dir() / ("bad-" + arch + ".gguf")).string(), true);
    EXPECT_NE(error_of([&] { load_model(bad); }).find("attn_qkv.weight' has shape"), std::string::npos);
    for (const auto& f : {plain, fused, bad}) std::filesystem::remove(f);
  }
}

TEST(Blocks, ParallelResidualMatchesTheReference) {
  const std::string path = synth("llama", DType::F32, "parallel");
  for (bool own_norm : {true, false}) {
    SCOPED_TRACE(own_norm ? "ffn_norm of the layer input" : "attn_norm's output feeds the FFN");
    auto m = load_model(path);
    const Logits sequential = logits_of(*m);
    m->hp.parallel_residual = true;
    if (!own_norm)
      for (auto& L : m->layers) L.ffn.norm = {};
    const Logits parallel = logits_of(*m);
    const auto ref = test_support::reference_llama_logits(*m, test_support::session_tokens(*m));
    EXPECT_LT(test_support::max_rel_diff(parallel, ref), 1e-5);
    EXPECT_GT(test_support::max_rel_diff(sequential, parallel), 1e-2);  // it is another function
  }
  std::filesystem::remove(path);
}

// A llama file that declares a sliding window (Mistral-7B-v0.1's llama.attention.sliding_window)
// attends over that many positions on every layer, with the global RoPE: the double reference
// with the same window, and other logits than without it once the prompt is longer.
TEST(Blocks, LlamaSlidingWindowWhereTheFileDeclaresIt) {
  SynthOptions o;
  o.n_embd = 64, o.n_ff = 96, o.n_layer = 2, o.n_head = 4, o.n_head_kv = 2, o.seed = 5, o.n_threads = 1;
  gguf::Writer w = synth_model(o);
  w.set("llama.attention.sliding_window", gguf::Value::u32(5));
  const std::string path = (test_dir() / "llama-swa.gguf").string();
  w.write(path);
  auto m = load_model(path);
  ASSERT_EQ(m->hp.sliding_window, 5);
  ASSERT_EQ(m->hp.swa_layers, std::vector<bool>(2, true));
  EXPECT_EQ(m->rope_local, nullptr);
  const Logits windowed = logits_of(*m);  // 12 prompt tokens and 6 decode steps: beyond the window
  const auto ref = test_support::reference_llama_logits(*m, test_support::session_tokens(*m));
  EXPECT_LT(test_support::max_rel_diff(windowed, ref), 1e-5);
  m->hp.sliding_window = 0, m->hp.swa_layers.clear();
  const Logits full = logits_of(*m);
  EXPECT_EQ(test_support::max_rel_diff(Logits(windowed.begin(), windowed.begin() + 5), Logits(full.begin(), full.begin() + 5)),
            0.0);  // within the window: the same
  EXPECT_GT(test_support::max_rel_diff(windowed, full), 1e-3);
  std::filesystem::remove(path);
}

TEST(Blocks, ArchitectureTable) {
  for (const Architecture& a : architectures()) {  // every row is found by its name, with a loader and synth's description
    EXPECT_EQ(find_architecture(a.name), &a) << a.name;
    EXPECT_NE(a.load, nullptr) << a.name;
    ASSERT_NE(a.synth, nullptr) << a.name;
    EXPECT_FALSE(a.synth->acts.empty()) << a.name;
  }
  EXPECT_EQ(find_architecture("mixtral"), nullptr);
  EXPECT_EQ(architecture_names(), "llama, bamboo, opt, gemma3, qwen2, qwen3, qwen3moe, phi3, falcon");
  // A file of another architecture is refused naming the ones Ember runs.
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("mamba"));
  const std::string path = (test_dir() / "mamba.gguf").string();
  w.write(path);
  EXPECT_NE(error_of([&] { load_model(path); }).find("'mamba' is not supported (Ember runs: llama, bamboo"),
            std::string::npos);
  std::filesystem::remove(path);
}
