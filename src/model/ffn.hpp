// The feed-forward block of a layer. The dense form is here; sparse and hybrid executors
// compute the same function over a subset of neurons.
#pragma once
#include <cstdint>

#include "core/thread_pool.hpp"
#include "model/model.hpp"

namespace ember {

struct Workspace;

// Replaces dense_ffn in a forward pass when set in Workspace::ffn (the neuron-sparse and hybrid
// executors). It must compute the same function: out[t] = down(act(gate x[t]) * up x[t]),
// exactly or within a documented approximation, and may use the workspace's gate/up buffers.
class FfnExecutor {
 public:
  virtual ~FfnExecutor() = default;
  virtual void run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                   int64_t n, float* out, Workspace& ws) = 0;
};

// out[t] = down( act(gate(x[t])) * up(x[t]) ) for n tokens. gate_buf/up_buf hold n * n_ff floats.
// Every gating (par, sym, none) and the biases of FfnWeights are honoured; down must be present
// (a layer with only the neuron-major down_t needs the Workspace overload).
void dense_ffn(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n, float* out,
               float* gate_buf, float* up_buf, void* mm_scratch);
// The same with the workspace's buffers; a layer without down (PowerInfer's files carry only
// down_t) multiplies by down_t with an axpy over every neuron (ws.all_neurons, ws.axpy_scratch).
void dense_ffn(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n, float* out,
               Workspace& ws);

// h[t][j] = the neuron values of FfnWeights::gating for all n_ff neurons, from the gate and up
// projections already in gate_buf / up_buf (up_b not yet added); written to gate_buf.
void ffn_combine(const FfnWeights& w, cpu::Activation act, float* gate_buf, float* up_buf, int64_t n, int64_t n_ff);

}  // namespace ember
