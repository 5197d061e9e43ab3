// Repacking a loaded model for the dense kernels (model/repack.hpp): what is repacked, and that
// the forward pass gives the same logits as the file's layout.
#include "model/repack.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/session.hpp"
#include "model/synth.hpp"
#include "ops/cpu/q4_0_r16.hpp"
#include "support/ffn_modes.hpp"

using namespace ember;
using test_support::Logits;

namespace {

std::string synth_path(const SynthOptions& o, const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "ember-test-repack";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / (name + ".gguf")).string();
  synth_write(o, path);
  return path;
}

SynthOptions q4_0_model(FfnActivation act, bool tied) {
  SynthOptions o;
  o.type = DType::Q4_0;
  o.act = act;
  o.tied = tied;
  o.n_vocab = 320;  // a multiple of 16: the output matrix can be repacked
  o.seed = 21;
  o.n_threads = 1;
  return o;
}

bool owned(const Model& m, const TensorView& w) {
  for (const auto& b : m.owned_weights)
    if (w.data == b.data()) return true;
  return false;
}

}  // namespace

TEST(Repack, DenseScopeRepacksEveryMultipliedMatrixAndKeepsLogits) {
  if (!cpu::q4_0_r16_fast()) GTEST_SKIP() << "no AVX-512 VNNI: nothing is repacked";
  const std::string path = synth_path(q4_0_model(FfnActivation::silu, false), "untied");
  auto plain = load_model(path);
  auto packed = load_model(path);
  const RepackStats st = repack_for_dense_kernels(*packed, RepackScope::all);
  const int64_t nl = packed->hp.n_layer;
  EXPECT_EQ(st.tensors, 7 * nl + 1);
  EXPECT_EQ(packed->owned_weights.size(), static_cast<size_t>(st.tensors));
  for (const LayerWeights& l : packed->layers)
    for (const TensorView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn.gate, &l.ffn.up, &l.ffn.down}) {
      EXPECT_EQ(w->type, DType::Q4_0_R16) << w->name;
      EXPECT_TRUE(owned(*packed, *w)) << w->name;
    }
  EXPECT_EQ(packed->output.type, DType::Q4_0_R16);
  EXPECT_EQ(packed->tok_embd.type, DType::Q4_0);  // looked up row by row

  // Same quantized activations, same integer block dots: only the float summation order of the
  // per-block terms differs.
  for (int threads : {1, 2}) {
    const Logits a = test_support::run_ffn_mode(*plain, FfnMode::dense, threads);
    const Logits b = test_support::run_ffn_mode(*packed, FfnMode::dense, threads);
    EXPECT_LT(test_support::max_rel_diff(a, b), 2e-5) << threads << " threads";
  }
  std::filesystem::remove(path);
}

TEST(Repack, SparseScopeLeavesTheFfnAndTiedOutputAddressable) {
  if (!cpu::q4_0_r16_fast()) GTEST_SKIP() << "no AVX-512 VNNI: nothing is repacked";
  const std::string path = synth_path(q4_0_model(FfnActivation::relu, true), "tied_relu");
  auto plain = load_model(path);
  auto packed = load_model(path);
  const RepackStats st = repack_for_dense_kernels(*packed, RepackScope::attention_output);
  EXPECT_EQ(st.tensors, 4 * packed->hp.n_layer);  // output is the (tied) token embedding
  EXPECT_EQ(packed->output.type, DType::Q4_0);
  for (const LayerWeights& l : packed->layers) {
    EXPECT_EQ(l.wq.type, DType::Q4_0_R16);
    for (const TensorView* w : {&l.ffn.gate, &l.ffn.up, &l.ffn.down}) EXPECT_EQ(w->type, DType::Q4_0) << w->name;
  }
  // Oracle mode gathers single FFN rows: it runs on the repacked model and agrees with the plain one.
  const Logits a = test_support::run_ffn_mode(*plain, FfnMode::oracle, 2);
  const Logits b = test_support::run_ffn_mode(*packed, FfnMode::oracle, 2);
  EXPECT_LT(test_support::max_rel_diff(a, b), 2e-5);
  std::filesystem::remove(path);
}

TEST(Repack, OnlyMatricesWithWholeGroupsOfRowsAndNothingForOtherTypes) {
  SynthOptions o = q4_0_model(FfnActivation::silu, false);
  o.n_vocab = 300;  // output rows not a multiple of 16
  const std::string path = synth_path(o, "odd_vocab");
  auto m = load_model(path);
  const RepackStats st = repack_for_dense_kernels(*m, RepackScope::all);
  EXPECT_EQ(m->output.type, DType::Q4_0);
  EXPECT_EQ(st.tensors, cpu::q4_0_r16_fast() ? 7 * m->hp.n_layer : 0);
  std::filesystem::remove(path);

  o.type = DType::Q8_0;
  const std::string p8 = synth_path(o, "q8_0");
  auto m8 = load_model(p8);
  EXPECT_EQ(repack_for_dense_kernels(*m8, RepackScope::all).tensors, 0);
  std::filesystem::remove(p8);
}
