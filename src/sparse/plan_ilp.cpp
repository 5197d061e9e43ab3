// The placement integer program, solved with COIN-OR CBC (CbcModel over OsiClp).
//
// Variables (binary), per layer l: x[l][g] for each neuron group g (hot first), y[l][e] for each
// expert of a mixture's layer, a[l] (attention and KV cache on the GPU), u[l] (the layer uses the
// GPU); z_f / z_a / z_e: some layer has GPU neurons / GPU attention / GPU experts (their scratch is
// allocated once); o: the output head on the GPU.
//
//   maximize  sum x[l][g] * saved(group) + y[l][e] * saved(expert) + a[l] * saved(attention)
//             - u[l] * fixed(l) + o * saved(head)
//   subject to
//     x[l][g] <= u[l],  y[l][e] <= u[l],  a[l] <= u[l],  u[l] <= a[l] + sum_g x[l][g] + sum_e y[l][e],
//     x[l][g] <= x[l][g-1]
//     sum_g |g| x[l][g] >= layer_min_neurons(l) * u[l]
//     u[l] <= z_f,  a[l] <= z_a,  y[l][e] <= z_e,  o <= z_a
//     memory: sum a[l] (attn + kv) + u[l] (predictor + 4 * (kGpuAlign - 1))
//             + sum_g |g| (gate + up + down + 4) x[l][g] + sum_e expert y[l][e]
//             + z_f ffn_scratch + z_a attn_scratch + z_e expert_scratch + o (head + logits) <= budget
// (u[l] <= z_f only in layers with neurons: a mixture's layer needs no FFN scratch.)
//
// The memory row over-counts the exact accounting (each of a layer's four FFN buffers pads by
// less than kGpuAlign), so every feasible point fits the budget exactly. The greedy plan is
// given to CBC as its first solution, and the better of the two (by the cost model) is returned,
// so the ILP is never worse than greedy, even when the time limit stops it early.
#include <CbcModel.hpp>
#include <CoinPackedMatrix.hpp>
#include <CoinPackedVector.hpp>
#include <OsiClpSolverInterface.hpp>
#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "sparse/plan.hpp"

namespace ember {

Plan plan_ilp(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts) {
  validate(m, dev, opts);
  Timer timer;
  Plan greedy = plan_greedy(m, dev, opts);
  const size_t nl = m.layers.size();
  constexpr double kScale = 1e6;  // objective in microseconds: coefficients near 1

  std::vector<NeuronGroups> groups(nl);
  std::vector<int> x0(nl), y0(nl), a_col(nl), u_col(nl);
  int n_cols = 0;
  for (size_t l = 0; l < nl; ++l) {
    groups[l] = neuron_groups(m.layers[l], opts.group_size);
    x0[l] = n_cols;
    n_cols += static_cast<int>(groups[l].size());
    y0[l] = n_cols;
    n_cols += static_cast<int>(m.layers[l].expert_p.size());
    a_col[l] = n_cols++;
    u_col[l] = n_cols++;
  }
  const int zf = n_cols++, za = n_cols++, ze = n_cols++, out = n_cols++;

  std::vector<double> obj(static_cast<size_t>(n_cols), 0.0), lo(static_cast<size_t>(n_cols), 0.0),
      hi(static_cast<size_t>(n_cols), 1.0);
  if (!opts.attention)  // a device without attention blocks: a[l] = 0
    for (size_t l = 0; l < nl; ++l) hi[static_cast<size_t>(a_col[l])] = 0.0;
  if (!opts.attention || m.output_weights_bytes == 0) hi[static_cast<size_t>(out)] = 0.0;  // the head stays
  if (!opts.experts)  // a device without experts: y[l][e] = 0
    for (size_t l = 0; l < nl; ++l)
      for (size_t e = 0; e < m.layers[l].expert_p.size(); ++e) hi[static_cast<size_t>(y0[l]) + e] = 0.0;
  CoinPackedMatrix rows(false, 0, 0);
  rows.setDimensions(0, n_cols);
  std::vector<double> row_lo, row_hi;
  auto add_row = [&](const CoinPackedVector& v, double l, double h) {
    rows.appendRow(v);
    row_lo.push_back(l);
    row_hi.push_back(h);
  };
  const double inf = COIN_DBL_MAX;
  CoinPackedVector memory;
  for (size_t l = 0; l < nl; ++l) {
    const PlanLayer& L = m.layers[l];
    const double nb = static_cast<double>(L.gate_row + L.up_row + L.down_row + L.bias_row + sizeof(int32_t));
    // CBC minimizes: the objective is the negated saving.
    obj[a_col[l]] = -kScale * attn_seconds_saved(dev, L);
    obj[u_col[l]] = kScale * layer_fixed_seconds(m, dev, L);
    memory.insert(a_col[l], static_cast<double>(L.attn_bytes + L.kv_bytes));
    memory.insert(u_col[l], static_cast<double>(L.predictor_bytes + 4 * (kGpuAlign - 1)));
    CoinPackedVector u_le_sum, min_row;
    u_le_sum.insert(u_col[l], 1.0);
    u_le_sum.insert(a_col[l], -1.0);
    min_row.insert(u_col[l], -static_cast<double>(layer_min_neurons(L, opts)));
    for (size_t e = 0; e < L.expert_p.size(); ++e) {
      const int c = y0[l] + static_cast<int>(e);
      obj[c] = -kScale * expert_seconds_saved(dev, L, e);
      memory.insert(c, static_cast<double>(L.expert_bytes));
      CoinPackedVector y_le_u, y_le_ze;
      y_le_u.insert(c, 1.0), y_le_u.insert(u_col[l], -1.0);
      y_le_ze.insert(c, 1.0), y_le_ze.insert(ze, -1.0);
      add_row(y_le_u, -inf, 0.0);
      add_row(y_le_ze, -inf, 0.0);
      u_le_sum.insert(c, -1.0);
    }
    for (size_t g = 0; g < groups[l].size(); ++g) {
      const int c = x0[l] + static_cast<int>(g);
      const double cnt = static_cast<double>(groups[l].count(g));
      obj[c] = -kScale * neuron_seconds_saved(m, dev, L, groups[l].mass[g], groups[l].count(g));
      memory.insert(c, cnt * nb);
      CoinPackedVector x_le_u;
      x_le_u.insert(c, 1.0);
      x_le_u.insert(u_col[l], -1.0);
      add_row(x_le_u, -inf, 0.0);
      u_le_sum.insert(c, -1.0);
      min_row.insert(c, cnt);
      // Hot first: a group only with every hotter one. Groups are sorted by mass, all of one
      // size but the last, so this removes only dominated choices (and the LP's symmetry).
      if (g > 0) {
        CoinPackedVector order;
        order.insert(c, 1.0);
        order.insert(c - 1, -1.0);
        add_row(order, -inf, 0.0);
      }
    }
    add_row(u_le_sum, -inf, 0.0);
    add_row(min_row, 0.0, inf);
    CoinPackedVector a_le_u, u_le_zf, a_le_za;
    a_le_u.insert(a_col[l], 1.0), a_le_u.insert(u_col[l], -1.0);
    u_le_zf.insert(u_col[l], 1.0), u_le_zf.insert(zf, -1.0);
    a_le_za.insert(a_col[l], 1.0), a_le_za.insert(za, -1.0);
    add_row(a_le_u, -inf, 0.0);
    if (!L.moe()) add_row(u_le_zf, -inf, 0.0);
    add_row(a_le_za, -inf, 0.0);
  }
  // The output head: its weights and logits, and the hidden state's buffers (the attention scratch).
  obj[out] = -kScale * output_seconds_saved(m, dev);
  memory.insert(out, static_cast<double>(gpu_output_bytes(m, opts)));
  CoinPackedVector out_le_za;
  out_le_za.insert(out, 1.0), out_le_za.insert(za, -1.0);
  add_row(out_le_za, -inf, 0.0);
  memory.insert(zf, static_cast<double>(gpu_ffn_scratch_bytes(m, opts)));
  memory.insert(za, static_cast<double>(gpu_attn_scratch_bytes(m, opts)));
  memory.insert(ze, static_cast<double>(gpu_expert_scratch_bytes(m, opts)));
  add_row(memory, -inf, static_cast<double>(dev.vram_budget));

  OsiClpSolverInterface solver;
  solver.messageHandler()->setLogLevel(0);
  solver.loadProblem(rows, lo.data(), hi.data(), obj.data(), row_lo.data(), row_hi.data());
  for (int c = 0; c < n_cols; ++c) solver.setInteger(c);

  // The greedy plan as a starting solution (it satisfies every row: its exact bytes fit and
  // the memory row's padding allowance covers the rest... unless the allowance itself does not
  // fit, in which case CBC rejects it and searches on its own).
  std::vector<double> start(static_cast<size_t>(n_cols), 0.0);
  double start_obj = 0;
  for (size_t l = 0; l < nl; ++l) {
    const auto& P = greedy.layers[l];
    std::vector<char> on(static_cast<size_t>(m.n_ff), 0);
    for (int32_t j : P.gpu_neurons) on[static_cast<size_t>(j)] = 1;
    for (size_t g = 0; g < groups[l].size(); ++g)
      start[x0[l] + g] = on[static_cast<size_t>(groups[l].order[groups[l].begin[g]])] ? 1.0 : 0.0;
    for (int32_t e : P.gpu_experts) start[static_cast<size_t>(y0[l] + e)] = start[ze] = 1.0;
    start[a_col[l]] = P.attn_gpu ? 1.0 : 0.0;
    start[u_col[l]] = greedy.layer_uses_gpu(l) ? 1.0 : 0.0;
    if (greedy.layer_uses_gpu(l) && !m.layers[l].moe()) start[zf] = 1.0;
    if (P.attn_gpu) start[za] = 1.0;
  }
  if (greedy.output_gpu) start[out] = start[za] = 1.0;
  for (int c = 0; c < n_cols; ++c) start_obj += start[c] * obj[c];

  CbcModel model(solver);
  model.setLogLevel(0);
  model.messageHandler()->setLogLevel(0);
  model.solver()->messageHandler()->setLogLevel(0);
  model.setUseElapsedTime(true);  // the limit is wall-clock time, what the user waits
  model.setMaximumSeconds(opts.time_limit);
  model.setAllowableFractionGap(opts.gap_tolerance);
  model.setBestSolution(start.data(), n_cols, start_obj, true);
  model.branchAndBound();

  Plan plan;
  plan.method = PlanMethod::ilp;
  plan.layers.resize(nl);
  const double* sol = model.bestSolution();
  bool usable = sol != nullptr;
  if (usable) {
    for (size_t l = 0; l < nl; ++l) {
      std::vector<char> chosen(groups[l].size());
      for (size_t g = 0; g < groups[l].size(); ++g) chosen[g] = sol[x0[l] + g] > 0.5;
      plan.layers[l].gpu_neurons = neurons_of_groups(groups[l], chosen);
      plan.layers[l].attn_gpu = sol[a_col[l]] > 0.5;
      for (size_t e = 0; e < m.layers[l].expert_p.size(); ++e)
        if (sol[y0[l] + static_cast<int>(e)] > 0.5) plan.layers[l].gpu_experts.push_back(static_cast<int32_t>(e));
      // The minimum-neuron row forces neurons for attention too; keep a layer's attention only
      // where the layer has its neurons (a rounding artefact otherwise).
      if (plan.layers[l].gpu_neurons.size() < static_cast<size_t>(layer_min_neurons(m.layers[l], opts)))
        plan.layers[l] = LayerPlacement{};
    }
    plan.output_gpu = sol[out] > 0.5;
    finish_plan(m, dev, opts, plan);
    usable = plan.gpu_bytes <= dev.vram_budget;  // by construction; checked, never assumed
  }
  const bool optimal = model.isProvenOptimal();
  const double incumbent = -model.getObjValue() / kScale, bound = -model.getBestPossibleObjValue() / kScale;
  if (!usable || plan.objective < greedy.objective) {
    // CBC found nothing better than the greedy start (or nothing at all): return greedy's
    // placement under the ILP's name, with the gap CBC proved against it.
    plan.layers = greedy.layers;
    plan.output_gpu = greedy.output_gpu;
    finish_plan(m, dev, opts, plan);
  }
  // "optimal": proven within opts.gap_tolerance; the gap says how close.
  plan.status = optimal ? "optimal" : model.isSecondsLimitReached() ? "time limit" : "stopped";
  const double best = std::max(incumbent, plan.objective);
  plan.gap = std::isfinite(bound) ? std::max(0.0, (bound - best) / std::max(std::fabs(bound), 1e-12)) : -1;
  plan.solve_seconds = timer.seconds();
  validate_plan(m, opts, plan, dev.vram_budget);
  return plan;
}

}  // namespace ember
