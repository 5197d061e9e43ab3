// Repacking a loaded model for the dense kernels (model/repack.hpp): what is repacked, and that
// the forward pass gives the same logits as the file's layout.
#include "model/repack.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "engine/session.hpp"
#include "core/cpu_features.hpp"
#include "synth/synth.hpp"
#include "ops/cpu/r16/r16.hpp"
#include "support/ffn_modes.hpp"
#include "support/simd_levels.hpp"

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

// Models whose activations are quantized to 8 bits before every product amplify float rounding:
// a difference of one ulp can flip an int8 activation somewhere and move logits by a percent
// (seen on the Q6_K synth below, even between Ember's own AVX-512 and scalar Q6_K kernels). So
// the whole forward pass is compared where the arithmetic is pinned down: at the scalar level,
// where the repacked kernels compute each dot with the same operations in the same order as the
// file layout's (and tests/test_r16.cpp shows the AVX-512 repacked kernels equal their scalar
// ones bit for bit). Almost the same operations: the repacked kernels add each block with one
// fused multiply-add where the file layout's scalar Q4_0 and Q5_0 dots round the product first;
// in the Q5_0 model that half ulp flips an 8-bit activation downstream (0.08% of its logits), so
// `tol` says how much each comparison allows.
void expect_same_logits(const Model& plain, const Model& packed, FfnMode mode, double tol = 1e-6) {
  test_support::SimdGuard guard;
  set_simd_level(SimdLevel::scalar);
  EXPECT_LT(test_support::max_rel_diff(test_support::run_ffn_mode(plain, mode, 2),
                                       test_support::run_ffn_mode(packed, mode, 2)),
            tol);
}

// A tied ReLU model in PowerInfer's layout (ffn_down_t, predictors fc1 / fc2).
std::string powerinfer_path(const std::string& name) {
  SynthOptions o = q4_0_model(FfnActivation::relu, true);
  o.powerinfer = true;
  o.sparsity = 0.8f;
  return synth_path(o, name);
}

bool owned(const Model& m, const TensorView& w) {
  for (const auto& b : m.owned_weights)
    if (w.data >= b.data() && w.data + w.nbytes <= b.data() + b.size()) return true;
  return false;
}

}  // namespace

TEST(Repack, DenseScopeRepacksEveryMultipliedMatrixAndKeepsLogits) {
  if (!cpu::r16_pays(DType::Q4_0)) GTEST_SKIP() << "Q4_0 is not repacked at this SIMD level";
  const std::string path = synth_path(q4_0_model(FfnActivation::silu, false), "untied");
  auto plain = load_model(path);
  auto packed = load_model(path);
  const RepackStats st = repack_for_dense_kernels(*packed, RepackScope::all);
  const int64_t nl = packed->hp.n_layer;
  EXPECT_EQ(st.tensors, 7 * nl + 1);
  EXPECT_EQ(packed->owned_weights.size(), 1u);  // one buffer for all of them
  EXPECT_EQ(st.copied_tensors, 0);
  for (const LayerWeights& l : packed->layers)
    for (const TensorView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn.gate, &l.ffn.up, &l.ffn.down}) {
      EXPECT_EQ(w->type, DType::Q4_0_R16) << w->name;
      EXPECT_TRUE(owned(*packed, *w)) << w->name;
    }
  EXPECT_EQ(packed->output.type, DType::Q4_0_R16);
  EXPECT_EQ(packed->tok_embd.type, DType::Q4_0);  // looked up row by row

  expect_same_logits(*plain, *packed, FfnMode::dense);
  std::filesystem::remove(path);
}

TEST(Repack, SparseScopeLeavesTheFfnAndTiedOutputAddressable) {
  if (!cpu::r16_pays(DType::Q4_0)) GTEST_SKIP() << "Q4_0 is not repacked at this SIMD level";
  const std::string path = synth_path(q4_0_model(FfnActivation::relu, true), "tied_relu");
  auto plain = load_model(path);
  auto packed = load_model(path);
  const RepackStats st = repack_for_dense_kernels(*packed, RepackScope::attention_output);
  // The tied output matrix is repacked too: the token embedding's rows are then looked up a
  // group at a time (the logits below go through that lookup).
  EXPECT_EQ(st.tensors, 4 * packed->hp.n_layer + 1);
  EXPECT_EQ(packed->output.type, DType::Q4_0_R16);
  EXPECT_EQ(packed->tok_embd.type, DType::Q4_0_R16);
  EXPECT_EQ(packed->tok_embd.data, packed->output.data);
  for (const LayerWeights& l : packed->layers) {
    EXPECT_EQ(l.wq.type, DType::Q4_0_R16);
    for (const TensorView* w : {&l.ffn.gate, &l.ffn.up, &l.ffn.down}) EXPECT_EQ(w->type, DType::Q4_0) << w->name;
  }
  // Oracle mode gathers single FFN rows: it runs on the repacked model and agrees with the plain one.
  expect_same_logits(*plain, *packed, FfnMode::oracle);
  // Oracle and threshold modes compute the gate whole: it may be repacked too (up and down stay).
  auto gate_packed = load_model(path);
  EXPECT_EQ(repack_for_dense_kernels(*gate_packed, RepackScope::attention_output_gate).tensors,
            5 * gate_packed->hp.n_layer + 1);
  for (const LayerWeights& l : gate_packed->layers) {
    EXPECT_EQ(l.ffn.gate.type, DType::Q4_0_R16);
    EXPECT_EQ(l.ffn.up.type, DType::Q4_0);
  }
  expect_same_logits(*plain, *gate_packed, FfnMode::oracle);
  // At the machine's own SIMD level too (this model's 8-bit activations do not flip: see the
  // Q4_0 dense test above), through the fused one-token path.
  const Logits a = test_support::run_ffn_mode(*plain, FfnMode::oracle, 2);
  const Logits b = test_support::run_ffn_mode(*gate_packed, FfnMode::oracle, 2);
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
  EXPECT_EQ(st.tensors, cpu::r16_pays(DType::Q4_0) ? 7 * m->hp.n_layer : 0);
  std::filesystem::remove(path);

  o.type = DType::F16;
  const std::string p16 = synth_path(o, "f16");
  auto m16 = load_model(p16);
  EXPECT_EQ(repack_for_dense_kernels(*m16, RepackScope::all).tensors, 0);
  std::filesystem::remove(p16);
}

TEST(Repack, Q4_1Q5_0Q8_0AndKQuantModelsKeepTheirLogits) {
  for (DType type : {DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    if (!cpu::r16_pays(type)) continue;  // not repacked at this SIMD level
    SynthOptions o = q4_0_model(FfnActivation::silu, false);
    o.type = type;
    o.n_embd = 256;  // K-quant rows are multiples of 256
    o.n_ff = 512;
    const std::string path = synth_path(o, std::string(dtype_name(type)));
    auto plain = load_model(path);
    auto packed = load_model(path);
    const RepackStats st = repack_for_dense_kernels(*packed, RepackScope::all);
    EXPECT_EQ(st.tensors, 7 * packed->hp.n_layer + 1);
    EXPECT_EQ(packed->layers[0].ffn.down.type, cpu::r16_type(type));
    expect_same_logits(*plain, *packed, FfnMode::dense, type == DType::Q5_0 ? 2e-3 : 1e-6);
    std::filesystem::remove(path);
  }
}

TEST(Repack, ResidentCopyTakesEveryOtherPerTokenMatrixOutOfTheFileWithItsBytes) {
  // A PowerInfer-layout file (ffn_down_t, predictors) with a tied output, in predictor mode's
  // scope: attention and output repacked (where the machine has the kernels), the FFN's rows and
  // the predictors copied as they are.
  const std::string path = powerinfer_path("resident");
  auto plain = load_model(path);
  auto copied = load_model(path);
  const RepackStats st = repack_for_dense_kernels(*copied, RepackScope::attention_output, ResidentWeights::copy);
  const int64_t nl = copied->hp.n_layer;
  const bool packs = cpu::r16_pays(DType::Q4_0);
  EXPECT_EQ(st.tensors, packs ? 4 * nl + 1 : 0);
  EXPECT_EQ(st.copied_tensors, (packs ? 5 : 9) * nl + (packs ? 0 : 1));  // gate, up, down_t, fc1, fc2 (+ attention, output)
  EXPECT_EQ(copied->owned_weights.size(), 1u);
  EXPECT_EQ(st.bundled_layers, nl);
  for (size_t l = 0; l < copied->layers.size(); ++l) {
    const LayerWeights& c = copied->layers[l];
    const LayerWeights& p = plain->layers[l];
    for (auto [cw, pw] : {std::pair{&c.ffn.gate, &p.ffn.gate}, std::pair{&c.ffn.up, &p.ffn.up},
                          std::pair{&c.ffn.down_t, &p.ffn.down_t}, std::pair{&c.ffn.fc1, &p.ffn.fc1},
                          std::pair{&c.ffn.fc2, &p.ffn.fc2}}) {
      ASSERT_TRUE(pw->valid()) << pw->name;
      EXPECT_TRUE(owned(*copied, *cw)) << cw->name;
      EXPECT_EQ(cw->type, pw->type) << cw->name;
      ASSERT_EQ(cw->nbytes, pw->nbytes) << cw->name;
      ASSERT_EQ(cw->rows(), pw->rows()) << cw->name;
      for (int64_t r = 0; r < pw->rows(); ++r)
        ASSERT_EQ(std::memcmp(cw->row(r), pw->row(r), pw->row_stride()), 0) << cw->name << " row " << r;
    }
    // Each neuron's gate, up and down rows one after the other (the gate is gathered in this
    // scope); the predictors stay whole matrices.
    const size_t g = p.ffn.gate.row_stride(), u = p.ffn.up.row_stride(), d = p.ffn.down_t.row_stride();
    for (const TensorView* w : {&c.ffn.gate, &c.ffn.up, &c.ffn.down_t}) EXPECT_EQ(w->row_stride(), g + u + d);
    EXPECT_EQ(c.ffn.up.data, c.ffn.gate.data + g);
    EXPECT_EQ(c.ffn.down_t.data, c.ffn.up.data + u);
    EXPECT_TRUE(c.ffn.fc1.contiguous() && c.ffn.fc2.contiguous());
    EXPECT_TRUE(owned(*copied, c.wq));
  }
  // The tied embedding follows its output matrix into the buffer.
  EXPECT_TRUE(owned(*copied, copied->output));
  EXPECT_EQ(copied->tok_embd.data, copied->output.data);
  EXPECT_EQ(copied->tok_embd.type, copied->output.type);
  // The same function: predictor-mode logits equal (same bytes, same kernels) at the scalar
  // level, where repacked and file layouts compute alike.
  expect_same_logits(*plain, *copied, FfnMode::predictor);
  std::filesystem::remove(path);
}

TEST(Repack, BundledFfnRowsGiveTheSameLogitsAtEveryLevel) {
  // The same matrices in the file's map and bundled by neuron, the same repacking: the same
  // kernels read the same bytes at other addresses, so every logit is equal bit for bit: a
  // 20-token prompt (the dense FFN over strided rows), a 12-token one (the sparse batch path)
  // and single tokens (the fused decode), in predictor and oracle mode, on 1 and 3 threads.
  const std::string path = powerinfer_path("bundled");
  auto in_file = load_model(path);
  auto bundled = load_model(path);
  repack_for_dense_kernels(*in_file, RepackScope::attention_output, ResidentWeights::in_file);
  const RepackStats st = repack_for_dense_kernels(*bundled, RepackScope::attention_output, ResidentWeights::copy);
  ASSERT_EQ(st.bundled_layers, bundled->hp.n_layer);
  ASSERT_FALSE(bundled->layers[0].ffn.up.contiguous());
  for (SimdLevel level : test_support::simd_levels()) {
    test_support::SimdGuard guard;
    set_simd_level(level);
    for (FfnMode mode : {FfnMode::predictor, FfnMode::oracle})
      for (int threads : {1, 3})
        for (int64_t prompt : {20, 12}) {
          const auto run = [&](const Model& m) {
            SessionParams p;
            p.n_threads = threads;
            p.n_ctx = 64;
            p.sparse.mode = mode;
            Session s(m, p);
            return test_support::session_logits(s, prompt, 4);
          };
          EXPECT_EQ(test_support::max_rel_diff(run(*in_file), run(*bundled)), 0.0)
              << simd_level_name(level) << " " << ffn_mode_name(mode) << " " << threads << " threads, prompt "
              << prompt;
        }
  }
  // The bytes the sparse path reports reading count each row's own bytes, not the bundle's.
  double bytes[2];
  for (int i = 0; i < 2; ++i) {
    SessionParams p;
    p.n_ctx = 64;
    p.sparse.mode = FfnMode::predictor;
    Session s(i ? *bundled : *in_file, p);
    test_support::session_logits(s, 4, 4);
    bytes[i] = s.sparse_ffn()->weight_bytes_per_token();
  }
  EXPECT_GT(bytes[0], 0.0);
  EXPECT_EQ(bytes[0], bytes[1]);
  std::filesystem::remove(path);
}

TEST(Repack, NothingToRepackStillCopiesWhenAsked) {
  SynthOptions o = q4_0_model(FfnActivation::silu, false);
  o.type = DType::F16;  // no repacked layout
  const std::string path = synth_path(o, "f16_resident");
  auto m = load_model(path);
  auto plain = load_model(path);
  const RepackStats st = repack_for_dense_kernels(*m, RepackScope::all, ResidentWeights::copy);
  EXPECT_EQ(st.tensors, 0);
  EXPECT_EQ(st.copied_tensors, 7 * m->hp.n_layer + 1);
  EXPECT_TRUE(owned(*m, m->layers[0].ffn.down));
  EXPECT_FALSE(owned(*m, m->tok_embd));  // untied: looked up a row per token, stays in the file
  const Logits a = test_support::run_ffn_mode(*plain, FfnMode::dense, 2);
  const Logits b = test_support::run_ffn_mode(*m, FfnMode::dense, 2);
  EXPECT_EQ(test_support::max_rel_diff(a, b), 0.0);
  std::filesystem::remove(path);
}

TEST(Repack, CopiesStayInTheFileWhenMemoryIsShort) {
  const std::string path = powerinfer_path("short_memory");
  auto m = load_model(path);
  const uint8_t* up = m->layers[0].ffn.up.data;
  // A budget of one byte: nothing is copied, the repacking (which the dense kernels need) still
  // happens.
  const RepackStats st = repack_for_dense_kernels(*m, RepackScope::attention_output, ResidentWeights::copy, 1);
  EXPECT_EQ(st.copied_tensors, 0);
  EXPECT_GT(st.copy_skipped_bytes, 0u);
  EXPECT_EQ(m->layers[0].ffn.up.data, up);
  EXPECT_EQ(st.tensors, cpu::r16_pays(DType::Q4_0) ? 4 * m->hp.n_layer + 1 : 0);
  // A budget that holds everything: copied.
  auto m2 = load_model(path);
  const RepackStats st2 =
      repack_for_dense_kernels(*m2, RepackScope::attention_output, ResidentWeights::copy, size_t{1} << 40);
  EXPECT_GT(st2.copied_tensors, 0);
  EXPECT_EQ(st2.copy_skipped_bytes, 0u);
  // A model larger than its memory budget (Model::resident_weight_budget): no copies, and the
  // repacked matrices, in order, within three quarters of it; the others keep the file's layout.
  auto m3 = load_model(path);
  size_t attention = 0;
  for (const LayerWeights& l : m3->layers) attention += l.wq.nbytes + l.wk.nbytes + l.wv.nbytes + l.wo.nbytes;
  m3->resident_weight_budget = attention / 2;
  const TensorView last_wo = m3->layers.back().wo;
  const RepackStats st3 =
      repack_for_dense_kernels(*m3, RepackScope::attention_output, ResidentWeights::copy, m3->resident_weight_budget);
  EXPECT_EQ(st3.copied_tensors, 0);
  if (cpu::r16_pays(DType::Q4_0)) {
    EXPECT_GT(st3.tensors, 0);
    EXPECT_LE(st3.bytes, m3->resident_weight_budget / 4 * 3);
    EXPECT_GT(st3.repack_skipped_bytes, 0u);
    EXPECT_EQ(m3->layers.back().wo.data, last_wo.data) << "the last layer's attention stays in the file";
    EXPECT_EQ(m3->layers.back().wo.type, last_wo.type);
  }
  std::filesystem::remove(path);
}
