// Activation predictors: inference against a double reference, attaching a predictor file to a
// model (and the errors for a wrong one), predictor FFN mode against oracle mode with a
// perfect-recall predictor, training on a planted low-rank rule, and the synth option that makes
// firing predictable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.hpp"
#include "engine/session.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"
#include "model/model.hpp"
#include "ops/cpu/r16/r16.hpp"
#include "synth/synth.hpp"
#include "support/ffn_modes.hpp"
#include "sparse/predictor.hpp"
#include "sparse/predictor_train.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

using namespace ember;
using test_support::rel_diff;
using test_support::run_ffn_mode;

namespace {

std::filesystem::path test_dir() {
  auto dir = std::filesystem::temp_directory_path() / "ember-test-predictor";
  std::filesystem::create_directories(dir);
  return dir;
}

// A float matrix [rows x cols] stored as `type` (F32, F16 or Q8_0), with its view.
struct Matrix {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // as stored (rounded)
  TensorView view;
  Matrix(DType type, int64_t rows, int64_t cols, std::mt19937& rng, float scale) {
    std::normal_distribution<float> nd(0.0f, scale);
    values.resize(static_cast<size_t>(rows * cols));
    for (float& v : values) v = nd(rng);
    encode(type, rows, cols);
  }
  Matrix(DType type, int64_t rows, int64_t cols, std::vector<float> v) : values(std::move(v)) {
    encode(type, rows, cols);
  }
  void encode(DType type, int64_t rows, int64_t cols) {
    bytes.resize(row_bytes(type, cols) * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* row = bytes.data() + row_bytes(type, cols) * static_cast<size_t>(r);
      quantize_row(type, &values[r * cols], row, cols);
      dequantize_row(type, row, &values[r * cols], cols);
    }
    view = matrix_view(type, bytes.data(), rows, cols);
  }
};

SynthOptions relu_model_options(int64_t gate_rank) {
  SynthOptions o;
  o.type = DType::F32;
  o.act = FfnActivation::relu;
  o.sparsity = 0.85f;
  o.n_embd = 128;
  o.n_ff = 352;
  o.n_layer = 3;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.seed = 5;
  o.n_threads = 1;
  o.gate_rank = gate_rank;
  return o;
}

std::string write_model(const SynthOptions& o, const std::string& name) {
  std::string path = (test_dir() / (name + ".gguf")).string();
  synth_write(o, path);
  return path;
}

// A predictor that reproduces each layer's gate: fc1 = [I; -I], fc2 = [G, -G], so that
// score = G x (up to float rounding) and score >= threshold catches every neuron with gate > 0.
std::vector<LayerPredictor> gate_copy_predictors(const Model& m, float threshold) {
  std::vector<LayerPredictor> out;
  const int64_t d = m.hp.n_embd, nf = m.hp.n_ff, r = 2 * d;
  for (const auto& L : m.layers) {
    LayerPredictor p;
    p.rank = r, p.n_embd = d, p.n_ff = nf, p.threshold = threshold;
    p.fc1.assign(static_cast<size_t>(r * d), 0.0f);
    for (int64_t i = 0; i < d; ++i) p.fc1[i * d + i] = 1.0f, p.fc1[(i + d) * d + i] = -1.0f;
    p.fc2.assign(static_cast<size_t>(nf * r), 0.0f);
    std::vector<float> row(static_cast<size_t>(d));
    for (int64_t j = 0; j < nf; ++j) {
      dequantize_row(L.ffn.gate.type, L.ffn.gate.row(j), row.data(), d);
      for (int64_t i = 0; i < d; ++i) p.fc2[j * r + i] = row[i], p.fc2[j * r + d + i] = -row[i];
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

TEST(Predictor, InferenceMatchesDoubleReference) {
  std::mt19937 rng(17);
  const int64_t d = 96, nf = 170;
  for (DType type : {DType::F32, DType::F16, DType::Q8_0}) {
    // Q8_0 rows are whole blocks; its kernels also round x and the hidden layer to 8 bits.
    const int64_t rank = type == DType::Q8_0 ? 32 : 13;
    const double tol = type == DType::Q8_0 ? 2e-2 : 1e-5;
    Matrix fc1(type, rank, d, rng, 0.3f), fc2(type, nf, rank, rng, 0.5f);
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      for (int64_t n : {1, 3}) {
        std::vector<float> x(static_cast<size_t>(n * d));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (float& v : x) v = nd(rng);
        // Reference scores in double.
        std::vector<double> ref(static_cast<size_t>(n * nf));
        for (int64_t t = 0; t < n; ++t) {
          std::vector<double> h(rank);
          for (int64_t q = 0; q < rank; ++q) {
            double a = 0;
            for (int64_t i = 0; i < d; ++i) a += static_cast<double>(fc1.values[q * d + i]) * x[t * d + i];
            h[q] = std::max(a, 0.0);
          }
          for (int64_t j = 0; j < nf; ++j) {
            double a = 0;
            for (int64_t q = 0; q < rank; ++q) a += static_cast<double>(fc2.values[j * rank + q]) * h[q];
            ref[t * nf + j] = a;
          }
        }
        const float thr = 0.4f;
        std::vector<float> scratch(predictor_scratch_floats(rank, nf, n));
        std::vector<uint8_t> mm(predictor_mm_scratch_bytes(fc1.view, fc2.view, n) + 64);
        std::vector<int32_t> active(nf);
        const int64_t na = predict_active(pool, fc1.view, fc2.view, thr, x.data(), n, scratch.data(), mm.data(),
                                          active.data());
        double max_err = 0, max_ref = 0;
        for (int64_t i = 0; i < n * nf; ++i) {
          max_err = std::max(max_err, std::fabs(scratch[i] - ref[i]));
          max_ref = std::max(max_ref, std::fabs(ref[i]));
        }
        EXPECT_LT(max_err, tol * max_ref) << dtype_name(type) << " n " << n;
        // The active set is the union over tokens of score >= thr, sorted; borderline scores
        // (within float rounding of thr) may go either way.
        std::vector<char> in(nf, 0);
        for (int64_t i = 0; i < na; ++i) {
          in[active[i]] = 1;
          if (i > 0) {
            EXPECT_LT(active[i - 1], active[i]);
          }
        }
        int64_t expected = 0;
        for (int64_t j = 0; j < nf; ++j) {
          bool want = false, border = false;
          for (int64_t t = 0; t < n; ++t) {
            want |= ref[t * nf + j] >= thr;
            border |= std::fabs(ref[t * nf + j] - thr) < std::max(1e-4, tol * max_ref);
          }
          expected += want;
          if (!border) {
            EXPECT_EQ(static_cast<bool>(in[j]), want) << "neuron " << j;
          }
        }
        EXPECT_GT(expected, 5);
        EXPECT_LT(expected, nf - 5);  // a nontrivial split
      }
    }
  }
}

// A predictor whose hidden units come in pairs of opposite sign runs at half rank without the
// ReLU: mirrored_half finds h, the halves are fc1's first rows and a copy of fc2's first
// columns, and they predict what the whole predictor does (same scores to rounding). A single
// value off, or halves that are not whole blocks, and it is not taken for mirrored.
TEST(Predictor, MirroredPairsRunAtHalfRank) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t d = 96, nf = 170;
  for (DType type : {DType::F32, DType::F16, DType::Q8_0}) {
    const int64_t h = type == DType::Q8_0 ? 32 : 13, rank = 2 * h;
    std::vector<float> a(static_cast<size_t>(h * d)), u(static_cast<size_t>(nf * h));
    for (float& v : a) v = 0.3f * nd(rng);
    for (float& v : u) v = 0.5f * nd(rng);
    std::vector<float> w1(static_cast<size_t>(rank * d)), w2(static_cast<size_t>(nf * rank));
    for (int64_t q = 0; q < h; ++q)
      for (int64_t i = 0; i < d; ++i) w1[q * d + i] = a[q * d + i], w1[(q + h) * d + i] = -a[q * d + i];
    for (int64_t j = 0; j < nf; ++j)
      for (int64_t q = 0; q < h; ++q) w2[j * rank + q] = u[j * h + q], w2[j * rank + q + h] = -u[j * h + q];
    Matrix fc1(type, rank, d, w1), fc2(type, nf, rank, w2);
    ASSERT_EQ(mirrored_half(fc1.view, fc2.view), h) << dtype_name(type);
    std::vector<uint8_t> half(half_columns_bytes(fc2.view, h));
    ASSERT_EQ(half.size(), row_bytes(type, h) * nf);
    const TensorView f1 = first_rows(fc1.view, h), f2 = copy_half_columns(fc2.view, h, half.data());
    EXPECT_EQ(f1.rows(), h);
    EXPECT_EQ(f1.data, fc1.view.data);
    EXPECT_EQ(f2.rows(), nf);
    EXPECT_EQ(f2.cols(), h);
    for (int64_t j = 0; j < nf; ++j)
      ASSERT_EQ(std::memcmp(f2.row(j), fc2.view.row(j), row_bytes(type, h)), 0) << "row " << j;
    ThreadPool pool(2);
    const int64_t n = 3;
    std::vector<float> x(static_cast<size_t>(n * d));
    for (float& v : x) v = nd(rng);
    std::vector<float> s_whole(predictor_scratch_floats(rank, nf, n)), s_half(predictor_scratch_floats(h, nf, n));
    std::vector<uint8_t> mm(predictor_mm_scratch_bytes(fc1.view, fc2.view, n) + 64);
    std::vector<int32_t> act_whole(nf), act_half(nf);
    const float thr = 0.4f;
    const int64_t n_whole = predict_active(pool, fc1.view, fc2.view, thr, x.data(), n, s_whole.data(), mm.data(),
                                           act_whole.data());
    const int64_t n_half = predict_active(pool, f1, f2, thr, x.data(), n, s_half.data(), mm.data(), act_half.data(),
                                          /*linear=*/true);
    // Q8_0 rounds the hidden row to 8 bits: [relu(a), relu(-a)] and a get different scales.
    const double tol = type == DType::Q8_0 ? 2e-2 : 1e-5;
    double max_err = 0, max_s = 0;
    for (int64_t i = 0; i < n * nf; ++i) {
      max_err = std::max(max_err, static_cast<double>(std::fabs(s_whole[i] - s_half[i])));
      max_s = std::max(max_s, static_cast<double>(std::fabs(s_whole[i])));
    }
    EXPECT_LT(max_err, tol * max_s) << dtype_name(type);
    EXPECT_GT(n_whole, 5);
    EXPECT_NEAR(static_cast<double>(n_half), static_cast<double>(n_whole), type == DType::Q8_0 ? 3.0 : 0.0)
        << dtype_name(type);
    if (type != DType::F32) continue;
    // One value off in either matrix, or an odd rank: not mirrored.
    std::vector<float> b1 = w1, b2 = w2;
    b1[(h + 2) * d + 5] += 1e-3f;
    EXPECT_EQ(mirrored_half(Matrix(type, rank, d, b1).view, fc2.view), 0);
    b2[7 * rank + h + 1] += 1e-3f;
    EXPECT_EQ(mirrored_half(fc1.view, Matrix(type, nf, rank, b2).view), 0);
    EXPECT_EQ(mirrored_half(first_rows(fc1.view, rank - 1), fc2.view), 0);
  }
  // Q8_0 halves of 16 values are not whole blocks: the pair is left whole.
  std::vector<float> w1(32 * 64), w2(40 * 32);
  for (int64_t q = 0; q < 16; ++q)
    for (int64_t i = 0; i < 64; ++i) w1[q * 64 + i] = nd(rng), w1[(q + 16) * 64 + i] = -w1[q * 64 + i];
  for (int64_t j = 0; j < 40; ++j)
    for (int64_t q = 0; q < 16; ++q) w2[j * 32 + q] = nd(rng), w2[j * 32 + q + 16] = -w2[j * 32 + q];
  EXPECT_EQ(mirrored_half(Matrix(DType::F32, 32, 64, w1).view, Matrix(DType::F32, 40, 32, w2).view), 16);
  EXPECT_EQ(mirrored_half(Matrix(DType::Q8_0, 32, 64, w1).view, Matrix(DType::Q8_0, 40, 32, w2).view), 0);
}

// The engine runs a mirrored predictor at half rank: the same neurons predicted and fired, the
// same logits to rounding, half the predictor's bytes.
TEST(Predictor, MirroredPredictorRunsLikeTheWholeOne) {
  auto path = write_model(relu_model_options(0), "mirrored");
  auto model = load_model(path);
  const std::string pred = (test_dir() / "mirrored.pred.gguf").string();
  write_predictor_file(pred, "mirrored", gate_copy_predictors(*model, 0.05f), DType::F16);
  attach_predictors(*model, pred);
  for (bool fused : {false, true}) {
    FfnSparsityStats whole, half;
    auto a = run_ffn_mode(*model, FfnMode::predictor, 2, &whole, fused, /*mirrored=*/false);
    auto b = run_ffn_mode(*model, FfnMode::predictor, 2, &half, fused, /*mirrored=*/true);
    EXPECT_LT(rel_diff(a, b), 1e-5) << "fused " << fused;
    EXPECT_EQ(whole.predicted, half.predicted) << "fused " << fused;
    EXPECT_EQ(whole.active, half.active) << "fused " << fused;
    EXPECT_LT(half.predicted[1], half.neurons[1]);
  }
  SessionParams p;
  p.n_ctx = 16;
  p.sparse.mode = FfnMode::predictor;
  Session s(*model, p);
  EXPECT_EQ(s.sparse_ffn()->predictor_run_bytes() * 2, predictor_bytes(*model));
}

TEST(Predictor, AttachValidatesTheFile) {
  auto path = write_model(relu_model_options(0), "attach");
  auto model = load_model(path);
  EXPECT_FALSE(has_predictors(*model));
  auto preds = gate_copy_predictors(*model, -0.5f);
  const std::string good = (test_dir() / "attach.pred.gguf").string();
  write_predictor_file(good, "attach", preds, DType::F16);
  attach_predictors(*model, good);
  EXPECT_TRUE(has_predictors(*model));
  EXPECT_EQ(model->layers[1].ffn.fc1.rows(), 2 * model->hp.n_embd);
  EXPECT_EQ(model->layers[1].ffn.fc2.rows(), model->hp.n_ff);
  EXPECT_EQ(model->layers[1].ffn.fc2.type, DType::F16);
  EXPECT_FLOAT_EQ(model->predictor_threshold, -1.0f);  // negative thresholds folded into fc2
  EXPECT_EQ(model->side_files.size(), 1u);
  EXPECT_EQ(predictor_bytes(*model), 3u * 2u * (2 * 128 * 128 + 352 * 256));

  auto expect_error = [&](const std::string& file, const std::string& needle) {
    auto m = load_model(path);
    try {
      attach_predictors(*m, file);
      ADD_FAILURE() << "no error for " << file;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(has_predictors(*m));  // nothing half-attached
  };
  // Too few layers.
  auto two = preds;
  two.pop_back();
  const std::string f2 = (test_dir() / "two.pred.gguf").string();
  write_predictor_file(f2, "two", two, DType::F32);
  expect_error(f2, "2 layers");
  // Wrong n_ff.
  auto wide = preds;
  wide[2].n_ff += 1;
  wide[2].fc2.resize(wide[2].fc2.size() + wide[2].rank, 0.0f);
  const std::string f3 = (test_dir() / "wide.pred.gguf").string();
  write_predictor_file(f3, "wide", wide, DType::F32);
  expect_error(f3, "blk.2.fc2.weight");
  // Not a predictor file at all.
  expect_error(path, "not a predictor file");
  // A missing layer tensor and a quantized one.
  {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("ember-predictor"));
    w.set("ember.predictor.n_layer", gguf::Value::u64(3));
    const std::string f4 = (test_dir() / "missing.pred.gguf").string();
    w.write(f4);
    expect_error(f4, "layer 0 has no");
  }
}

TEST(Predictor, PerfectRecallPredictorEqualsOracle) {
  for (DType type : {DType::F32, DType::Q4_0}) {
    SynthOptions o = relu_model_options(0);
    o.type = type;
    auto path = write_model(o, "perfect-" + std::string(dtype_name(type)));
    auto model = load_model(path);
    FfnSparsityStats st_oracle, st_pred;
    auto oracle = run_ffn_mode(*model, FfnMode::oracle, 2, &st_oracle);
    // Gate values are O(1); with F32 weights the copy's rounding is ~1e-6, so -1e-3 misses no
    // firing neuron. A Q4_0 gate meets 8-bit rounded activations (relative error ~1%), which
    // the float copy does not see: a wider margin.
    const float margin = type == DType::F32 ? 1e-3f : 0.1f;
    write_predictor_file((test_dir() / "perfect.pred.gguf").string(), "perfect", gate_copy_predictors(*model, -margin),
                         DType::F32);
    attach_predictors(*model, (test_dir() / "perfect.pred.gguf").string());
    auto pred = run_ffn_mode(*model, FfnMode::predictor, 2, &st_pred);
    EXPECT_LT(rel_diff(oracle, pred), 1e-6) << dtype_name(type);
    for (size_t l = 0; l < st_oracle.active.size(); ++l) {
      EXPECT_EQ(st_oracle.active[l], st_pred.active[l]) << "layer " << l;
      // It predicted more than the firing neurons (the union over the prompt batch, the
      // margin), but not everything.
      EXPECT_GT(st_pred.predicted[l], st_pred.active[l]);
      EXPECT_LT(st_pred.predicted[l], st_pred.neurons[l] * 3 / 4);
    }
    // A threshold below every score predicts every neuron: oracle again, exactly.
    auto m2 = load_model(path);
    write_predictor_file((test_dir() / "all.pred.gguf").string(), "all", gate_copy_predictors(*m2, -1e30f), DType::F32);
    attach_predictors(*m2, (test_dir() / "all.pred.gguf").string());
    EXPECT_LT(rel_diff(oracle, run_ffn_mode(*m2, FfnMode::predictor, 1)), 1e-6);
  }
}

// The fused one-token path (scores, gate, firing test, up and down in one dispatch) gives the
// bits of the separate steps on one thread, and on more the same to rounding and the same bits
// run after run, for a predictor that misses neurons and one that predicts extra ones; it
// predicts and fires the same neurons for any thread count.
TEST(Predictor, FusedDecodeEqualsSeparateSteps) {
  for (DType type : {DType::F32, DType::Q4_0, DType::Q4_1}) {
    SynthOptions o = relu_model_options(0);
    o.type = type;
    auto path = write_model(o, "fused-" + std::string(dtype_name(type)));
    for (float thr : {-0.1f, 0.3f}) {
      auto model = load_model(path);
      const std::string pred = (test_dir() / "fused.pred.gguf").string();
      write_predictor_file(pred, "fused", gate_copy_predictors(*model, thr), DType::F16);
      attach_predictors(*model, pred);
      FfnSparsityStats st_sep, st_fused;
      auto first = run_ffn_mode(*model, FfnMode::predictor, 1, &st_sep, false);
      for (int threads : {1, 2, 3}) {
        auto sep = run_ffn_mode(*model, FfnMode::predictor, threads, &st_sep, false);
        auto fused = run_ffn_mode(*model, FfnMode::predictor, threads, &st_fused, true);
        EXPECT_EQ(sep, first) << dtype_name(type) << " threshold " << thr << " threads " << threads;
        if (threads == 1) {
          EXPECT_EQ(fused, sep) << dtype_name(type) << " threshold " << thr;
        } else {
          EXPECT_LT(rel_diff(fused, sep), 1e-4) << dtype_name(type) << " threshold " << thr << " threads " << threads;
          EXPECT_EQ(fused, run_ffn_mode(*model, FfnMode::predictor, threads, nullptr, true)) << dtype_name(type);
        }
        EXPECT_EQ(st_fused.active, st_sep.active);
        EXPECT_EQ(st_fused.predicted, st_sep.predicted);
        EXPECT_LT(st_fused.predicted[0], st_fused.neurons[0]);  // a real subset was predicted
      }
    }
  }
}

TEST(Predictor, ModeWithoutPredictorsIsAClearError) {
  auto model = load_model(write_model(relu_model_options(0), "nopred"));
  SessionParams p;
  p.n_ctx = 32;
  p.sparse.mode = FfnMode::predictor;
  try {
    Session s(*model, p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--predictor"), std::string::npos) << e.what();
  }
}

TEST(PredictorTrain, RecoversAPlantedLowRankRule) {
  // Neuron j fires when g_j = c_j . (U x) + b_j x_c > 0 (U: 4 directions, x_c a constant
  // input), with mass g_j; a rank-8 predictor can represent this exactly.
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t d = 48, nf = 100, r0 = 4, N = 2000;
  std::vector<float> U(r0 * d), C(nf * r0), bias(nf), G(nf * d, 0.0f);
  for (float& v : U) v = nd(rng) / std::sqrt(static_cast<float>(d));
  for (float& v : C) v = nd(rng);
  for (float& v : bias) v = nd(rng) - 1.0f;  // mostly silent neurons
  for (int64_t j = 0; j < nf; ++j) {
    for (int64_t q = 0; q < r0; ++q)
      for (int64_t i = 0; i < d - 1; ++i) G[j * d + i] += C[j * r0 + q] * U[q * d + i];
    G[j * d + d - 1] = bias[j];
  }
  LayerSamples s;
  s.n_embd = d, s.n_ff = nf;
  std::vector<float> x(d);
  std::vector<int32_t> ids;
  std::vector<float> mass;
  uint64_t fired = 0;
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t i = 0; i < d - 1; ++i) x[i] = nd(rng);
    x[d - 1] = 1.0f;
    ids.clear(), mass.clear();
    for (int64_t j = 0; j < nf; ++j) {
      double g = 0;
      for (int64_t i = 0; i < d; ++i) g += static_cast<double>(G[j * d + i]) * x[i];
      if (g > 0) ids.push_back(static_cast<int32_t>(j)), mass.push_back(static_cast<float>(g));
    }
    fired += ids.size();
    s.add_token(x.data(), ids.data(), mass.data(), static_cast<int64_t>(ids.size()));
  }
  const double density = static_cast<double>(fired) / (N * nf);
  ASSERT_GT(density, 0.1);
  ASSERT_LT(density, 0.5);
  ThreadPool pool(2);
  PredictorTrainOptions o;
  o.recall = 0.99;
  o.epochs = 30;
  o.batch = 32;
  o.lr = 5e-3f;
  o.type = DType::F32;
  // From random weights: training alone must find the rule.
  LayerPredictor p = fit_predictor(pool, s, 8, o);
  EXPECT_GE(p.recall_mass, 0.97);
  EXPECT_GE(p.precision, 0.75);
  EXPECT_NEAR(p.true_sparsity, 1.0 - density, 0.05);
  EXPECT_EQ(p.bytes, 4u * 8u * (48u + 100u));
  // Starting from the gate's subspace the rule is there from the first step.
  std::vector<uint8_t> gb(reinterpret_cast<uint8_t*>(G.data()), reinterpret_cast<uint8_t*>(G.data() + G.size()));
  o.init_gate.type = DType::F32, o.init_gate.n_dims = 2, o.init_gate.ne[0] = d, o.init_gate.ne[1] = nf;
  o.init_gate.data = gb.data(), o.init_gate.nbytes = gb.size();
  o.epochs = 2;
  LayerPredictor q = fit_predictor(pool, s, 12, o);  // 6 >= 5 directions: U's four and the bias
  EXPECT_GE(q.recall_mass, 0.97);
  EXPECT_GE(q.precision, 0.9);
  // The reported evaluation is the network's: the double reference over the evaluation tokens
  // (the last 5%) gives the same count recall.
  const int64_t n_eval = N / 20;
  std::vector<double> sc(static_cast<size_t>(n_eval * nf));
  predictor_scores_reference(q, s.x.data() + (N - n_eval) * d, n_eval, sc.data());
  uint64_t hit = 0, n_pos = 0;
  for (int64_t t = 0; t < n_eval; ++t)
    for (uint32_t e = s.offsets[N - n_eval + t]; e < s.offsets[N - n_eval + t + 1]; ++e)
      n_pos++, hit += sc[t * nf + s.idx[e]] >= q.threshold;
  EXPECT_NEAR(static_cast<double>(hit) / n_pos, q.recall_count, 0.005);
}

// The gate's products that the initialization starts from (GateProducts) are the same whether
// the gate's rows are the file's or repacked 16 at a time (their G^T then comes from a product
// with the identity): up to the rounding of 1 in the product's 8-bit activations, and the
// kernels' order of summation.
TEST(PredictorTrain, GateProductsOfARepackedGateAreTheFileRows) {
  const int64_t nf = 48, d = 256, n = 40;
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Q8_0 and Q4_0 unpack to their rows; Q4_K has no unpacking (its product with the identity).
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<float> g(static_cast<size_t>(nf * d));
    for (float& v : g) v = nd(rng);
    std::vector<uint8_t> plain(row_bytes(t, d) * nf), packed(plain.size());
    for (int64_t r = 0; r < nf; ++r) quantize_row(t, &g[r * d], plain.data() + r * row_bytes(t, d), d);
    cpu::repack_r16(t, plain.data(), nf, d, packed.data());
    LayerSamples s;
    s.n_embd = d, s.n_ff = nf;
    std::vector<float> x(static_cast<size_t>(d));
    for (int64_t i = 0; i < n; ++i) {
      for (float& v : x) v = nd(rng);
      s.add_token(x.data(), nullptr, nullptr, 0);
    }
    ThreadPool pool(2);
    const GateProducts a = gate_products(pool, matrix_view(t, plain.data(), nf, d), s, n);
    const GateProducts b = gate_products(pool, matrix_view(cpu::r16_type(t), packed.data(), nf, d), s, n);
    ASSERT_EQ(a.GT.size(), b.GT.size());
    ASSERT_EQ(a.P.size(), b.P.size());
    double scale = 0;
    for (float v : a.GT) scale = std::max(scale, std::fabs(double{v}));
    for (size_t i = 0; i < a.GT.size(); ++i) EXPECT_NEAR(b.GT[i], a.GT[i], 1e-3 * scale) << i;
    for (size_t i = 0; i < a.P.size(); ++i) EXPECT_NEAR(b.P[i], a.P[i], 1e-4 * (1.0 + std::fabs(a.P[i]))) << i;
    EXPECT_EQ(b.PT.size(), b.P.size());
  }
}

// Q8_0 predictor weights: ranks in multiples of 32, weights on the Q8_0 grid, about half the
// bytes of F16, and the same recall as F16 on the planted rule (the held-out evaluation runs
// the engine's Q8_0 kernels, which round the activations to 8 bits as well).
TEST(PredictorTrain, Q8_0WeightsKeepTheRecallAtHalfTheBytes) {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t d = 64, nf = 96, N = 1600;
  std::vector<float> G(nf * d);
  for (float& v : G) v = nd(rng) / 8.0f;
  LayerSamples s;
  s.n_embd = d, s.n_ff = nf;
  std::vector<float> x(d);
  std::vector<int32_t> ids;
  std::vector<float> mass;
  for (int64_t t = 0; t < N; ++t) {
    for (float& v : x) v = nd(rng);
    ids.clear(), mass.clear();
    for (int64_t j = 0; j < nf; ++j) {
      double g = -0.6;  // mostly silent
      for (int64_t i = 0; i < d; ++i) g += static_cast<double>(G[j * d + i]) * x[i];
      if (g > 0) ids.push_back(static_cast<int32_t>(j)), mass.push_back(static_cast<float>(g));
    }
    s.add_token(x.data(), ids.data(), mass.data(), static_cast<int64_t>(ids.size()));
  }
  std::vector<uint8_t> gb(reinterpret_cast<uint8_t*>(G.data()), reinterpret_cast<uint8_t*>(G.data() + G.size()));
  ThreadPool pool(2);
  PredictorTrainOptions o;
  o.epochs = 3;
  o.init_gate.type = DType::F32, o.init_gate.n_dims = 2, o.init_gate.ne[0] = d, o.init_gate.ne[1] = nf;
  o.init_gate.data = gb.data(), o.init_gate.nbytes = gb.size();
  o.min_rank = 16, o.max_rank = 64;
  o.type = DType::F16;
  const LayerPredictor h = fit_predictor(pool, s, 32, o);
  o.type = DType::Q8_0;
  const LayerPredictor q = fit_predictor(pool, s, 32, o);
  EXPECT_EQ(q.bytes, 32u * row_bytes(DType::Q8_0, 64) + 96u * row_bytes(DType::Q8_0, 32));
  EXPECT_LT(q.bytes * 10, h.bytes * 6);
  EXPECT_GE(h.recall_mass, 0.97);
  EXPECT_NEAR(q.recall_mass, h.recall_mass, 0.01);
  EXPECT_NEAR(q.precision, h.precision, 0.05);
  // The weights are on the Q8_0 grid: quantizing them again changes nothing.
  std::vector<uint8_t> blk(row_bytes(DType::Q8_0, d));
  std::vector<float> back(d);
  for (int64_t r = 0; r < q.rank; ++r) {
    quantize_row(DType::Q8_0, &q.fc1[r * d], blk.data(), d);
    dequantize_row(DType::Q8_0, blk.data(), back.data(), d);
    for (int64_t i = 0; i < d; ++i) ASSERT_EQ(back[i], q.fc1[r * d + i]) << "row " << r;
  }
  // The rank search takes multiples of 32 (min_rank 16 starts at 32).
  const LayerPredictor best = train_layer_predictor(pool, s, o);
  EXPECT_EQ(best.rank % 32, 0);
  EXPECT_GE(best.rank, 32);
  // Ranks or widths that are not whole blocks are refused with the reason.
  try {
    fit_predictor(pool, s, 48, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 32"), std::string::npos) << e.what();
  }
  // The file stores Q8_0 tensors, and a reader takes them.
  const std::string path = (test_dir() / "q8.pred.gguf").string();
  write_predictor_file(path, "q8", {q}, DType::Q8_0);
  gguf::Reader r(path);
  EXPECT_EQ(r.view("blk.0.fc1.weight").type, DType::Q8_0);
  EXPECT_EQ(r.view("blk.0.fc2.weight").type, DType::Q8_0);
}

TEST(PredictorTrain, SynthGateRankMakesFiringPredictable) {
  ThreadPool pool(2);
  std::vector<int32_t> tokens(600);
  std::mt19937 rng(4);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 300);
  PredictorTrainOptions o;
  o.type = DType::F32;
  double precision[2];
  for (int k = 0; k < 2; ++k) {
    const int64_t gate_rank = k == 0 ? 0 : 6;
    auto model = load_model(write_model(relu_model_options(gate_rank), "predictable" + std::to_string(gate_rank)));
    SampleOptions so;
    so.max_tokens = 600;
    so.n_ctx = 200;
    auto samples = collect_ffn_samples(*model, pool, tokens, so);
    ASSERT_EQ(samples.size(), 3u);
    ASSERT_EQ(samples[1].n, 600);
    o.init_gate = model->layers[1].ffn.gate;
    o.epochs = 3;
    o.patience = 0;  // all three epochs
    LayerPredictor p = fit_predictor(pool, samples[1], 16, o);
    EXPECT_EQ(p.epochs_run, 3);
    // The profile's sparsity holds with the low-rank gate too.
    EXPECT_NEAR(p.true_sparsity, 0.85, 0.06) << "gate rank " << gate_rank;
    EXPECT_GE(p.recall_mass, 0.97);
    precision[k] = p.precision;
    // The start alone (no training): the linear fit of the gate's pre-activations on the tokens,
    // which includes the per-neuron offsets of the profile's bias channel.
    o.epochs = 0;
    const LayerPredictor p0 = fit_predictor(pool, samples[1], 16, o);
    EXPECT_EQ(p0.best_epoch, 0);
    EXPECT_GE(p0.recall_mass, 0.97);
    if (gate_rank > 0) {
      EXPECT_GT(p0.precision, 0.6);
    }
    // Training keeps the start unless an epoch predicts fewer neurons on the calibration tokens,
    // so it never ends (beyond the difference between the two held-out halves) worse.
    EXPECT_GE(p.predicted_sparsity, p0.predicted_sparsity - 0.02) << "gate rank " << gate_rank;
    if (p.best_epoch == 0) {
      EXPECT_EQ(p.fc1, p0.fc1);
      EXPECT_EQ(p.fc2, p0.fc2);
    }
    // Training stops once `patience` epochs in a row found nothing better.
    o.epochs = 8;
    o.patience = 2;
    const LayerPredictor pe = fit_predictor(pool, samples[1], 16, o);
    EXPECT_TRUE(pe.epochs_run == 8 || pe.epochs_run == pe.best_epoch + 2) << pe.epochs_run << " " << pe.best_epoch;
    if (gate_rank > 0) {
      EXPECT_LT(pe.epochs_run, 8);  // the start is not beaten here
    }
  }
  // Rank 16 >= 2 * 6 captures the low-rank gate; a random gate is not low-rank.
  EXPECT_GT(precision[1], 0.6);
  EXPECT_GT(precision[1], precision[0] + 0.2);
}

// A batch in predictor mode computes what its tokens compute one by one (decode): each token's
// neurons are those its own prediction names, not the batch's union (a short batch) nor every
// neuron (a long batch, on the dense kernels), so perplexity and KL at any -b describe decode.
// The predictor here misses neurons (the gate's copy with a positive margin), so the union and
// the dense path would give other logits.
TEST(Predictor, BatchesComputeWhatDecodeComputes) {
  SynthOptions o = relu_model_options(0);
  o.type = DType::F32;
  auto path = write_model(o, "per-token");
  auto model = load_model(path);
  write_predictor_file((test_dir() / "misses.pred.gguf").string(), "misses", gate_copy_predictors(*model, 0.5f),
                       DType::F32);
  attach_predictors(*model, (test_dir() / "misses.pred.gguf").string());
  SessionParams p;
  p.n_threads = 2;
  p.n_ctx = 64;
  p.n_batch = 32;
  p.sparse.mode = FfnMode::predictor;
  p.sparse.mirrored_predictors = false;
  const int64_t nv = model->hp.n_vocab;
  for (int64_t n : {int64_t{6}, int64_t{20}}) {  // the short path and the dense one (SparseFfn::kDenseBatch)
    SCOPED_TRACE(std::to_string(n) + " tokens in one batch");
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((7 * i + 3) % nv);
    Session batch(*model, p), single(*model, p);
    std::vector<float> all(static_cast<size_t>(n * nv));
    batch.eval_all_logits(tokens.data(), n, all.data());
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) {
      single.eval(&tokens[static_cast<size_t>(i)], 1);
      for (int64_t v = 0; v < nv; ++v) {
        worst = std::max(worst, static_cast<double>(std::fabs(single.logits()[v] - all[static_cast<size_t>(i * nv + v)])));
        scale = std::max(scale, static_cast<double>(std::fabs(single.logits()[v])));
      }
    }
    // F32 weights: the kernels' float sums apart (the dense path's order differs), far below
    // the effect of a neuron more or less.
    EXPECT_LT(worst / scale, 1e-4);
    const FfnSparsityStats& st = batch.sparse_ffn()->stats();
    uint64_t active = 0, neurons = 0;
    for (size_t l = 0; l < st.active.size(); ++l) active += st.active[l], neurons += st.neurons[l];
    EXPECT_GT(active, 0u);
    EXPECT_LT(active, neurons / 2);
  }
}
