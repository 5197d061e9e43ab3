// Activation profiling (sparse/profile.hpp), threshold calibration (sparse/threshold.hpp) and
// the threshold FFN mode (sparse/ffn_sparse.hpp) on synth models and random data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.hpp"
#include "engine/session.hpp"
#include "gguf/writer.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "ops/cpu/activation.hpp"
#include "sparse/ffn_sparse.hpp"
#include "engine/profile_run.hpp"
#include "sparse/predictor_train.hpp"
#include "sparse/threshold.hpp"
#include "support/paths.hpp"
#include "support/reference_llama.hpp"
#include "tokenizer/tokenizer.hpp"
#include "support/session_params.hpp"

using namespace ember;

namespace {

std::filesystem::path temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / "ember-test-profile";
  std::filesystem::create_directories(dir);
  return dir;
}

SynthOptions small(FfnActivation act, uint64_t seed) {
  SynthOptions o;
  o.act = act;
  o.n_embd = 64;
  o.n_ff = 200;  // not a multiple of any SIMD width
  o.n_layer = 3;
  o.seed = seed;
  o.n_threads = 1;
  if (act == FfnActivation::relu) o.sparsity = 0.7f;
  return o;
}

std::unique_ptr<Model> load_synth(const SynthOptions& o, const std::string& name) {
  std::string path = (temp_dir() / name).string();
  synth_write(o, path);
  return load_model(path);
}

std::vector<int32_t> random_tokens(size_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n_vocab - 1));
  std::vector<int32_t> t(n);
  for (auto& x : t) x = pick(rng);
  return t;
}

// Exact quantile at fraction p of sorted values (linear between ranks).
double exact_quantile(const std::vector<float>& sorted, double p) {
  const double idx = p * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(idx), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (idx - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

}  // namespace

TEST(AbsHistogram, QuantilesMatchSortedValues) {
  std::mt19937 rng(2);
  std::lognormal_distribution<float> ln(-2.0f, 1.5f);
  std::vector<float> v(100003);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (i % 7 == 0 ? -1.0f : 1.0f) * ln(rng);  // signs: |x| counts
  for (size_t i = 0; i < 1000; ++i) v[i * 13] = 0.0f;                                   // exact zeros
  AbsHistogram h;
  h.add(v.data(), 50000);  // in two calls
  h.add(v.data() + 50000, static_cast<int64_t>(v.size()) - 50000);
  EXPECT_EQ(h.total(), v.size());
  std::vector<float> a(v.size());
  for (size_t i = 0; i < v.size(); ++i) a[i] = std::fabs(v[i]);
  std::sort(a.begin(), a.end());
  auto q = h.quantiles(1001);
  ASSERT_EQ(q.size(), 1001u);
  for (int k = 0; k <= 1000; ++k) {
    const double e = exact_quantile(a, k / 1000.0);
    // Bins of 2^-10 relative width, plus the local spacing of the data (the histogram cannot
    // tell where inside a bin the neighbouring ranks lie).
    const size_t i = static_cast<size_t>(k / 1000.0 * (a.size() - 1));
    const double spacing = a[std::min(i + 1, a.size() - 1)] - a[i > 0 ? i - 1 : 0];
    EXPECT_NEAR(q[k], e, 2.0 * std::ldexp(e, -10) + spacing + 1e-9) << "quantile " << k;
  }
  EXPECT_EQ(q[0], 0.0f);
}

TEST(Threshold, QuantileAtInterpolates) {
  const float q[5] = {0.0f, 1.0f, 2.0f, 4.0f, 8.0f};
  EXPECT_FLOAT_EQ(quantile_at(q, 5, 0.0), 0.0f);
  EXPECT_FLOAT_EQ(quantile_at(q, 5, 0.5), 2.0f);
  EXPECT_FLOAT_EQ(quantile_at(q, 5, 0.625), 3.0f);
  EXPECT_FLOAT_EQ(quantile_at(q, 5, 1.0), 8.0f);
  EXPECT_THROW(quantile_at(q, 5, 1.5), Error);
}

TEST(Profile, HotFraction) {
  // 10 neurons: one fires 60 times, one 20, eight 2.5 each (total 100).
  std::vector<float> c = {2.5f, 60.0f, 2.5f, 2.5f, 20.0f, 2.5f, 2.5f, 2.5f, 2.5f, 2.5f};
  EXPECT_DOUBLE_EQ(hot_fraction(c, 0.6), 0.1);
  EXPECT_DOUBLE_EQ(hot_fraction(c, 0.8), 0.2);
  EXPECT_DOUBLE_EQ(hot_fraction(c, 0.85), 0.4);
  EXPECT_DOUBLE_EQ(hot_fraction(c, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(hot_fraction(std::vector<float>(4, 0.0f), 0.8), 0.0);
}

// The profiler's FFN is the dense FFN: the same logits as without it.
TEST(Profile, ExecutorComputesTheDenseFfn) {
  auto m = load_synth(small(FfnActivation::silu, 4), "dense.gguf");
  auto tokens = random_tokens(20, m->hp.n_vocab, 1);
  const int64_t nv = m->hp.n_vocab;
  std::vector<float> a(20 * nv), b(20 * nv);
  Session s(*m, test_support::session_params(2, 32, 8));
  s.eval_all_logits(tokens.data(), 20, a.data());
  ProfileFfn ffn(*m);
  s.set_ffn_executor(&ffn);
  s.reset();
  s.eval_all_logits(tokens.data(), 20, b.data());
  s.set_ffn_executor(nullptr);
  double mx = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) mx = std::max(mx, double(std::fabs(a[i]))), diff = std::max(diff, double(std::fabs(a[i] - b[i])));
  EXPECT_GT(mx, 0.1);
  EXPECT_LT(diff, 1e-5 * mx);
  EXPECT_EQ(ffn.histogram(0).total(), 20u * 200u);
}

// Counts at a fixed threshold equal the active counts the oracle executor measures on the same
// tokens (a separate code path: gate per batch, active set, stats), per layer. For ReLU the
// oracle is exact, so every layer sees the same input; for SiLU with t > 0 the oracle drops
// neurons, so only layer 0 sees the same input and the later layers agree only roughly.
TEST(Profile, CountsMatchOracleStatistics) {
  for (FfnActivation act : {FfnActivation::relu, FfnActivation::silu}) {
    auto m = load_synth(small(act, 5), std::string("counts_") + ffn_activation_name(act) + ".gguf");
    auto tokens = random_tokens(45, m->hp.n_vocab, 2);  // chunks of 16, 16, 13
    const float t = act == FfnActivation::relu ? 0.0f : 0.05f;
    Session s(*m, test_support::session_params(3, 32, 32));
    ProfileOptions o;
    o.n_ctx = 16;
    o.threshold = t;
    Profile p = run_profile(s, tokens, o);
    EXPECT_EQ(p.n_tokens, 45u);
    ASSERT_EQ(p.counts.size(), 3u);

    SessionParams sp = test_support::session_params(1, 32, 8);  // batches of 8 < kDenseBatch: the sparse path
    sp.sparse.mode = FfnMode::oracle;
    sp.sparse.threshold = t;
    Session so(*m, sp);
    for (size_t c = 0; c < 45; c += 16) {
      so.reset();
      so.eval(tokens.data() + c, static_cast<int64_t>(std::min<size_t>(16, 45 - c)));
    }
    const FfnSparsityStats& st = so.sparse_ffn()->stats();
    for (int64_t l = 0; l < 3; ++l) {
      double fired = 0;
      for (float v : p.counts[l]) fired += v;
      EXPECT_EQ(st.neurons[l], 45u * 200u);
      const bool same_input = act == FfnActivation::relu || l == 0;
      // float rounding differs between the batch sizes: a few ties at t may flip
      EXPECT_NEAR(fired, static_cast<double>(st.active[l]), same_input ? 0.002 * fired : 0.03 * fired) << "layer " << l;
      if (act == FfnActivation::relu) {
        EXPECT_GT(layer_sparsity(p, l), 0.3);
      }
    }
  }
}

// The profile's counting pass records predictor training samples (sparse/ffn_samples.hpp) that are
// the trainer's own pass's (collect_ffn_samples) on the same tokens, chunks and batches, bit for
// bit: one run over a corpus serves both.
TEST(Profile, SamplesRecordedWhileProfilingAreTheTrainersOwn) {
  auto m = load_synth(small(FfnActivation::relu, 7), "samples_relu.gguf");
  const auto tokens = random_tokens(45, m->hp.n_vocab, 3);  // chunks of 16, 16, 13
  Session s(*m, test_support::session_params(3, 16, 16));
  ProfileOptions o;
  o.n_ctx = 16;
  o.threshold = 0.0f;
  FfnSampleRecorder rec(m->hp.n_layer, m->hp.n_embd, m->hp.n_ff, 45, 20);
  run_profile(s, tokens, o, {}, &rec);
  const std::vector<LayerSamples> got = rec.take();

  ThreadPool pool(3);
  SampleOptions so;
  so.max_tokens = 20;
  so.n_ctx = 16;
  so.batch = 16;
  const std::vector<LayerSamples> want = collect_ffn_samples(*m, pool, tokens, so);
  ASSERT_EQ(got.size(), want.size());
  for (size_t l = 0; l < got.size(); ++l) {
    SCOPED_TRACE(l);
    EXPECT_EQ(got[l].n, 20);
    EXPECT_EQ(got[l].x, want[l].x);
    EXPECT_EQ(got[l].offsets, want[l].offsets);
    EXPECT_EQ(got[l].idx, want[l].idx);
    EXPECT_EQ(got[l].mass, want[l].mass);
    EXPECT_GT(got[l].idx.size(), 20u);  // neurons fired
  }
}

// Without a threshold (SiLU), each layer's counts use its quantile at the target sparsity: the
// measured sparsity is the target; the file round-trips; thresholds calibrated from the file
// reach the target in threshold mode on the same tokens.
TEST(Profile, PerLayerThresholdsHitTheTargetSparsity) {
  auto m = load_synth(small(FfnActivation::silu, 6), "auto.gguf");
  auto tokens = random_tokens(64, m->hp.n_vocab, 3);
  Session s(*m, test_support::session_params(2, 32, 32));
  ProfileOptions o;
  o.n_ctx = 32;
  o.threshold = -1.0f;
  o.sparsity = 0.6f;
  int calls = 0;
  Profile p = run_profile(s, tokens, o, [&](int64_t, int64_t, int) { ++calls; });
  EXPECT_EQ(calls, 4);  // 2 chunks x 2 passes
  EXPECT_FLOAT_EQ(p.sparsity, 0.6f);
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_NEAR(layer_sparsity(p, l), 0.6, 2e-3) << "layer " << l;
    EXPECT_FLOAT_EQ(p.thresholds[l], quantile_at(p.quantiles[l].data(), 1001, 0.6));
    EXPECT_GT(p.thresholds[l], 0.0f);
  }

  const std::string path = (temp_dir() / "auto.profile.gguf").string();
  write_profile(p, path);
  Profile r = read_profile(path);
  EXPECT_EQ(r.n_tokens, p.n_tokens);
  EXPECT_EQ(r.counts, p.counts);
  EXPECT_EQ(r.quantiles, p.quantiles);
  EXPECT_EQ(r.thresholds, p.thresholds);
  EXPECT_FLOAT_EQ(r.sparsity, 0.6f);
  EXPECT_EQ(calibrate_thresholds(path, 0.6), p.thresholds);

  // One pass (quantiles_only, what input sparsity reads): the same quantiles, tables and
  // thresholds, no counts.
  o.quantiles_only = true;
  calls = 0;
  const Profile q = run_profile(s, tokens, o, [&](int64_t, int64_t, int) { ++calls; });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(q.n_tokens, p.n_tokens);
  EXPECT_EQ(q.quantiles, p.quantiles);
  EXPECT_EQ(q.input_quantiles, p.input_quantiles);
  EXPECT_EQ(q.input_energy, p.input_energy);
  EXPECT_EQ(q.thresholds, p.thresholds);
  for (const auto& c : q.counts) EXPECT_EQ(*std::max_element(c.begin(), c.end()), 0.0f);
  o.quantiles_only = false;
  EXPECT_NE(profile_svg(p).find("<polyline"), std::string::npos);

  for (double target : {0.3, 0.7}) {
    SessionParams sp = test_support::session_params(2, 32, 32);
    sp.sparse.mode = FfnMode::threshold;
    sp.sparse.layer_thresholds = calibrate_thresholds(path, target);
    Session st(*m, sp);
    for (size_t c = 0; c < 64; c += 32) {
      st.reset();
      st.eval(tokens.data() + c, 32);  // 32 >= kDenseBatch: the dense kernels, masked
    }
    EXPECT_NEAR(st.sparse_ffn()->stats().sparsity(), target, 5e-3) << target;
  }
  EXPECT_THROW(calibrate_thresholds(m->file->path(), 0.5), Error);  // a model is not a profile
}

// Threshold mode computes down(mask(act(gate)) * up) with the layer's threshold, on the sparse
// path (short batches) and on the dense kernels (long batches): against a double reference.
TEST(ThresholdMode, MatchesMaskedDoubleReference) {
  auto m = load_synth(small(FfnActivation::silu, 8), "mask.gguf");
  const FfnWeights& w = m->layers[1].ffn;
  const int64_t d = m->hp.n_embd, nff = m->hp.n_ff;
  auto G = test_support::dequant_matrix(w.gate), U = test_support::dequant_matrix(w.up),
       D = test_support::dequant_matrix(w.down);
  std::vector<float> thr = {0.0f, 0.08f, 0.0f};
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t n : {1, 5, 20}) {
    std::vector<float> x(n * d), out(n * d);
    for (auto& v : x) v = nd(rng);
    ThreadPool pool(2);
    Workspace ws;
    ws.init(*m, 32, 32, 2);
    SparseFfnOptions so;
    so.mode = FfnMode::threshold;
    so.layer_thresholds = thr;
    SparseFfn ffn(*m, pool, so, 32);
    ffn.run(pool, 1, w, m->hp.act, x.data(), n, out.data(), ws);
    int64_t dropped = 0;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> h(nff);
      for (int64_t j = 0; j < nff; ++j) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < d; ++i) g += G[j * d + i] * x[t * d + i], u += U[j * d + i] * x[t * d + i];
        const double a = g / (1.0 + std::exp(-g));
        if (std::fabs(a) > thr[1]) h[j] = a * u;
        else ++dropped;
      }
      for (int64_t i = 0; i < d; ++i) {
        double r = 0;
        for (int64_t j = 0; j < nff; ++j) r += D[i * nff + j] * h[j];
        EXPECT_NEAR(out[t * d + i], r, 1e-4 * (1 + std::fabs(r))) << "n " << n << " t " << t << " i " << i;
      }
    }
    EXPECT_GT(dropped, n * nff / 10) << "the threshold drops too few neurons to test anything";
    EXPECT_EQ(ffn.stats().active[1], static_cast<uint64_t>(n * nff - dropped));
  }
}

// Thresholds stored in the model file (ember.sparse.thresholds) are read at load and used by
// threshold mode when no others are given; a wrong count is refused at load.
TEST(ThresholdMode, UsesThresholdsFromTheModelFile) {
  SynthOptions o = small(FfnActivation::silu, 9);
  gguf::Writer w = synth_model(o);
  w.set("ember.sparse.thresholds", gguf::Value::floats({0.01f, 0.02f, 0.5f}));
  const std::string path = (temp_dir() / "with_thresholds.gguf").string();
  w.write(path);
  auto m = load_model(path);
  EXPECT_EQ(m->gate_thresholds, (std::vector<float>{0.01f, 0.02f, 0.5f}));
  SessionParams sp = test_support::session_params(1, 32, 8);
  sp.sparse.mode = FfnMode::threshold;
  Session s(*m, sp);
  auto tokens = random_tokens(8, m->hp.n_vocab, 5);
  s.eval(tokens.data(), 8);
  const auto& st = s.sparse_ffn()->stats();
  EXPECT_LT(st.layer_sparsity(0), st.layer_sparsity(2));  // the higher threshold drops more

  w.set("ember.sparse.thresholds", gguf::Value::floats({0.01f, 0.02f}));
  w.write(path);
  EXPECT_THROW(load_model(path), Error);
  // Threshold mode without thresholds anywhere names what to do.
  auto plain = load_synth(o, "no_thresholds.gguf");
  EXPECT_THROW(Session(*plain, sp), Error);
}

// On the real model and corpus (skipped when either is missing): thresholds calibrated on a
// piece of calib.txt reach the target sparsity on held-out text from eval.txt.
TEST(ThresholdMode, CalibrationGeneralizesToHeldOutTextOnSmolLM2) {
  const std::string mp = test_support::model_path(test_support::kSmolLM2);
  const std::string calib = test_support::source_dir() + "/data/corpus/calib.txt";
  const std::string eval = test_support::source_dir() + "/data/corpus/eval.txt";
  if (mp.empty() || !std::filesystem::exists(calib) || !std::filesystem::exists(eval))
    GTEST_SKIP() << "needs models/" << test_support::kSmolLM2 << " and data/corpus (scripts/get_corpus.sh)";
  auto m = load_model(mp);
  Tokenizer tok(*m->file);
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str().substr(0, 20000);
  };
  auto calib_tokens = tok.encode(read(calib), false), eval_tokens = tok.encode(read(eval), false);
  ASSERT_GE(calib_tokens.size(), 384u);
  ASSERT_GE(eval_tokens.size(), 128u);
  Session s(*m, test_support::session_params(2, 256, 256));
  ProfileOptions o;
  o.n_ctx = 192;
  o.max_tokens = 384;
  o.sparsity = 0.5f;
  Profile p = run_profile(s, calib_tokens, o);
  const std::string path = (temp_dir() / "smollm2.profile.gguf").string();
  write_profile(p, path);
  SessionParams sp = test_support::session_params(2, 256, 256);
  sp.sparse.mode = FfnMode::threshold;
  sp.sparse.layer_thresholds = calibrate_thresholds(path, 0.5);
  Session st(*m, sp);
  st.eval(eval_tokens.data(), 128);
  const FfnSparsityStats& stats = st.sparse_ffn()->stats();
  EXPECT_NEAR(stats.sparsity(), 0.5, 0.06);
  for (int64_t l = 0; l < m->hp.n_layer; ++l) EXPECT_NEAR(stats.layer_sparsity(l), 0.5, 0.15) << "layer " << l;
}

// Gemma 3 (GeGLU, post-norms) runs the FFN executor too: the profile sees every token, and the
// per-layer thresholds reach their target in threshold mode.
TEST(Profile, Gemma3ArchitectureIsProfiledAndThresholded) {
  SynthOptions o = small(FfnActivation::silu, 10);
  o.arch = "gemma3";
  o.n_ff = 192;
  auto m = load_synth(o, "gemma3.gguf");
  ASSERT_EQ(m->hp.arch, "gemma3");
  auto tokens = random_tokens(40, m->hp.n_vocab, 6);
  Session s(*m, test_support::session_params(2, 64, 64));
  ProfileOptions po;
  po.n_ctx = 20;
  po.sparsity = 0.5f;
  Profile p = run_profile(s, tokens, po);
  EXPECT_EQ(p.n_tokens, 40u);
  for (int64_t l = 0; l < m->hp.n_layer; ++l) EXPECT_NEAR(layer_sparsity(p, l), 0.5, 3e-3) << "layer " << l;
  const std::string path = (temp_dir() / "gemma3.profile.gguf").string();
  write_profile(p, path);
  SessionParams sp = test_support::session_params(2, 64, 64);
  sp.sparse.mode = FfnMode::threshold;
  sp.sparse.layer_thresholds = calibrate_thresholds(path, 0.5);
  Session st(*m, sp);
  st.eval(tokens.data(), 20);
  st.reset();
  st.eval(tokens.data() + 20, 20);
  EXPECT_NEAR(st.sparse_ffn()->stats().sparsity(), 0.5, 5e-3);
}
