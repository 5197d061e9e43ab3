// A synth model and its tokenizer, written and loaded once for a test suite (from its
// SetUpTestSuite) and removed after it; and the greedy generation settings the suites share.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/generator.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::test_support {

struct SynthSuite {
  std::string path;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;

  void open(const SynthOptions& o, const std::string& name) {
    // Per process: ctest runs each test of a suite in its own process, several at once.
    path = ::testing::TempDir() + name + "-" + std::to_string(getpid()) + ".gguf";
    synth_write(o, path);
    model = load_model(path);
    tok = std::make_unique<Tokenizer>(*model->file);
  }
  void close() {
    tok.reset();
    model.reset();
    std::remove(path.c_str());
  }
};

// Greedy, n tokens (end-of-generation tokens ignored).
inline GenerateParams greedy(int64_t n) {
  GenerateParams g;
  g.sampling.temperature = 0;
  g.max_tokens = n;
  g.ignore_eos = true;
  return g;
}

// n token ids below n_vocab from a small LCG: the same for a seed.
inline std::vector<int32_t> tokens_from(uint32_t seed, size_t n, int64_t n_vocab) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    t[i] = static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(n_vocab));
  }
  return t;
}

}  // namespace ember::test_support
