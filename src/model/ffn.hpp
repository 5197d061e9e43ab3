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
void dense_ffn(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n, float* out,
               float* gate_buf, float* up_buf, void* mm_scratch);

}  // namespace ember
