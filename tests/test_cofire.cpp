// Neurons that fire together, laid out together (sparse/cofire.hpp): the clustered order keeps
// the hot-first bands, puts neurons of one firing pattern side by side, and the profiler's
// orders are the ones its recorded tokens give.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include "core/error.hpp"
#include "engine/profile_run.hpp"
#include "engine/session.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"
#include "sparse/cofire.hpp"
#include "sparse/reorder.hpp"
#include "support/session_params.hpp"
#include "synth/synth.hpp"

using namespace ember;

namespace {

// n neurons' firing over `tokens` tokens (words a neuron), each neuron's words set by fires(j, t).
template <class F>
std::vector<uint64_t> make_bits(int64_t n, int64_t tokens, const F& fires) {
  const int64_t words = (tokens + 63) / 64;
  std::vector<uint64_t> b(static_cast<size_t>(n * words), 0);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t t = 0; t < tokens; ++t)
      if (fires(j, t)) b[static_cast<size_t>(j * words + t / 64)] |= uint64_t(1) << (t % 64);
  return b;
}

}  // namespace

// 700 neurons (bands of 256, 256, 188), 300 tokens: pairs of neurons in the same band fire for the
// same tokens (a random tenth of them), the hot-first order keeps them apart. The clustered order
// holds each band's neurons in the band's place, every pair side by side, and a token's neurons
// past the first band in fewer runs; neurons that never fire keep their hot-first order at the
// end of their band.
TEST(Cofire, NeuronsThatFireTogetherBecomeNeighboursWithinTheirBand) {
  const int64_t n = 700, tokens = 300, words = (tokens + 63) / 64;
  std::mt19937 rng(3);
  std::vector<int32_t> hot_first(n);
  for (int64_t i = 0; i < n; ++i) hot_first[i] = static_cast<int32_t>((i * 389) % n);  // a scrambled hot order
  // Neuron at hot position i pairs with the one at position (band start) + (i - start + 128) % 256:
  // half a band apart. The last 40 positions never fire.
  std::vector<int64_t> pattern(static_cast<size_t>(n), -1);
  for (int64_t s = 0; s < n; s += kCofireBand) {
    const int64_t m = std::min(kCofireBand, n - s);
    for (int64_t i = 0; i < m; ++i) pattern[static_cast<size_t>(hot_first[s + i])] = s + std::min(i, (i + m / 2) % m);
  }
  std::vector<std::vector<char>> fire(static_cast<size_t>(n), std::vector<char>(tokens, 0));
  std::bernoulli_distribution p(0.1);
  std::vector<std::vector<char>> by_pattern(static_cast<size_t>(n), std::vector<char>(tokens, 0));
  for (auto& v : by_pattern)
    for (auto& c : v) c = p(rng);
  const auto fires = [&](int64_t j, int64_t t) {
    const int64_t pos = std::find(hot_first.begin(), hot_first.end(), j) - hot_first.begin();
    return pos < n - 40 && by_pattern[static_cast<size_t>(pattern[static_cast<size_t>(j)])][static_cast<size_t>(t)];
  };
  const std::vector<uint64_t> bits = make_bits(n, tokens, fires);
  const std::vector<int32_t> order = cofire_order(bits.data(), words, hot_first);
  ASSERT_TRUE(is_permutation(order, n));
  for (int64_t s = 0; s < n; s += kCofireBand) {
    const int64_t e = std::min(n, s + kCofireBand);
    EXPECT_EQ(std::set<int32_t>(order.begin() + s, order.begin() + e),
              std::set<int32_t>(hot_first.begin() + s, hot_first.begin() + e)) << "band at " << s;
  }
  EXPECT_EQ(order[0], hot_first[0]);  // each band's chain starts at its hottest neuron
  EXPECT_EQ(order[kCofireBand], hot_first[kCofireBand]);
  std::vector<int64_t> at(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) at[static_cast<size_t>(order[i])] = i;
  const auto silent = [&](int64_t j) { return std::find(hot_first.end() - 40, hot_first.end(), j) != hot_first.end(); };
  int64_t pairs = 0, apart = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = j + 1; k < n; ++k)
      if (pattern[static_cast<size_t>(k)] == pattern[static_cast<size_t>(j)] && !silent(j) && !silent(k)) {
        ++pairs;
        apart += std::abs(at[static_cast<size_t>(j)] - at[static_cast<size_t>(k)]) != 1;
      }
  EXPECT_GT(pairs, 300);
  EXPECT_EQ(apart, 0);
  // The silent neurons: the band's last 40 places, in hot-first order.
  EXPECT_TRUE(std::equal(order.end() - 40, order.end(), hot_first.end() - 40));
  const RunCount hot = count_runs(bits.data(), words, tokens, hot_first, kCofireBand);
  const RunCount clu = count_runs(bits.data(), words, tokens, order, kCofireBand);
  EXPECT_EQ(hot.neurons, clu.neurons);  // the same neurons past the first band
  EXPECT_GT(hot.neurons, 0);
  EXPECT_LE(2 * clu.runs, hot.runs + hot.runs / 10);  // pairs: about half the runs
  // A run is counted once per stretch of neighbours: one token firing positions 2, 3 and 5.
  const std::vector<int32_t> id = {0, 1, 2, 3, 4, 5};
  const std::vector<uint64_t> one = make_bits(6, 1, [](int64_t j, int64_t) { return j == 2 || j == 3 || j == 5; });
  EXPECT_EQ(count_runs(one.data(), 1, 1, id, 0).runs, 2);
  EXPECT_EQ(count_runs(one.data(), 1, 1, id, 3).runs, 2);
  EXPECT_EQ(count_runs(one.data(), 1, 1, id, 4).runs, 1);
  EXPECT_EQ(count_runs(one.data(), 1, 1, id, 4).neurons, 1);
  // Every other token: token 1 fires 0 and 1 (one run of two), token 0 fires 3 and 5.
  const std::vector<uint64_t> two = make_bits(6, 2, [](int64_t j, int64_t t) { return t == 1 ? j < 2 : j == 3 || j == 5; });
  EXPECT_EQ(count_runs(two.data(), 1, 2, id, 0, 1, 2).runs, 1);
  EXPECT_EQ(count_runs(two.data(), 1, 2, id, 0, 1, 2).neurons, 2);
  EXPECT_EQ(count_runs(two.data(), 1, 2, id, 0).runs, 3);
}

// The profiler's counting pass records the firing of the tokens a sample recorder of the same
// size keeps; each layer's order is cofire_order of those bits and the counts' hot-first order;
// the profile file keeps the orders, and one that is not a permutation is refused by name.
TEST(Cofire, ProfileOrdersComeFromTheTokensItRecords) {
  SynthOptions so;
  so.act = FfnActivation::relu;
  so.n_embd = 64;
  so.n_ff = 300;
  so.n_layer = 2;
  so.sparsity = 0.8f;
  so.gate_rank = 8;
  so.n_threads = 1;
  const auto dir = std::filesystem::temp_directory_path() / "ember-test-cofire";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "relu.gguf").string();
  synth_write(so, path);
  auto m = load_model(path);
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(90);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(m->hp.n_vocab));
  Session s(*m, test_support::session_params(2, 32, 32));
  ProfileOptions o;
  o.n_ctx = 32;
  o.threshold = 0.0f;
  o.cluster_tokens = 70;
  FfnSampleRecorder rec(m->hp.n_layer, m->hp.n_embd, m->hp.n_ff, 90, 70);
  const Profile p = run_profile(s, tokens, o, {}, &rec);
  const std::vector<LayerSamples> samples = rec.take();
  ASSERT_EQ(p.cluster_orders.size(), 2u);
  for (int64_t l = 0; l < 2; ++l) {
    SCOPED_TRACE(l);
    const LayerSamples& ls = samples[static_cast<size_t>(l)];
    ASSERT_EQ(ls.n, 70);
    std::vector<std::vector<char>> fired(static_cast<size_t>(so.n_ff), std::vector<char>(70, 0));
    for (int64_t t = 0; t < 70; ++t)
      for (uint32_t k = ls.offsets[t]; k < ls.offsets[t + 1]; ++k) fired[static_cast<size_t>(ls.idx[k])][t] = 1;
    const std::vector<uint64_t> bits = make_bits(so.n_ff, 70, [&](int64_t j, int64_t t) {
      return fired[static_cast<size_t>(j)][static_cast<size_t>(t)] != 0;
    });
    const std::vector<int32_t> want =
        cofire_order(bits.data(), 2, hot_first_permutation(p.counts[static_cast<size_t>(l)].data(), so.n_ff));
    EXPECT_EQ(p.cluster_orders[static_cast<size_t>(l)], want);
    EXPECT_NE(want, hot_first_permutation(p.counts[static_cast<size_t>(l)].data(), so.n_ff));
  }
  const std::string pf = (dir / "relu.profile.gguf").string();
  write_profile(p, pf);
  EXPECT_EQ(read_profile(pf).cluster_orders, p.cluster_orders);

  Profile bad = p;
  bad.cluster_orders[1][7] = bad.cluster_orders[1][8];
  write_profile(bad, pf);
  try {
    read_profile(pf);
    FAIL() << "an order with a neuron twice was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.1.ffn_cluster_order"), std::string::npos) << e.what();
  }
  // Without recorded tokens, no orders.
  o.cluster_tokens = 0;
  Session s2(*m, test_support::session_params(2, 32, 32));
  EXPECT_TRUE(run_profile(s2, tokens, o).cluster_orders.empty());
  std::filesystem::remove_all(dir);
}
