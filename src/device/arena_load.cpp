#include "device/arena_load.hpp"

#include "core/error.hpp"

namespace ember {

ArenaViews load_arena(const Model& model, const DeviceLoad& d, const DeviceArenaLayout& layout, ArenaWriter& w,
                      const char* device) {
  const PlanModel& pm = *d.pm;
  const Plan& plan = *d.plan;
  const size_t n_layers = model.layers.size();
  ArenaViews v;
  // A whole tensor written at `off` and its view there (an empty view stays empty).
  auto placed = [&](const TensorView& from, uint64_t off) {
    TensorView t = from;
    if (!from.valid()) return t;
    EMBER_CHECK(from.contiguous(), "{} device: {} is not contiguous", device, from.name);
    w.rows(from, nullptr, from.rows(), off);
    t.stride = 0;
    t.data = w.at(off);
    return t;
  };

  // FFN shares: the share's neurons' gate and up rows, their down rows (already in the share's
  // order), up bias, and their index list 0..n-1.
  v.shares.assign(n_layers, {});
  for (size_t l = 0; l < n_layers; ++l) {
    const auto& s = layout.layers[l];
    if (s.n == 0) continue;
    const FfnWeights& f = model.layers[l].ffn;
    const int32_t* ids = plan.layers[l].gpu_neurons.data();
    FfnWeights& sh = v.shares[l] = share_weights(f, d.down_rows[l], w.at(0), s);
    EMBER_CHECK((!sh.gate.valid() || sh.gate.row_size() == pm.layers[l].gate_row) &&
                    sh.up.row_size() == pm.layers[l].up_row && sh.down_t.row_size() == pm.layers[l].down_row,
                "{} device: layer {} row sizes differ from the plan's model (was the plan made for other weights?)",
                device, l);
    if (f.gate.valid()) w.rows(f.gate, ids, s.n, s.gate);
    w.rows(f.up, ids, s.n, s.up);
    w.rows(d.down_rows[l], nullptr, s.n, s.down);
    std::vector<int32_t> rows(static_cast<size_t>(s.n));
    for (int64_t i = 0; i < s.n; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    if (f.up_b.valid()) {
      std::vector<float> bias(static_cast<size_t>(s.n));
      for (int64_t i = 0; i < s.n; ++i) bias[static_cast<size_t>(i)] = reinterpret_cast<const float*>(f.up_b.data)[ids[i]];
      w.bytes(bias.data(), bias.size() * sizeof(float), s.up_b);
    }
    w.bytes(rows.data(), rows.size() * sizeof(int32_t), s.rows);
  }

  // Predictors: fc1 as it is, fc2's rows in predictor_row_order.
  v.fc1.assign(n_layers, {});
  v.fc2.assign(n_layers, {});
  for (size_t l = 0; l < n_layers; ++l) {
    const auto& P = layout.pred[l];
    if (!P.on) continue;
    const FfnWeights& f = model.layers[l].ffn;
    const std::vector<int32_t> order = predictor_row_order(plan, l, pm.n_ff);
    w.rows(f.fc1, nullptr, f.fc1.rows(), P.fc1);
    w.rows(f.fc2, order.data(), f.fc2.rows(), P.fc2);
    v.fc1[l] = matrix_view(f.fc1.type, w.at(P.fc1), f.fc1.rows(), f.fc1.cols());
    v.fc2[l] = matrix_view(f.fc2.type, w.at(P.fc2), f.fc2.rows(), f.fc2.cols());
  }

  // A mixture's experts, whole.
  v.experts.assign(n_layers, {});
  for (size_t l = 0; l < n_layers; ++l) {
    const auto& ids = plan.layers[l].gpu_experts;
    const MoeWeights& moe = w.file_layout() ? model.file_layer(l).moe : model.layers[l].moe;
    const auto& E = layout.experts[l];
    for (size_t i = 0; i < ids.size(); ++i) {
      const FfnWeights& from = moe.experts[static_cast<size_t>(ids[i])];
      FfnWeights c = from;
      c.gate = placed(from.gate, E.gate[i]);
      c.up = placed(from.up, E.up[i]);
      c.down = placed(from.down, E.down[i]);
      v.experts[l].push_back(c);
    }
  }

  // Attention layers: their attention and FFN-block tensors, in the layout's order.
  v.attn.assign(n_layers, {});
  for (size_t l = 0; l < n_layers; ++l) {
    const auto& at = layout.attn[l];
    if (!at.on) continue;
    const LayerWeights& F = w.file_layout() ? model.file_layer(l) : model.layers[l];
    LayerWeights& C = v.attn[l];
    const auto src = F.attention_tensors();
    const auto dst = C.attention_tensors();
    const auto fsrc = F.ffn_block_tensors();
    const auto fdst = C.ffn_block_tensors();
    size_t k = 0;
    for (size_t i = 0; i < src.size(); ++i) *dst[i] = placed(*src[i], at.tensors[k++]);
    for (size_t i = 0; i < fsrc.size(); ++i) *fdst[i] = placed(*fsrc[i], at.tensors[k++]);
  }

  // The output head.
  if (plan.output_gpu) {
    v.out.norm = placed(model.output_norm, layout.out_norm);
    v.out.norm_b = placed(model.output_norm_b, layout.out_norm_b);
    v.out.output = placed(w.file_layout() ? model.output_in_file() : model.output, layout.out_w);
  }
  return v;
}

}  // namespace ember
