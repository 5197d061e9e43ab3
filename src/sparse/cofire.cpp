#include "sparse/cofire.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.hpp"
#include "model/ffn.hpp"
#include "sparse/reorder.hpp"

namespace ember {

FiringRecord::FiringRecord(int64_t n_layer, int64_t n_ff, int64_t total, int64_t max_tokens)
    : spread_(total, max_tokens), n_ff_(n_ff), words_((spread_.kept() + 63) / 64),
      bits_(static_cast<size_t>(n_layer), std::vector<uint64_t>(static_cast<size_t>(n_ff * words_), 0)),
      next_(static_cast<size_t>(n_layer), 0) {}

void FiringRecord::record(int64_t layer, const float* a, int64_t n, float threshold) {
  spread_.batch(layer, n);
  uint64_t* b = bits_[static_cast<size_t>(layer)].data();
  int64_t& next = next_[static_cast<size_t>(layer)];
  for (int64_t t = 0; t < n; ++t) {
    if (!spread_.keep(t)) continue;
    EMBER_CHECK(next < spread_.kept(), "firing record: more tokens than the {} kept", spread_.kept());
    const float* at = a + t * n_ff_;
    const uint64_t bit = uint64_t(1) << (next % 64);
    uint64_t* w = b + next / 64;
    for (int64_t j = 0; j < n_ff_; ++j)
      if (ffn_fires(at[j], threshold)) w[j * words_] |= bit;
    ++next;
  }
}

namespace {

int64_t ones(const uint64_t* a, int64_t words) {
  int64_t c = 0;
  for (int64_t i = 0; i < words; ++i) c += std::popcount(a[i]);
  return c;
}
int64_t both(const uint64_t* a, const uint64_t* b, int64_t words) {
  int64_t c = 0;
  for (int64_t i = 0; i < words; ++i) c += std::popcount(a[i] & b[i]);
  return c;
}

}  // namespace

std::vector<int32_t> cofire_order(const uint64_t* bits, int64_t words, const std::vector<int32_t>& hot_first,
                                  int64_t band) {
  EMBER_CHECK(band >= 1, "cofire order: band of {} neurons", band);
  const int64_t n = static_cast<int64_t>(hot_first.size());
  std::vector<int32_t> order;
  order.reserve(hot_first.size());
  std::vector<int64_t> fired;
  std::vector<char> placed;
  for (int64_t s = 0; s < n; s += band) {
    const int64_t m = std::min(band, n - s);
    const int32_t* idx = hot_first.data() + s;
    const auto row = [&](int64_t i) { return bits + static_cast<int64_t>(idx[i]) * words; };
    fired.assign(static_cast<size_t>(m), 0);
    for (int64_t i = 0; i < m; ++i) fired[i] = ones(row(i), words);
    placed.assign(static_cast<size_t>(m), 0);
    int64_t cur = 0;
    for (int64_t k = 0; k < m; ++k) {
      placed[cur] = 1;
      order.push_back(idx[cur]);
      // The unplaced neuron most like cur (cosine of their fired sets); none alike: the hottest.
      int64_t best = -1;
      double best_sim = 0.0;
      for (int64_t j = 0; j < m; ++j) {
        if (placed[j]) continue;
        if (best < 0) best = j;  // the hottest unplaced, unless one fires alike
        if (fired[cur] == 0 || fired[j] == 0) continue;
        const double sim = static_cast<double>(both(row(cur), row(j), words)) /
                           std::sqrt(static_cast<double>(fired[cur]) * static_cast<double>(fired[j]));
        if (sim > best_sim) best_sim = sim, best = j;
      }
      cur = best;
    }
  }
  return order;
}

CofireOrders cofire_orders(ThreadPool& pool, const FiringRecord& rec, const std::vector<std::vector<float>>& counts) {
  const int64_t L = static_cast<int64_t>(counts.size()), n_ff = rec.n_ff();
  for (int64_t l = 0; l < L; ++l)
    EMBER_CHECK(static_cast<int64_t>(counts[static_cast<size_t>(l)].size()) == n_ff,
                "layer {}: {} counts for {} neurons", l, counts[static_cast<size_t>(l)].size(), n_ff);
  CofireOrders r;
  r.orders.resize(static_cast<size_t>(L));
  std::vector<RunCount> hot(static_cast<size_t>(L)), clustered(static_cast<size_t>(L));
  pool.parallel_for(L, 1, [&](int64_t l0, int64_t l1, int) {
    for (int64_t l = l0; l < l1; ++l) {
      const size_t i = static_cast<size_t>(l);
      const std::vector<int32_t> hf = hot_first_permutation(counts[i].data(), n_ff);
      const uint64_t* bits = rec.bits(l);
      r.orders[i] = cofire_order(bits, rec.words(), hf);
      std::vector<uint64_t> even(bits, bits + n_ff * rec.words());
      for (uint64_t& w : even) w &= 0x5555555555555555ull;  // bit t: token t; the even ones
      const std::vector<int32_t> fitted = cofire_order(even.data(), rec.words(), hf);
      hot[i] = count_runs(bits, rec.words(), rec.tokens(), hf, n_ff / 10, 1, 2);
      clustered[i] = count_runs(bits, rec.words(), rec.tokens(), fitted, n_ff / 10, 1, 2);
    }
  });
  for (size_t i = 0; i < hot.size(); ++i) {
    r.hot_first.runs += hot[i].runs, r.hot_first.neurons += hot[i].neurons;
    r.clustered.runs += clustered[i].runs, r.clustered.neurons += clustered[i].neurons;
  }
  return r;
}

RunCount count_runs(const uint64_t* bits, int64_t words, int64_t tokens, const std::vector<int32_t>& order, int64_t kept,
                    int64_t first, int64_t step) {
  RunCount r;
  for (int64_t t = first; t < tokens; t += step) {
    const uint64_t bit = uint64_t(1) << (t % 64);
    bool prev = false;
    for (size_t i = static_cast<size_t>(std::max<int64_t>(kept, 0)); i < order.size(); ++i) {
      const bool on = (bits[static_cast<int64_t>(order[i]) * words + t / 64] & bit) != 0;
      r.neurons += on;
      r.runs += on && !prev;
      prev = on;
    }
  }
  return r;
}

}  // namespace ember
