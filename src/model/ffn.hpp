// The FFN contract: what an FFN computes, written once, and the executors that compute it.
//
// Neuron j of an FFN (FfnWeights, gating as FfnGating):
//   firing value  a_j = act(gate_j . x)                  par, sym
//                 a_j = act(up_j . x + up_b_j)           none (no gate: OPT)
//   value         h_j = a_j * (up_j . x + up_b_j)        par  (SwiGLU, GeGLU, ReLU llama)
//                 h_j = a_j * act(up_j . x + up_b_j)     sym  (Bamboo)
//                 h_j = a_j                              none
//   out = sum_j h_j down_j + down_b
// A neuron whose firing value is 0 contributes exactly nothing (act(0) = 0 for every activation
// Ember runs, and every gating multiplies by a_j), so a sparse executor computes a_j first,
// keeps the neurons with |a_j| > threshold and computes h and down only for them: exact at
// threshold 0, an approximation above it. ffn_firing_values and ffn_neuron_values below are
// the rule; every executor (dense, sparse, predictor, the hybrid's CPU share and its devices,
// the profiler, the predictor trainer's sample recorder) calls them or says it does not run
// a gating (FfnExecutor::refusal, checked when a session is built).
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "core/thread_pool.hpp"
#include "model/model.hpp"

namespace ember {

struct Workspace;

// ---- the rule ------------------------------------------------------------------------------

// In place: a[t * stride + i] holds the product of row ids[i] of w.firing_matrix() with x[t]
// (ids null: row i) for t < n, i < cols; becomes the firing value a (adds up_b without a gate,
// then the activation).
void ffn_firing_values(const FfnWeights& w, cpu::Activation act, float* a, int64_t n, int64_t cols, int64_t stride,
                       const int32_t* ids);
// The firing test. a [n][cols] holds the firing values of neurons ids[0..cols) (ids null:
// 0..cols). Keeps the columns that fire (|a| > threshold) for at least one token, moved in
// place to the front of each row with the silent entries zeroed; writes their neuron ids to
// `active` and returns their count. `fired` counts the firing (token, neuron) pairs.
int64_t ffn_keep_firing(float* a, int64_t n, int64_t cols, const int32_t* ids, float threshold, int32_t* active,
                        uint64_t& fired);
// The firing test itself, for one firing value a: |a| > threshold (a NaN never fires).
inline bool ffn_fires(float a, float threshold) { return std::fabs(a) > threshold; }
// Whether a neuron's value needs its up product besides its firing value (every gated FFN).
inline bool ffn_needs_up(const FfnWeights& w) { return w.gated(); }
// In place: u[t * u_stride + i] holds the product of up row ids[i] with x[t] (not read without a
// gate); becomes the neuron value h from it and the firing value a[t * a_stride + i].
void ffn_neuron_values(const FfnWeights& w, cpu::Activation act, const float* a, int64_t a_stride, float* u,
                       int64_t u_stride, int64_t n, int64_t cols, const int32_t* ids);
// Whether the FFN's first half is one gated product (cpu::matmul_gated: par gating, no up bias,
// gate and up of one type): dense_ffn's fused case, and the experts' fused decode.
inline bool ffn_gated_product(const FfnWeights& w) {
  return w.gating == FfnGating::par && !w.up_b.valid() && w.gate.type == w.up.type;
}
// out[t] += down_b for n tokens (nothing without the bias).
void ffn_add_down_bias(const FfnWeights& w, float* out, int64_t n);

// ---- executors -----------------------------------------------------------------------------

// Replaces dense_ffn in a forward pass when set in Workspace::ffn (the neuron-sparse, hybrid,
// profiling and sample-recording executors). It computes the rule above, exactly or within a
// documented approximation, and may use the workspace's gate/up buffers.
class FfnExecutor {
 public:
  virtual ~FfnExecutor() = default;
  virtual void run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                   int64_t n, float* out, Workspace& ws) = 0;
  // Why this executor cannot run `model` (a gating, a bias, a weight type, a missing tensor it
  // does not handle), or empty when it can. Session checks it when it is built.
  virtual std::string refusal(const Model& model) const = 0;
  // Whether it also runs mixture-of-experts layers (run_moe, in place of moe_ffn); a model with
  // experts is refused to the executors that do not (model_moe_refusal).
  virtual bool takes_experts() const { return false; }
  virtual void run_moe(ThreadPool& pool, int64_t layer, const MoeWeights& moe, cpu::Activation act, const float* x,
                       int64_t n, float* out, Workspace& ws);
};

// The dense FFN in three steps, for executors that look at (or zero) the firing values on the
// way, over all n_ff neurons of n tokens in the workspace's buffers:
//   ffn_firing_all: a = firing values, n x n_ff in ws.gate (returned);
//   ffn_values_all: h from a (and up), n x n_ff in ws.up (returned); a is read, not changed;
//   ffn_down_all:   out = down h + down_b (down, or down_t over every neuron in files that
//                   only have it).
float* ffn_firing_all(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
                      Workspace& ws);
float* ffn_values_all(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
                      Workspace& ws);
void ffn_down_all(ThreadPool& pool, const FfnWeights& w, const float* h, int64_t n, float* out, Workspace& ws);

// Called on an FFN's neuron values h (rows x n_ff) before the down reads them, by executors that
// change them on the way (input sparsity zeroes the small ones).
using FfnValuesHook = std::function<void(float* h, int64_t rows, int64_t n_ff)>;

// out[t] = the FFN of x[t] for n tokens, every neuron (the steps above, or one fused dispatch of
// gate and up for a gated FFN without an up bias whose gate and up share a type); `values`, if
// given, sees the neuron values before the down.
void dense_ffn(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n, float* out,
               Workspace& ws, const FfnValuesHook& values = {});

}  // namespace ember
