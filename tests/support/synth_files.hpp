// Synth models written to a test's own temporary folder, and random token sequences for them.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "synth/synth.hpp"

namespace ember::test_support {

// <tmp>/ember-test-<name>, created.
inline std::filesystem::path test_temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("ember-test-" + name);
  std::filesystem::create_directories(dir);
  return dir;
}

// dir / (stem + "-" + the running test's name + ".gguf"): a file of this test's own. ctest runs
// the tests as parallel processes, and two tests writing, loading and removing one path raced
// (one's rename found the other's temporary file gone).
inline std::string own_test_file(const std::filesystem::path& dir, const std::string& stem) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = test ? std::string(test->test_suite_name()) + "." + test->name() : "outside-a-test";
  std::replace(name.begin(), name.end(), '/', '_');  // parameterized tests: Suite/Name/param
  return (dir / (stem + "-" + name + ".gguf")).string();
}

// Writes the synth model `o` as `file` in `dir` and loads it.
inline std::unique_ptr<Model> load_synth_in(const std::filesystem::path& dir, const SynthOptions& o,
                                            const std::string& file) {
  const std::string path = (dir / file).string();
  synth_write(o, path);
  return load_model(path);
}

// A small model for tests of attention on a device: llama (Q4_0, ReLU, 70 % sparse) or gemma3
// (F32, SiLU), 3 layers, n_embd 128, n_ff 288, 4 heads and 2 KV heads.
inline SynthOptions small_attention_synth(const std::string& arch, uint64_t seed, int threads) {
  SynthOptions o;
  o.arch = arch;
  o.act = arch == "gemma3" ? FfnActivation::silu : FfnActivation::relu;
  if (o.act == FfnActivation::relu) o.sparsity = 0.7f;
  o.type = arch == "llama" ? DType::Q4_0 : DType::F32;
  o.n_embd = 128, o.n_ff = 288, o.n_layer = 3, o.n_head = 4, o.n_head_kv = 2;
  o.seed = seed, o.n_threads = threads;
  return o;
}

// n token ids drawn uniformly from [0, n_vocab).
inline std::vector<int32_t> random_tokens(size_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n_vocab - 1));
  std::vector<int32_t> t(n);
  for (auto& x : t) x = pick(rng);
  return t;
}

}  // namespace ember::test_support
