// Predictor training samples on disk (sparse/samples_file.hpp): what `ember profile --samples`
// writes is what `ember train-predictor --from-samples` trains on, bit for bit; bad files are
// clear errors.
#include "sparse/samples_file.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "gguf/writer.hpp"
#include "synth/synth.hpp"
#include "support/errors.hpp"

using namespace ember;

namespace {

std::filesystem::path dir() {
  auto d = std::filesystem::temp_directory_path() / "ember-test-samples";
  std::filesystem::create_directories(d);
  return d;
}

std::unique_ptr<Model> relu_model() {
  SynthOptions o;
  o.act = FfnActivation::relu;
  o.sparsity = 0.8f;
  o.n_embd = 64;
  o.n_ff = 160;
  o.n_layer = 2;
  o.seed = 3;
  o.n_threads = 1;
  const std::string path = (dir() / "relu.gguf").string();
  synth_write(o, path);
  return load_model(path);
}

std::vector<LayerSamples> collect(const Model& m, ThreadPool& pool, std::vector<float> layer_thresholds = {}) {
  std::vector<int32_t> tokens(300);
  std::mt19937 rng(8);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % m.hp.n_vocab);
  SampleOptions so;
  so.max_tokens = 120;
  so.n_ctx = 100;
  so.layer_thresholds = std::move(layer_thresholds);
  return collect_ffn_samples(m, pool, tokens, so);
}

}  // namespace

TEST(SamplesFile, RoundTripTrainsTheSamePredictor) {
  auto m = relu_model();
  ThreadPool pool(2);
  const auto samples = collect(*m, pool);
  const std::string path = (dir() / "s.gguf").string();
  write_samples_file(path, "relu", samples);
  const auto back = read_samples_file(path, m->hp);
  ASSERT_EQ(back.size(), samples.size());
  for (size_t l = 0; l < samples.size(); ++l) {
    EXPECT_EQ(back[l].n, 120);
    EXPECT_EQ(back[l].x, samples[l].x);
    EXPECT_EQ(back[l].offsets, samples[l].offsets);
    EXPECT_EQ(back[l].idx, samples[l].idx);
    EXPECT_EQ(back[l].mass, samples[l].mass);
    EXPECT_GT(samples[l].idx.size(), 0u);
  }
  PredictorTrainOptions o;
  o.min_rank = o.max_rank = 8;
  o.epochs = 1;
  o.type = DType::F32;
  const LayerPredictor a = train_layer_predictor(pool, samples[1], o), b = train_layer_predictor(pool, back[1], o);
  EXPECT_EQ(a.fc1, b.fc1);
  EXPECT_EQ(a.fc2, b.fc2);
  EXPECT_EQ(a.threshold, b.threshold);
}

TEST(SamplesFile, PerLayerThresholdsDecideWhatFires) {
  auto m = relu_model();
  ThreadPool pool(1);
  const auto base = collect(*m, pool);
  // A threshold above every activation in layer 1 leaves it with no firing neuron; layer 0 keeps
  // threshold 0, as with no per-layer thresholds.
  const auto high = collect(*m, pool, {0.0f, 1e30f});
  EXPECT_EQ(high[0].idx, base[0].idx);
  EXPECT_TRUE(high[1].idx.empty());
  const std::string path = (dir() / "empty_layer.gguf").string();
  write_samples_file(path, "relu", high);
  EXPECT_TRUE(read_samples_file(path, m->hp)[1].idx.empty());
  EXPECT_NE(test_support::error_of([&] { collect(*m, pool, {0.0f}); }).find("per-layer thresholds"), std::string::npos);
}

TEST(SamplesFile, BadFilesAreClearErrors) {
  auto m = relu_model();
  ThreadPool pool(1);
  const auto samples = collect(*m, pool);
  const std::string path = (dir() / "s2.gguf").string();
  write_samples_file(path, "relu", samples);
  Hparams other = m->hp;
  other.n_ff += 16;
  EXPECT_NE(test_support::error_of([&] { read_samples_file(path, other); }).find("this one has"), std::string::npos);
  // A model file is not a samples file.
  EXPECT_NE(test_support::error_of([&] { read_samples_file((dir() / "relu.gguf").string(), m->hp); })
                .find("not a samples file"),
            std::string::npos);
  // Offsets that run backwards, and neuron ids out of range.
  for (int bad = 0; bad < 2; ++bad) {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("ember-samples"));
    w.set("ember.samples.n_layer", gguf::Value::u64(1));
    w.set("ember.samples.n_embd", gguf::Value::u64(4));
    w.set("ember.samples.n_ff", gguf::Value::u64(8));
    std::vector<uint8_t> x(2 * 4 * 4, 0), off(3 * 4), ids(2 * 4), mass(2 * 4, 0);
    const int32_t o[3] = {0, bad == 0 ? 2 : 1, bad == 0 ? 1 : 2}, id[2] = {3, bad == 0 ? 4 : 9};
    std::memcpy(off.data(), o, sizeof o);
    std::memcpy(ids.data(), id, sizeof id);
    w.add_tensor("blk.0.samples_x", DType::F32, {4, 2}, x);
    w.add_tensor("blk.0.samples_offsets", DType::I32, {3}, off);
    w.add_tensor("blk.0.samples_ids", DType::I32, {2}, ids);
    w.add_tensor("blk.0.samples_mass", DType::F32, {2}, mass);
    const std::string p = (dir() / "bad.gguf").string();
    w.write(p);
    Hparams hp;
    hp.n_layer = 1, hp.n_embd = 4, hp.n_ff = 8;
    const std::string err = test_support::error_of([&] { read_samples_file(p, hp); });
    EXPECT_NE(err.find(bad == 0 ? "not a valid offset list" : "holds neuron 9"), std::string::npos) << err;
  }
}
