// Greedy placement: neuron groups, a mixture's experts, attention blocks and the output head by
// time saved per GPU byte, each taken
// when it still fits the budget (counted exactly); layers that end below the minimum neuron
// count are topped up when that fits, else left out and the pass repeated without them, as are
// layers whose saving does not pay for their synchronization.
#include <algorithm>

#include "core/error.hpp"
#include "core/timer.hpp"
#include "sparse/plan.hpp"

namespace ember {

namespace {

struct Item {
  double density;  // seconds saved per byte
  int32_t layer;   // -1: the output head
  int32_t group;   // -1: the layer's attention and KV cache, or an expert
  int32_t expert = -1;  // >= 0: this expert of a mixture's layer, whole
};

}  // namespace

Plan plan_greedy(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts) {
  validate(m, dev, opts);
  Timer timer;
  const size_t nl = m.layers.size();
  const uint64_t ffn_scratch = gpu_ffn_scratch_bytes(m, opts), attn_scratch = gpu_attn_scratch_bytes(m, opts);
  const uint64_t expert_scratch = gpu_expert_scratch_bytes(m, opts);
  const uint64_t out_bytes = gpu_output_bytes(m, opts);
  const bool head_can_go = opts.attention && m.output_weights_bytes > 0 && output_seconds_saved(m, dev) > 0;
  std::vector<NeuronGroups> groups(nl);
  for (size_t l = 0; l < nl; ++l) groups[l] = neuron_groups(m.layers[l], opts.group_size);

  std::vector<char> banned(nl, 0);
  std::vector<std::vector<char>> chosen(nl);
  std::vector<int64_t> count(nl);
  std::vector<char> attn(nl);
  std::vector<std::vector<int32_t>> experts(nl);
  bool out = false;
  for (;;) {
    uint64_t layers_total = 0;
    int64_t n_ffn_layers = 0, n_attn_layers = 0, n_expert_layers = 0;
    for (size_t l = 0; l < nl; ++l) chosen[l].assign(groups[l].size(), 0), count[l] = 0, attn[l] = 0, experts[l].clear();
    out = false;
    // The scratch and the head with nf FFN layers, na attention layers, ne expert layers and the
    // head or not.
    auto rest = [&](int64_t nf, int64_t na, int64_t ne, bool o) {
      // The FFN scratch also serves a predictor on the device (gpu_needs_ffn_scratch); the
      // attention scratch holds the hidden state for the head too (gpu_needs_attn_scratch).
      return (nf > 0 || (m.predicted && na > 0) ? ffn_scratch : 0) + (na > 0 || o ? attn_scratch : 0) +
             (ne > 0 ? expert_scratch : 0) + (o ? out_bytes : 0);
    };
    // Bytes of everything if layer l became (a, k neurons, x experts): the exact accounting,
    // incrementally.
    auto layer_bytes = [&](size_t l, bool a, int64_t k, int64_t x) { return gpu_layer_bytes(m.layers[l], a, k, x); };
    auto total_if = [&](size_t l, bool a, int64_t k, int64_t x) {
      const int64_t x0 = static_cast<int64_t>(experts[l].size());
      const uint64_t t = layers_total - layer_bytes(l, attn[l], count[l], x0) + layer_bytes(l, a, k, x);
      const int64_t nf = n_ffn_layers - (count[l] > 0) + (k > 0), na = n_attn_layers - attn[l] + a;
      const int64_t ne = n_expert_layers - (x0 > 0) + (x > 0);
      return t + rest(nf, na, ne, out);
    };
    auto apply = [&](size_t l, bool a, int64_t k, int64_t x) {
      const int64_t x0 = static_cast<int64_t>(experts[l].size());
      layers_total = layers_total - layer_bytes(l, attn[l], count[l], x0) + layer_bytes(l, a, k, x);
      n_ffn_layers += (k > 0) - (count[l] > 0);
      n_attn_layers += a - attn[l];
      n_expert_layers += (x > 0) - (x0 > 0);
      attn[l] = a;
      count[l] = k;
    };

    std::vector<Item> items;
    if (head_can_go) items.push_back({output_seconds_saved(m, dev) / static_cast<double>(out_bytes), -1, 0});
    for (size_t l = 0; l < nl; ++l) {
      if (banned[l]) continue;
      const PlanLayer& L = m.layers[l];
      const double nb = static_cast<double>(L.gate_row + L.up_row + L.down_row + L.bias_row + sizeof(int32_t));
      for (size_t g = 0; g < groups[l].size(); ++g)
        items.push_back({neuron_seconds_saved(m, dev, L, groups[l].mass[g], groups[l].count(g)) / (nb * groups[l].count(g)),
                         static_cast<int32_t>(l), static_cast<int32_t>(g)});
      if (opts.attention)
        items.push_back({attn_seconds_saved(dev, L) / static_cast<double>(L.attn_bytes + L.kv_bytes + 1),
                         static_cast<int32_t>(l), -1});
      if (opts.experts)
        for (size_t e = 0; e < L.expert_p.size(); ++e)
          items.push_back({expert_seconds_saved(dev, L, e) / static_cast<double>(L.expert_bytes),
                           static_cast<int32_t>(l), -1, static_cast<int32_t>(e)});
    }
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.density > b.density; });
    for (const Item& it : items) {
      if (it.layer < 0) {
        if (layers_total + rest(n_ffn_layers, n_attn_layers, n_expert_layers, true) <= dev.vram_budget) out = true;
        continue;
      }
      const size_t l = static_cast<size_t>(it.layer);
      const int64_t x = static_cast<int64_t>(experts[l].size());
      if (it.expert >= 0) {
        if (total_if(l, attn[l], count[l], x + 1) <= dev.vram_budget) {
          apply(l, attn[l], count[l], x + 1);
          experts[l].push_back(it.expert);
        }
      } else if (it.group < 0) {
        if (total_if(l, true, count[l], x) <= dev.vram_budget) apply(l, true, count[l], x);
      } else {
        const int64_t k = count[l] + groups[l].count(static_cast<size_t>(it.group));
        if (total_if(l, attn[l], k, x) <= dev.vram_budget) {
          apply(l, attn[l], k, x);
          chosen[l][static_cast<size_t>(it.group)] = 1;
        }
      }
    }

    // Minimum neuron count and net benefit per layer; a layer that fails is left out.
    bool restart = false;
    for (size_t l = 0; l < nl && !restart; ++l) {
      const int64_t x = static_cast<int64_t>(experts[l].size());
      if (!attn[l] && count[l] == 0 && x == 0) continue;
      const int64_t min_n = layer_min_neurons(m.layers[l], opts);
      for (size_t g = 0; g < groups[l].size() && count[l] < min_n; ++g) {
        if (chosen[l][g]) continue;
        const int64_t k = count[l] + groups[l].count(g);
        if (total_if(l, attn[l], k, x) > dev.vram_budget) break;
        apply(l, attn[l], k, x);
        chosen[l][g] = 1;
      }
      double saved = attn[l] ? attn_seconds_saved(dev, m.layers[l]) : 0.0;
      for (size_t g = 0; g < groups[l].size(); ++g)
        if (chosen[l][g]) saved += neuron_seconds_saved(m, dev, m.layers[l], groups[l].mass[g], groups[l].count(g));
      for (int32_t e : experts[l]) saved += expert_seconds_saved(dev, m.layers[l], static_cast<size_t>(e));
      if (count[l] < min_n || saved <= layer_fixed_seconds(m, dev, m.layers[l])) banned[l] = 1, restart = true;
    }
    if (!restart) break;
  }

  Plan plan;
  plan.method = PlanMethod::greedy;
  plan.output_gpu = out;
  plan.layers.resize(nl);
  for (size_t l = 0; l < nl; ++l) {
    plan.layers[l].attn_gpu = attn[l];
    plan.layers[l].gpu_neurons = neurons_of_groups(groups[l], chosen[l]);
    plan.layers[l].gpu_experts = experts[l];
    std::sort(plan.layers[l].gpu_experts.begin(), plan.layers[l].gpu_experts.end());
  }
  return finish_heuristic(m, dev, opts, std::move(plan), "heuristic", timer.seconds());
}

}  // namespace ember
