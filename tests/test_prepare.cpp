// `ember prepare` (src/sparse/prepare.*, reorder.*): the reordered, neuron-major, predictor- and
// threshold-carrying model gives the original's logits (dense and oracle), the permutation is
// hot first and stable, per-neuron tensors move together, and bad inputs get clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "core/error.hpp"
#include "engine/session.hpp"
#include "gguf/copy.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "support/errors.hpp"
#include "sparse/prepare.hpp"
#include "sparse/reorder.hpp"
#include "tensor/quant.hpp"

using namespace ember;
using test_support::error_of;

namespace {

std::filesystem::path dir() {
  auto d = std::filesystem::temp_directory_path() / "ember-test-prepare";
  std::filesystem::create_directories(d);
  return d;
}

std::string p(const std::string& name) { return (dir() / name).string(); }

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A profile in the agreed format: integer counts 0..9 (many ties) and increasing quantiles; with
// `orders`, each layer's clustered order (any permutation: a layer's given one).
std::string write_profile(int64_t n_layer, int64_t n_ff, const std::string& name, bool quantiles = true,
                          const std::vector<std::vector<int32_t>>& orders = {}) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("ember-profile"));
  w.set("ember.profile.n_layer", gguf::Value::u64(static_cast<uint64_t>(n_layer)));
  w.set("ember.profile.n_ff", gguf::Value::u64(static_cast<uint64_t>(n_ff)));
  w.set("ember.profile.n_tokens", gguf::Value::u64(100));
  w.set("ember.profile.threshold", gguf::Value::f32(0.0f));
  std::mt19937 rng(4);
  for (int64_t il = 0; il < n_layer; ++il) {
    std::vector<float> c(static_cast<size_t>(n_ff));
    for (auto& x : c) x = static_cast<float>(rng() % 10);
    w.add_tensor(fmt::format("blk.{}.ffn_act_count", il), DType::F32, {n_ff}, f32_bytes(c));
    if (quantiles) {
      std::vector<float> q(1001);
      for (int k = 0; k < 1001; ++k) q[k] = 0.01f * static_cast<float>(k) * static_cast<float>(il + 1);
      w.add_tensor(fmt::format("blk.{}.ffn_gate_quantiles", il), DType::F32, {1001}, f32_bytes(q));
    }
    if (!orders.empty()) {
      std::vector<uint8_t> b(static_cast<size_t>(n_ff) * 4);
      std::memcpy(b.data(), orders[static_cast<size_t>(il)].data(), b.size());
      w.add_tensor(fmt::format("blk.{}.ffn_cluster_order", il), DType::I32, {n_ff}, std::move(b));
    }
  }
  const std::string path = p(name);
  w.write(path);
  return path;
}

std::string write_predictor(int64_t n_layer, int64_t n_embd, int64_t n_ff, int64_t rank, const std::string& name) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("ember-predictor"));
  w.set("ember.predictor.n_layer", gguf::Value::u64(static_cast<uint64_t>(n_layer)));
  w.set("powerinfer.sparse_threshold", gguf::Value::f32(0.5f));
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  for (int64_t il = 0; il < n_layer; ++il) {
    std::vector<float> a(static_cast<size_t>(n_embd * rank)), b(static_cast<size_t>(rank * n_ff));
    for (auto& x : a) x = nd(rng);
    for (auto& x : b) x = nd(rng);
    w.add_tensor(fmt::format("blk.{}.fc1.weight", il), DType::F32, {n_embd, rank}, f32_bytes(a));
    w.add_tensor(fmt::format("blk.{}.fc2.weight", il), DType::F32, {rank, n_ff}, f32_bytes(b));
  }
  const std::string path = p(name);
  w.write(path);
  return path;
}

SynthOptions model_options(const std::string& arch, DType type) {
  SynthOptions o;
  o.arch = arch;
  o.act = FfnActivation::relu;
  o.type = type;
  o.n_embd = 64;
  o.n_ff = 160;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_head_kv = arch == "opt" ? 4 : 2;
  o.tied = arch == "opt";
  o.sparsity = 0.7f;
  if (arch == "gemma3") o.act = FfnActivation::silu, o.sparsity = 0.0f;  // GeGLU: no ReLU profile
  o.seed = 5;
  o.n_threads = 1;
  return o;
}

std::vector<float> logits(const Model& m, FfnMode mode) {
  SessionParams sp;
  sp.n_threads = 2;
  sp.n_ctx = 32;
  sp.sparse.mode = mode;
  Session s(m, sp);
  std::vector<int32_t> toks = {5, 77, 260, 31, 199, 12, 3, 150, 42};
  const int64_t nv = m.hp.n_vocab;
  std::vector<float> all(6 * nv), out;
  s.eval_all_logits(toks.data(), 6, all.data());
  out = all;
  for (size_t t = 6; t < toks.size(); ++t) {
    s.eval(&toks[t], 1);
    out.insert(out.end(), s.logits(), s.logits() + nv);
  }
  return out;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
    m = std::max(m, static_cast<double>(std::fabs(b[i])));
  }
  return d / m;
}

}  // namespace

TEST(Reorder, HotFirstIsStableAndRoundTrips) {
  const std::vector<float> counts = {3, 9, 3, 0, 9, 1, 3};
  const auto perm = hot_first_permutation(counts.data(), 7);
  EXPECT_EQ(perm, (std::vector<int32_t>{1, 4, 0, 2, 6, 5, 3}));  // ties keep their order
  EXPECT_TRUE(is_permutation(perm, 7));
  EXPECT_FALSE(is_permutation({0, 0, 1}, 3));
  EXPECT_FALSE(is_permutation({0, 3, 1}, 3));
  const auto inv = inverse_permutation(perm);
  for (int32_t i = 0; i < 7; ++i) EXPECT_EQ(perm[inv[i]], i);

  // Rows of a quantized matrix permuted, then permuted back by the inverse: the same bytes.
  const int64_t cols = 64, rows = 7;
  std::vector<float> f(cols * rows);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& x : f) x = nd(rng);
  std::vector<uint8_t> q(row_bytes(DType::Q4_0, cols) * rows);
  for (int64_t r = 0; r < rows; ++r) quantize_row(DType::Q4_0, f.data() + r * cols, q.data() + r * row_bytes(DType::Q4_0, cols), cols);
  TensorView t;
  t.name = "w";
  t.type = DType::Q4_0;
  t.n_dims = 2;
  t.ne[0] = cols;
  t.ne[1] = rows;
  t.data = q.data();
  t.nbytes = q.size();
  std::vector<uint8_t> a = permute_rows(t, perm);
  EXPECT_EQ(0, std::memcmp(a.data(), q.data() + 1 * t.row_stride(), t.row_stride()));  // new row 0 = old row 1
  TensorView ta = t;
  ta.data = a.data();
  std::vector<uint8_t> back = permute_rows(ta, inv);
  EXPECT_EQ(back, q);
  EXPECT_NE(error_of([&] { permute_rows(t, {0, 1}); }).find("does not fit"), std::string::npos);
}

TEST(Reorder, ThresholdInterpolatesTheQuantiles) {
  std::vector<float> q(1001);
  for (int k = 0; k < 1001; ++k) q[k] = static_cast<float>(k * k);
  EXPECT_FLOAT_EQ(threshold_from_quantiles(q.data(), 0.5f), 250000.0f);
  EXPECT_NEAR(threshold_from_quantiles(q.data(), 0.9005f), 0.5f * (900 * 900 + 901 * 901), 1.0f);
  EXPECT_FLOAT_EQ(threshold_from_quantiles(q.data(), 1.0f), 1e6f);
}

class Prepare : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(Prepare, SameLogitsDenseAndOracle) {
  const auto [arch, type] = GetParam();
  const std::string tag = fmt::format("{}_{}", arch, dtype_name(type));
  const SynthOptions so = model_options(arch, type);
  const std::string src = p(tag + ".gguf");
  synth_write(so, src);
  const std::string prof = write_profile(so.n_layer, so.n_ff, tag + ".profile.gguf");
  const std::string pred = write_predictor(so.n_layer, so.n_embd, so.n_ff, 32, tag + ".pred.gguf");
  PrepareOptions po;
  po.model = src;
  po.profile = prof;
  po.predictor = pred;
  po.sparsity = 0.5f;
  po.output = p(tag + ".sparse.gguf");
  po.n_threads = 2;
  const PrepareSummary s = prepare_sparse_model(po);
  EXPECT_EQ(s.down_t_type, type);
  EXPECT_EQ(s.predictor_rank, 32);

  auto orig = load_model(src);
  auto prep = load_model(po.output);
  EXPECT_TRUE(prep->file->is_powerinfer());
  EXPECT_EQ(prep->hp.arch, arch);
  EXPECT_FLOAT_EQ(prep->predictor_threshold, 0.5f);
  ASSERT_EQ(prep->gate_thresholds.size(), 2u);
  EXPECT_FLOAT_EQ(prep->gate_thresholds[0], 5.0f);   // quantile 500 of layer 0: 0.01 * 500
  EXPECT_FLOAT_EQ(prep->gate_thresholds[1], 10.0f);
  // The permutations: hot first by the profile's counts.
  const auto flat = prep->file->get_int_array("ember.sparse.permutation");
  ASSERT_EQ(static_cast<int64_t>(flat.size()), so.n_layer * so.n_ff);
  gguf::Reader pr(prof), pd(pred);
  for (int64_t il = 0; il < so.n_layer; ++il) {
    std::vector<int32_t> perm(flat.begin() + il * so.n_ff, flat.begin() + (il + 1) * so.n_ff);
    EXPECT_TRUE(is_permutation(perm, so.n_ff));
    const float* c = reinterpret_cast<const float*>(pr.view(fmt::format("blk.{}.ffn_act_count", il)).data);
    EXPECT_EQ(perm, hot_first_permutation(c, so.n_ff));
    const auto& F = prep->layers[il].ffn;
    EXPECT_FALSE(F.down.valid());
    ASSERT_TRUE(F.down_t.valid());
    // Per-neuron rows moved together: up row i = original up row perm[i]; fc2 likewise.
    const auto& O = orig->layers[il].ffn;
    const TensorView f2 = pd.view(fmt::format("blk.{}.fc2.weight", il));
    for (int64_t i : {int64_t{0}, so.n_ff / 2, so.n_ff - 1}) {
      EXPECT_EQ(0, std::memcmp(F.up.row(i), O.up.row(perm[i]), O.up.row_stride()));
      EXPECT_EQ(0, std::memcmp(F.fc2.row(i), f2.row(perm[i]), f2.row_stride()));
    }
  }
  // Same function: float types to rounding; quantized down_t is requantized neuron-major.
  const double tol = type == DType::F32 ? 1e-5 : 0.03;
  const auto base = logits(*orig, FfnMode::dense);
  const double rd = rel(logits(*prep, FfnMode::dense), base), ro = rel(logits(*prep, FfnMode::oracle), base);
  std::printf("%s: prepared vs original: dense %.2e, oracle %.2e\n", tag.c_str(), rd, ro);
  EXPECT_LT(rd, tol);
  EXPECT_LT(ro, tol);

  // Preparing the prepared file again (its own down_t and predictor, same profile) keeps the
  // logits: a permutation of a permutation.
  PrepareOptions again = po;
  again.model = po.output;
  again.predictor.clear();
  again.sparsity = -1.0f;
  again.output = p(tag + ".sparse2.gguf");
  const PrepareSummary s2 = prepare_sparse_model(again);
  EXPECT_FALSE(s2.down_t_from_down);
  EXPECT_EQ(s2.predictor_rank, 32);
  auto prep2 = load_model(again.output);
  EXPECT_LT(rel(logits(*prep2, FfnMode::dense), base), tol);
  for (const auto& f : {src, prof, pred, po.output, again.output}) std::filesystem::remove(f);
}

// --bundle: each gated layer's gate, up and down_t rows in one row of blk.N.ffn_bundle (padded to
// whole pages where that wastes at most a quarter), bound as strided views: the logits of the
// unbundled prepared file, bit for bit, in every mode; each neuron's profile frequency kept, hot
// first. An FFN without a gate (OPT) is refused by name.
TEST_P(Prepare, BundledRowsGiveTheUnbundledLogits) {
  const auto [arch, type] = GetParam();
  const std::string tag = fmt::format("{}_{}_bundle", arch, dtype_name(type));
  const SynthOptions so = model_options(arch, type);
  const std::string src = p(tag + ".gguf");
  synth_write(so, src);
  PrepareOptions po;
  po.model = src;
  po.profile = write_profile(so.n_layer, so.n_ff, tag + ".profile.gguf");
  po.predictor = write_predictor(so.n_layer, so.n_embd, so.n_ff, 32, tag + ".pred.gguf");
  po.n_threads = 2;
  po.output = p(tag + ".plain.gguf");
  prepare_sparse_model(po);
  PrepareOptions pb = po;
  pb.bundle = true;
  pb.output = p(tag + ".bundled.gguf");
  if (arch == "opt") {
    EXPECT_NE(error_of([&] { prepare_sparse_model(pb); }).find("no separate ffn_gate and ffn_up"), std::string::npos);
  } else {
    EXPECT_TRUE(prepare_sparse_model(pb).bundle);
    auto plain = load_model(po.output), bundled = load_model(pb.output);
    const auto& F = bundled->layers[0].ffn;
    const size_t row = row_bytes(type, so.n_embd);
    EXPECT_GE(F.up.row_stride(), 3 * row);
    EXPECT_EQ(F.up.data, F.gate.data + row);
    EXPECT_EQ(F.down_t.data, F.up.data + row);
    EXPECT_EQ(0, std::memcmp(F.down_t.row(5), plain->layers[0].ffn.down_t.row(5), row));
    for (FfnMode mode : {FfnMode::dense, FfnMode::oracle, FfnMode::predictor})
      EXPECT_EQ(logits(*bundled, mode), logits(*plain, mode)) << "mode " << static_cast<int>(mode);
    ASSERT_EQ(static_cast<int64_t>(bundled->neuron_freq.size()), so.n_layer * so.n_ff);
    for (int64_t il = 0; il < so.n_layer; ++il)
      for (int64_t i = 1; i < so.n_ff; ++i)
        EXPECT_LE(bundled->neuron_freq[il * so.n_ff + i], bundled->neuron_freq[il * so.n_ff + i - 1]);
    // A bundle whose type the file does not name is refused by name.
    {
      gguf::Reader br(pb.output);
      gguf::Writer nw(br.alignment());
      for (const std::string& k : br.keys())
        if (k != kFfnBundleTypeKey) nw.set(k, br.metadata().at(k));
      for (const gguf::TensorInfo& t : br.tensors()) gguf::add_tensor_copy(nw, br, t);
      const std::string bad = p(tag + ".notype.gguf");
      nw.write(bad);
      EXPECT_NE(error_of([&] { load_model(bad); }).find("needs ember.sparse.bundle_type to name a weight type"),
                std::string::npos);
      std::filesystem::remove(bad);
    }
    // Preparing the bundled file again keeps it bundled.
    PrepareOptions again = pb;
    again.model = pb.output;
    again.predictor.clear();
    again.bundle = false;
    again.output = p(tag + ".again.gguf");
    EXPECT_TRUE(prepare_sparse_model(again).bundle);
    EXPECT_EQ(logits(*load_model(again.output), FfnMode::dense).size(), logits(*plain, FfnMode::dense).size());
    std::filesystem::remove(again.output);
  }
  for (const auto& f : {src, po.profile, po.predictor, po.output, pb.output}) std::filesystem::remove(f);
}

INSTANTIATE_TEST_SUITE_P(Models, Prepare,
                         ::testing::Values(std::make_tuple(std::string("llama"), DType::F32),
                                           std::make_tuple(std::string("bamboo"), DType::F32),
                                           std::make_tuple(std::string("opt"), DType::F32),
                                           std::make_tuple(std::string("gemma3"), DType::F32),
                                           std::make_tuple(std::string("llama"), DType::Q8_0)),
                         [](const auto& info) {
                           return fmt::format("{}_{}", std::get<0>(info.param), dtype_name(std::get<1>(info.param)));
                         });

// A profile's clustered orders (sparse/cofire.hpp) are the prepared file's layout: its permutations,
// its frequencies in that order, the same logits; --no-cluster keeps strict hot-first order; an
// order that is not a permutation is refused naming its tensor.
TEST(Prepare, NeuronsLaidOutInTheProfilesClusteredOrder) {
  const SynthOptions so = model_options("llama", DType::F32);
  const std::string src = p("cluster.gguf");
  synth_write(so, src);
  std::vector<std::vector<int32_t>> orders(static_cast<size_t>(so.n_layer));
  std::mt19937 rng(9);
  for (auto& o : orders) {
    o.resize(static_cast<size_t>(so.n_ff));
    std::iota(o.begin(), o.end(), 0);
    std::shuffle(o.begin(), o.end(), rng);
  }
  PrepareOptions po;
  po.model = src;
  po.profile = write_profile(so.n_layer, so.n_ff, "cluster.profile.gguf", true, orders);
  po.bundle = true;
  po.n_threads = 2;
  po.output = p("cluster.prepared.gguf");
  EXPECT_TRUE(prepare_sparse_model(po).clustered);
  auto orig = load_model(src), prep = load_model(po.output);
  const auto flat = prep->file->get_int_array("ember.sparse.permutation");
  gguf::Reader pr(po.profile);
  for (int64_t il = 0; il < so.n_layer; ++il) {
    EXPECT_TRUE(std::equal(orders[il].begin(), orders[il].end(), flat.begin() + il * so.n_ff));
    const float* c = reinterpret_cast<const float*>(pr.view(fmt::format("blk.{}.ffn_act_count", il)).data);
    for (int64_t i = 0; i < so.n_ff; ++i)
      EXPECT_FLOAT_EQ(prep->neuron_freq[il * so.n_ff + i], c[orders[il][i]] / 100.0f);
  }
  EXPECT_LT(rel(logits(*prep, FfnMode::dense), logits(*orig, FfnMode::dense)), 1e-5);

  PrepareOptions plain = po;
  plain.cluster = false;
  plain.output = p("cluster.plain.gguf");
  EXPECT_FALSE(prepare_sparse_model(plain).clustered);
  const auto hf = load_model(plain.output)->file->get_int_array("ember.sparse.permutation");
  const float* c0 = reinterpret_cast<const float*>(pr.view("blk.0.ffn_act_count").data);
  const std::vector<int32_t> want = hot_first_permutation(c0, so.n_ff);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), hf.begin()));

  orders[1][3] = orders[1][4];
  PrepareOptions bad = po;
  bad.profile = write_profile(so.n_layer, so.n_ff, "cluster.bad.gguf", true, orders);
  bad.output = p("cluster.bad.prepared.gguf");
  EXPECT_NE(error_of([&] { prepare_sparse_model(bad); }).find("blk.1.ffn_cluster_order is not an order"),
            std::string::npos);
  for (const auto& f : {src, po.profile, po.output, plain.output, bad.profile}) std::filesystem::remove(f);
}

// A llama GGUF from llama.cpp's converter (SmolLM2, any SwiGLU llama) has no
// llama.ffn_activation: SiLU for a plain GGUF, while PowerInfer's reading, which Ember follows,
// makes every llama in a PWRI file ReLU. The prepared (PWRI) file must say SiLU, or the model
// comes back as another function (SmolLM2 prepared went from perplexity 39 to 4500).
TEST(Prepare, SiluLlamaWithoutTheActivationKeyStaysSilu) {
  SynthOptions so = model_options("llama", DType::F32);
  so.act = FfnActivation::silu;
  so.sparsity = 0.0f;
  const std::string synth = p("silu-with-key.gguf"), src = p("silu.gguf");
  synth_write(so, synth);
  {  // the same file without Ember's key, as converters write it
    gguf::Reader r(synth);
    gguf::Writer w(r.alignment());
    for (const std::string& k : r.keys())
      if (k != "llama.ffn_activation") w.set(k, r.metadata().at(k));
    for (const gguf::TensorInfo& t : r.tensors()) {
      const TensorView v = r.view(t);
      w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                   std::vector<uint8_t>(v.data, v.data + v.nbytes));
    }
    w.write(src);
  }
  PrepareOptions po;
  po.model = src;
  po.profile = write_profile(so.n_layer, so.n_ff, "silu.profile.gguf");
  po.sparsity = 0.5f;
  po.output = p("silu.sparse.gguf");
  po.n_threads = 2;
  prepare_sparse_model(po);
  auto orig = load_model(src);
  auto prep = load_model(po.output);
  EXPECT_EQ(orig->hp.act, cpu::Activation::silu);
  EXPECT_EQ(prep->hp.act, cpu::Activation::silu);
  EXPECT_EQ(prep->file->get_string("llama.ffn_activation"), "silu");
  EXPECT_LT(rel(logits(*prep, FfnMode::dense), logits(*orig, FfnMode::dense)), 1e-5);
  for (const auto& f : {synth, src, po.profile, po.output}) std::filesystem::remove(f);
}

TEST(Prepare, BadInputsGetClearErrors) {
  const SynthOptions so = model_options("llama", DType::F32);
  const std::string src = p("bad-src.gguf");
  synth_write(so, src);
  PrepareOptions po;
  po.model = src;
  po.output = p("bad-out.gguf");
  // A profile of another model (other n_ff).
  po.profile = write_profile(so.n_layer, so.n_ff + 32, "other.profile.gguf");
  EXPECT_NE(error_of([&] { prepare_sparse_model(po); }).find("another model"), std::string::npos);
  // Not a profile at all.
  po.profile = src;
  EXPECT_NE(error_of([&] { prepare_sparse_model(po); }).find("not a profile"), std::string::npos);
  // --sparsity with a profile without quantiles.
  po.profile = write_profile(so.n_layer, so.n_ff, "noq.profile.gguf", false);
  po.sparsity = 0.5f;
  EXPECT_NE(error_of([&] { prepare_sparse_model(po); }).find("gate quantiles"), std::string::npos);
  po.sparsity = -1.0f;
  // A predictor of another width.
  po.predictor = write_predictor(so.n_layer, so.n_embd, so.n_ff + 32, 32, "other.pred.gguf");
  EXPECT_NE(error_of([&] { prepare_sparse_model(po); }).find("another model"), std::string::npos);
  // Overwriting the input.
  po.predictor.clear();
  po.output = src;
  EXPECT_NE(error_of([&] { prepare_sparse_model(po); }).find("overwrite"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(p("bad-out.gguf")));
  for (const auto& f : {src, p("other.profile.gguf"), p("noq.profile.gguf"), p("other.pred.gguf")}) std::filesystem::remove(f);
}
