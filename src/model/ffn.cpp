#include "model/ffn.hpp"

#include <cstring>

#include "core/error.hpp"
#include "model/forward.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/sparse.hpp"
#include "ops/cpu/vec.hpp"

namespace ember {
namespace {

const float* floats(const TensorView& t) { return reinterpret_cast<const float*>(t.data); }

// Rows of gate and up through the gating; h ends in gate_buf (or up_buf for gating none).
float* ffn_hidden(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
                  float* gate_buf, float* up_buf, void* mm_scratch) {
  const int64_t n_ff = w.up.rows();
  if (w.gating == FfnGating::par && !w.up_b.valid() && w.gate.type == w.up.type) {
    // SwiGLU/GeGLU: gate and up in one dispatch sharing one activation quantization.
    cpu::matmul_gated(pool, w.gate, w.up, act, x, n, gate_buf, up_buf, mm_scratch);
    return gate_buf;
  }
  if (w.gating != FfnGating::none) cpu::matmul(pool, w.gate, x, n, gate_buf, mm_scratch);
  cpu::matmul(pool, w.up, x, n, up_buf, mm_scratch);
  ffn_combine(w, act, gate_buf, up_buf, n, n_ff);
  return gate_buf;
}

void add_down_bias(const FfnWeights& w, float* out, int64_t n, int64_t n_embd) {
  if (!w.down_b.valid()) return;
  for (int64_t t = 0; t < n; ++t) cpu::add_f32(floats(w.down_b), out + t * n_embd, n_embd);
}

}  // namespace

void ffn_combine(const FfnWeights& w, cpu::Activation act, float* gate_buf, float* up_buf, int64_t n, int64_t n_ff) {
  if (w.up_b.valid())
    for (int64_t t = 0; t < n; ++t) cpu::add_f32(floats(w.up_b), up_buf + t * n_ff, n_ff);
  switch (w.gating) {
    case FfnGating::par:
      cpu::gated_activation(act, gate_buf, up_buf, gate_buf, n * n_ff);
      break;
    case FfnGating::sym:
      cpu::activation_inplace(act, up_buf, n * n_ff);
      cpu::gated_activation(act, gate_buf, up_buf, gate_buf, n * n_ff);
      break;
    case FfnGating::none:
      cpu::activation_inplace(act, up_buf, n * n_ff);
      std::memcpy(gate_buf, up_buf, sizeof(float) * static_cast<size_t>(n * n_ff));
      break;
  }
}

void dense_ffn(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n, float* out,
               float* gate_buf, float* up_buf, void* mm_scratch) {
  EMBER_CHECK(w.down.valid(), "dense FFN: this layer has only the neuron-major ffn_down_t; use the workspace form");
  float* h = ffn_hidden(pool, w, act, x, n, gate_buf, up_buf, mm_scratch);
  cpu::matmul(pool, w.down, h, n, out, mm_scratch);
  add_down_bias(w, out, n, w.down.rows());
}

void dense_ffn(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n, float* out,
               Workspace& ws) {
  if (w.down.valid()) {
    dense_ffn(pool, w, act, x, n, out, ws.gate.data(), ws.up.data(), ws.mm_scratch.data());
    return;
  }
  EMBER_CHECK(w.down_t.valid(), "dense FFN: the layer has neither ffn_down nor ffn_down_t");
  const int64_t n_ff = w.down_t.rows(), n_embd = w.down_t.cols();
  EMBER_CHECK(static_cast<int64_t>(ws.all_neurons.size()) >= n_ff && ws.axpy_scratch.size() > 0,
              "dense FFN: the workspace was not set up for a neuron-major down projection");
  float* h = ffn_hidden(pool, w, act, x, n, ws.gate.data(), ws.up.data(), ws.mm_scratch.data());
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * n_embd));
  cpu::sparse_axpy(pool, w.down_t, ws.all_neurons.data(), n_ff, h, n, n_ff, out, n_embd, ws.axpy_scratch.data());
  add_down_bias(w, out, n, n_embd);
}

}  // namespace ember
