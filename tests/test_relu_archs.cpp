// ReLU-family architectures and PowerInfer's file layout: Bamboo (ReLU on gate and up), OPT
// (LayerNorm, learned positions, biases, no gate) and ReLU llama, each as a plain GGUF and in
// PowerInfer's layout (PWRI magic, neuron-major ffn_down_t instead of ffn_down, predictor
// fc1/fc2). Forward passes against independent double-precision references, PowerInfer file ==
// plain file, oracle == dense, and the loader's checks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "core/error.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"
#include "engine/session.hpp"
#include "model/ffn.hpp"
#include "model/forward.hpp"
#include "model/model.hpp"
#include "ops/cpu/matmul.hpp"
#include "synth/synth.hpp"
#include "support/errors.hpp"
#include "support/reference_llama.hpp"
#include "support/reference_opt.hpp"

using namespace ember;
using test_support::error_of;

namespace {

struct ArchCase {
  std::string arch;  // llama (ReLU), bamboo, opt
  bool powerinfer;
  DType type;
};

std::string case_name(const ArchCase& c) {
  return fmt::format("{}_{}_{}", c.arch, c.powerinfer ? "pwri" : "gguf", dtype_name(c.type));
}

std::filesystem::path test_dir() {
  auto dir = std::filesystem::temp_directory_path() / "ember-test-relu-archs";
  std::filesystem::create_directories(dir);
  return dir;
}

SynthOptions options(const ArchCase& c, float sparsity = 0.0f) {
  SynthOptions o;
  o.arch = c.arch;
  o.act = FfnActivation::relu;
  o.powerinfer = c.powerinfer;
  o.type = c.type;
  o.n_embd = 64;
  o.n_ff = 192;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_head_kv = c.arch == "opt" ? 4 : 2;
  o.tied = c.arch == "opt";
  o.sparsity = sparsity;
  o.seed = 21;
  o.n_threads = 1;
  return o;
}

std::string write(const SynthOptions& o, const std::string& name) {
  std::string path = (test_dir() / (name + ".gguf")).string();
  synth_write(o, path);
  return path;
}

std::vector<int32_t> tokens_for(const Model& m, size_t n) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(m.hp.n_vocab - 1));
  std::vector<int32_t> t(n);
  for (auto& x : t) x = pick(rng);
  return t;
}

struct SparseInfo {
  double sparsity = 0;
  size_t neuron_major_bytes = 0;
};

// Logits of a 7-token batched prompt, then 3 single tokens on the KV cache.
std::vector<std::vector<float>> run(const Model& m, FfnMode mode, int threads, SparseInfo* info = nullptr) {
  SessionParams p;
  p.n_threads = threads;
  p.n_ctx = 64;
  p.sparse.mode = mode;
  Session s(m, p);
  const auto tokens = tokens_for(m, 10);
  const int64_t nv = m.hp.n_vocab;
  std::vector<float> all(7 * nv);
  s.eval_all_logits(tokens.data(), 7, all.data());
  std::vector<std::vector<float>> out;
  for (int64_t t = 0; t < 7; ++t) out.emplace_back(all.begin() + t * nv, all.begin() + (t + 1) * nv);
  for (int64_t t = 7; t < 10; ++t) {
    s.eval(&tokens[t], 1);
    out.emplace_back(s.logits(), s.logits() + nv);
  }
  if (info && s.sparse_ffn()) {
    info->sparsity = s.sparse_ffn()->stats().sparsity();
    info->neuron_major_bytes = s.sparse_ffn()->neuron_major_bytes();
  }
  return out;
}

double rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<double>>& ref) {
  double d = 0, m = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t i = 0; i < a[t].size(); ++i) {
      d = std::max(d, std::fabs(a[t][i] - ref[t][i]));
      m = std::max(m, std::fabs(ref[t][i]));
    }
  EXPECT_GT(m, 0.1) << "degenerate logits";
  return d / m;
}

std::vector<std::vector<double>> to_double(const std::vector<std::vector<float>>& a) {
  std::vector<std::vector<double>> out;
  for (const auto& r : a) out.emplace_back(r.begin(), r.end());
  return out;
}

}  // namespace

class ReluArchs : public ::testing::TestWithParam<ArchCase> {};

TEST_P(ReluArchs, LogitsMatchDoublePrecisionReference) {
  const ArchCase c = GetParam();
  const std::string path = write(options(c), case_name(c));
  auto m = load_model(path);
  EXPECT_EQ(m->hp.arch, c.arch);
  EXPECT_EQ(m->hp.act, cpu::Activation::relu);
  EXPECT_EQ(m->file->is_powerinfer(), c.powerinfer);
  for (const auto& L : m->layers) {
    EXPECT_EQ(L.ffn.down.valid(), !c.powerinfer);
    EXPECT_EQ(L.ffn.down_t.valid(), c.powerinfer);
    EXPECT_EQ(L.ffn.fc1.valid(), c.powerinfer);
    EXPECT_EQ(L.ffn.gating, c.arch == "opt" ? FfnGating::none : c.arch == "bamboo" ? FfnGating::sym : FfnGating::par);
  }
  const auto tokens = tokens_for(*m, 10);
  const auto ref = c.arch == "opt" ? test_support::reference_opt_logits(*m, tokens)
                                   : test_support::reference_llama_logits(*m, tokens);
  const double rel = rel_diff(run(*m, FfnMode::dense, 2), ref);
  std::printf("%s: max |logit - reference| / max |logit| = %.2e\n", case_name(c).c_str(), rel);
  // Float weights: rounding only. Quantized: 8-bit activations of the dense kernels.
  EXPECT_LT(rel, c.type == DType::F32 ? 1e-5 : 0.04);
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, ReluArchs,
    ::testing::Values(ArchCase{"llama", false, DType::F32}, ArchCase{"llama", true, DType::F32},
                      ArchCase{"bamboo", false, DType::F32}, ArchCase{"bamboo", true, DType::F32},
                      ArchCase{"opt", false, DType::F32}, ArchCase{"opt", true, DType::F32},
                      ArchCase{"bamboo", true, DType::Q8_0}, ArchCase{"opt", false, DType::Q4_0},
                      ArchCase{"llama", true, DType::Q4_0}),
    [](const ::testing::TestParamInfo<ArchCase>& info) { return case_name(info.param); });

// The PowerInfer file holds the same matrices as the plain one (down transposed): same logits.
TEST(ReluArchs, PowerInferLayoutGivesThePlainFilesLogits) {
  for (const std::string arch : {"llama", "bamboo", "opt"}) {
    const std::string a = write(options({arch, false, DType::F32}), arch + "-plain");
    const std::string b = write(options({arch, true, DType::F32}), arch + "-pwri");
    auto ma = load_model(a), mb = load_model(b);
    const double rel = rel_diff(run(*mb, FfnMode::dense, 2), to_double(run(*ma, FfnMode::dense, 2)));
    std::printf("%s: PWRI vs GGUF max rel diff %.2e\n", arch.c_str(), rel);
    EXPECT_LT(rel, 1e-5) << arch;
    std::filesystem::remove(a);
    std::filesystem::remove(b);
  }
}

// Oracle sparsity is exact for ReLU: oracle == dense, for every architecture and layout; the
// PowerInfer file's down_t is used as it is (no neuron-major copy).
TEST(ReluArchs, OracleMatchesDense) {
  for (const std::string arch : {"llama", "bamboo", "opt"}) {
    for (bool pwri : {false, true}) {
      const ArchCase c{arch, pwri, DType::F32};
      SynthOptions o = options(c, 0.8f);
      o.n_embd = 128, o.n_ff = 352;
      const std::string path = write(o, case_name(c) + "-profile");
      auto m = load_model(path);
      const auto dense = run(*m, FfnMode::dense, 2);
      SparseInfo info;
      const auto oracle = run(*m, FfnMode::oracle, 2, &info);
      const double sparsity = info.sparsity;
      const double rel = rel_diff(oracle, to_double(dense));
      std::printf("%s: oracle vs dense %.2e, sparsity %.3f\n", case_name(c).c_str(), rel, sparsity);
      EXPECT_LT(rel, 1e-5) << case_name(c);
      EXPECT_NEAR(sparsity, 0.8, 0.12) << case_name(c);
      if (pwri) EXPECT_EQ(info.neuron_major_bytes, 0u) << case_name(c);
      else EXPECT_GT(info.neuron_major_bytes, 0u) << case_name(c);
      std::filesystem::remove(path);
    }
  }
}

TEST(ReluArchs, PowerInferMetadataAndPredictorShapes) {
  SynthOptions o = options({"llama", true, DType::F16});
  o.predictor_rank = 48;
  o.predictor_threshold = 0.25f;
  const std::string path = write(o, "meta");
  auto m = load_model(path);
  EXPECT_TRUE(m->file->is_powerinfer());
  EXPECT_FLOAT_EQ(m->predictor_threshold, 0.25f);
  for (const auto& L : m->layers) {
    EXPECT_EQ(L.ffn.fc1.cols(), 64);
    EXPECT_EQ(L.ffn.fc1.rows(), 48);
    EXPECT_EQ(L.ffn.fc2.cols(), 48);
    EXPECT_EQ(L.ffn.fc2.rows(), 192);
    EXPECT_EQ(L.ffn.fc1.type, DType::F16);  // PowerInfer's converter: F16 predictors
    EXPECT_EQ(L.ffn.down_t.cols(), 64);
    EXPECT_EQ(L.ffn.down_t.rows(), 192);
  }
  std::filesystem::remove(path);
  // Q4_0 files carry Q4_0 predictors (PowerInfer's quantizer), which need a rank of whole blocks.
  SynthOptions q = options({"llama", true, DType::Q4_0});
  q.predictor_rank = 48;
  EXPECT_NE(error_of([&] { validate(q); }).find("multiple of 32"), std::string::npos);
}

TEST(ReluArchs, LoaderNamesBadSparseTensors) {
  const SynthOptions o = options({"llama", false, DType::F32});
  auto with = [&](const std::function<void(gguf::Writer&)>& edit) {
    gguf::Writer w = synth_model(o);
    edit(w);
    const std::string path = (test_dir() / "bad.gguf").string();
    w.write(path);
    std::string e = error_of([&] { load_model(path); });
    std::filesystem::remove(path);
    return e;
  };
  auto zeros = [](DType t, int64_t ne0, int64_t ne1) {
    return std::vector<uint8_t>(row_bytes(t, ne0) * static_cast<size_t>(ne1), 0);
  };
  std::string e = with([&](gguf::Writer& w) { w.add_tensor("blk.1.fc1.weight", DType::F32, {64, 32}, zeros(DType::F32, 64, 32)); });
  EXPECT_NE(e.find("blk.1.fc2.weight"), std::string::npos) << e;
  e = with([&](gguf::Writer& w) {
    w.add_tensor("blk.0.fc1.weight", DType::F32, {64, 32}, zeros(DType::F32, 64, 32));
    w.add_tensor("blk.0.fc2.weight", DType::F32, {16, 192}, zeros(DType::F32, 16, 192));
  });
  EXPECT_NE(e.find("blk.0.fc2.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("expected [32, 192]"), std::string::npos) << e;
  e = with([&](gguf::Writer& w) { w.add_tensor("blk.0.ffn_down_t.weight", DType::F32, {192, 64}, zeros(DType::F32, 192, 64)); });
  EXPECT_NE(e.find("ffn_down_t"), std::string::npos) << e;
  EXPECT_NE(e.find("expected [64, 192]"), std::string::npos) << e;
  e = with([&](gguf::Writer& w) { w.set("ember.sparse.thresholds", gguf::Value::floats({0.1f})); });
  EXPECT_NE(e.find("ember.sparse.thresholds has 1 values"), std::string::npos) << e;
}

TEST(ReluArchs, SynthRejectsImpossibleCombinations) {
  SynthOptions o = options({"opt", false, DType::F32});
  o.act = FfnActivation::silu;
  EXPECT_NE(error_of([&] { validate(o); }).find("ReLU architecture"), std::string::npos);
  o = options({"llama", true, DType::F32});
  o.arch = "gemma3";
  EXPECT_NE(error_of([&] { validate(o); }).find("no gemma3"), std::string::npos);
  o = options({"opt", false, DType::F32});
  o.n_head_kv = 2;
  EXPECT_NE(error_of([&] { validate(o); }).find("grouped-query"), std::string::npos);
}

namespace {

// Runs the dense FFN and, on the side, PowerInfer's predictor on the FFN input: counts how many
// (token, neuron) pairs it marks active (score > 0).
class PredictorCounter final : public FfnExecutor {
 public:
  uint64_t seen = 0, active = 0;
  bool on_residual = false;  // feed fc1 the residual stream before ffn_norm (PowerInfer), not x
  float threshold = 0.0f;
  void run(ThreadPool& pool, int64_t, const FfnWeights& w, cpu::Activation act, const float* x_ffn, int64_t n,
           float* out, Workspace& ws) override {
    const float* x = on_residual ? ws.ffn_residual : x_ffn;
    const int64_t rank = w.fc1.rows(), n_ff = w.fc2.rows();
    std::vector<float> h(static_cast<size_t>(n * rank)), s(static_cast<size_t>(n * n_ff));
    std::vector<uint8_t> scratch(std::max<size_t>(64, cpu::matmul_scratch_bytes(w.fc2.type, w.fc2.cols(), n) +
                                                           cpu::matmul_scratch_bytes(w.fc1.type, w.fc1.cols(), n)));
    cpu::matmul(pool, w.fc1, x, n, h.data(), scratch.data());
    for (float& v : h) v = std::max(v, 0.0f);
    cpu::matmul(pool, w.fc2, h.data(), n, s.data(), scratch.data());
    for (float v : s) active += v >= threshold;  // predicted active: score >= threshold
    seen += s.size();
    dense_ffn(pool, w, act, x_ffn, n, out, ws);
  }
  std::string refusal(const Model&) const override { return {}; }
};

// Runs tokens one at a time through the dense model while counting what its predictor marks
// active (from the residual stream or the FFN input, at the model's threshold).
PredictorCounter count_predicted(const Model& m, const std::vector<int32_t>& tokens, bool on_residual) {
  ThreadPool pool(2);
  Workspace ws;
  ws.init(m, 16, 64, 2);
  KvCache kv;
  kv.init(m.hp.n_layer, 64, m.hp.n_head_kv * m.hp.head_dim);
  PredictorCounter counter;
  counter.on_residual = on_residual;
  counter.threshold = m.predictor_threshold;
  ws.ffn = &counter;
  std::vector<float> logits(static_cast<size_t>(m.hp.n_vocab));
  for (size_t t = 0; t < tokens.size(); ++t)
    forward(m, pool, kv, ws, &tokens[t], 1, static_cast<int64_t>(t), logits.data(), false);
  return counter;
}

}  // namespace

// `synth --powerinfer` with a profile: the random predictor marks neurons active at about the
// profile's rates, so PowerInfer runs the file at the target sparsity (a fair speed comparison).
// A PowerInfer file's predictor reads the residual stream entering the FFN (PowerInfer's
// llm_build_ffn_sparse gets ffn_inp, before ffn_norm): predictor mode must predict exactly the
// neurons that fc2(relu(fc1 residual)) >= 0 names, token by token.
TEST(ReluArchs, PowerInferPredictorReadsTheResidualStream) {
  SynthOptions o = options({"llama", true, DType::F32}, 0.9f);
  o.n_embd = 256, o.n_ff = 704, o.predictor_rank = 64;
  // A nonzero score threshold: fc2 relu(fc1 x) is positively homogeneous, so at threshold 0 the
  // residual and its normalized copy (a positive multiple here) would predict alike.
  o.predictor_threshold = 0.5f;
  const std::string path = write(o, "pred-residual");
  auto m = load_model(path);
  EXPECT_TRUE(m->predictor_on_residual);
  const auto tokens = tokens_for(*m, 16);
  const uint64_t predicted[2] = {count_predicted(*m, tokens, false).active, count_predicted(*m, tokens, true).active};
  SessionParams sp;
  sp.n_threads = 2;
  sp.n_ctx = 64;
  sp.sparse.mode = FfnMode::predictor;
  Session session(*m, sp);
  for (int64_t t = 0; t < 16; ++t) session.eval(&tokens[t], 1);
  uint64_t engine = 0;
  for (uint64_t v : session.sparse_ffn()->stats().predicted) engine += v;
  std::printf("predicted (token, neuron) pairs: engine %llu, from the residual %llu, from the FFN input %llu\n",
              static_cast<unsigned long long>(engine), static_cast<unsigned long long>(predicted[1]),
              static_cast<unsigned long long>(predicted[0]));
  EXPECT_NEAR(static_cast<double>(engine), static_cast<double>(predicted[1]), 2.0);  // float rounding at 0
  EXPECT_GT(std::fabs(static_cast<double>(predicted[0]) - static_cast<double>(predicted[1])), 20.0);
  std::filesystem::remove(path);
}

TEST(ReluArchs, SynthPredictorFiresAtTheTargetRate) {
  for (const std::string arch : {"llama", "bamboo"}) {
    SynthOptions o = options({arch, true, DType::F32}, 0.9f);
    o.n_embd = 256, o.n_ff = 704, o.predictor_rank = 64;
    const std::string path = write(o, arch + "-pred-rate");
    auto m = load_model(path);
    // As PowerInfer runs it: the predictor reads the residual stream.
    const PredictorCounter counter = count_predicted(*m, tokens_for(*m, 24), true);
    const double predicted_sparsity = 1.0 - static_cast<double>(counter.active) / static_cast<double>(counter.seen);
    std::printf("%s: predictor marks %.1f%% inactive (target 90%%)\n", arch.c_str(), 100.0 * predicted_sparsity);
    EXPECT_NEAR(predicted_sparsity, 0.9, 0.05);
    std::filesystem::remove(path);
  }
}

// ember.predictor.input: the declared convention wins; absent, model files read as PowerInfer's
// (residual) and predictor files as Ember's (ffn_input); anything else is a clear error.
TEST(ReluArchs, PredictorInputKeyIsReadStrictly) {
  const auto read = [](const std::string& arch, const char* input) {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str(arch));
    if (input) w.set(kPredictorInputKey, gguf::Value::str(input));
    const std::string path = (test_dir() / "predictor-input.gguf").string();
    w.write(path);
    gguf::Reader r(path);
    return predictor_reads_residual(r);
  };
  EXPECT_TRUE(read("llama", nullptr));
  EXPECT_FALSE(read("ember-predictor", nullptr));
  EXPECT_FALSE(read("llama", "ffn_input"));
  EXPECT_TRUE(read("ember-predictor", "residual"));
  EXPECT_NE(test_support::error_of([&] { read("llama", "post_norm"); }).find("expected 'residual' or 'ffn_input'"),
            std::string::npos);
}
