#include "model/ffn.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "model/workspace.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/sparse/sparse.hpp"
#include "ops/cpu/vec.hpp"

namespace ember {
namespace {

const float* floats(const TensorView& t) { return reinterpret_cast<const float*>(t.data); }

// v[t * stride + i] += b[ids[i]] (ids null: b[i]).
void add_bias_rows(const TensorView& b, float* v, int64_t n, int64_t cols, int64_t stride, const int32_t* ids) {
  if (!b.valid()) return;
  const float* bias = floats(b);
  for (int64_t t = 0; t < n; ++t) {
    float* row = v + t * stride;
    if (!ids) {
      cpu::add_f32(bias, row, cols);
      continue;
    }
    for (int64_t i = 0; i < cols; ++i) row[i] += bias[ids[i]];
  }
}

// f(row of t) for the n rows of cols values, stride apart (one call when they are contiguous).
template <class F>
void each_row(float* v, int64_t n, int64_t cols, int64_t stride, F f) {
  if (stride == cols) return f(v, n * cols);
  for (int64_t t = 0; t < n; ++t) f(v + t * stride, cols);
}

}  // namespace

void ffn_firing_values(const FfnWeights& w, cpu::Activation act, float* a, int64_t n, int64_t cols, int64_t stride,
                       const int32_t* ids) {
  if (!w.gated()) add_bias_rows(w.up_b, a, n, cols, stride, ids);
  each_row(a, n, cols, stride, [&](float* v, int64_t k) { cpu::activation_inplace(act, v, k); });
}

int64_t ffn_keep_firing(float* a, int64_t n, int64_t cols, const int32_t* ids, float threshold, int32_t* active,
                        uint64_t& fired) {
  // Column i is read before any column < i is written, so the in-place move is safe.
  int64_t na = 0;
  for (int64_t i = 0; i < cols; ++i) {
    bool any = false;
    for (int64_t t = 0; t < n; ++t) {
      float v = a[t * cols + i];
      if (ffn_fires(v, threshold)) {
        any = true;
        ++fired;
      } else {
        v = 0.0f;
      }
      a[t * cols + na] = v;
    }
    if (any) active[na++] = ids ? ids[i] : static_cast<int32_t>(i);
  }
  return na;
}

void ffn_neuron_values(const FfnWeights& w, cpu::Activation act, const float* a, int64_t a_stride, float* u,
                       int64_t u_stride, int64_t n, int64_t cols, const int32_t* ids) {
  if (!w.gated()) {  // h = a
    for (int64_t t = 0; t < n; ++t)
      if (u + t * u_stride != a + t * a_stride)
        std::memcpy(u + t * u_stride, a + t * a_stride, sizeof(float) * static_cast<size_t>(cols));
    return;
  }
  add_bias_rows(w.up_b, u, n, cols, u_stride, ids);
  if (w.gating == FfnGating::sym)
    each_row(u, n, cols, u_stride, [&](float* v, int64_t k) { cpu::activation_inplace(act, v, k); });
  for (int64_t t = 0; t < n; ++t) {
    const float* at = a + t * a_stride;
    float* ut = u + t * u_stride;
    for (int64_t i = 0; i < cols; ++i) ut[i] *= at[i];
  }
}

void ffn_add_down_bias(const FfnWeights& w, float* out, int64_t n) {
  if (!w.down_b.valid()) return;
  const int64_t n_embd = w.n_embd();
  for (int64_t t = 0; t < n; ++t) cpu::add_f32(floats(w.down_b), out + t * n_embd, n_embd);
}

float* ffn_firing_all(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
                      Workspace& ws) {
  const int64_t n_ff = w.n_ff();
  float* a = ws.gate.data();
  cpu::matmul(pool, w.firing_matrix(), x, n, a, ws.mm_scratch.data());
  ffn_firing_values(w, act, a, n, n_ff, n_ff, nullptr);
  return a;
}

float* ffn_values_all(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
                      Workspace& ws) {
  const int64_t n_ff = w.n_ff();
  float* h = ws.up.data();
  if (ffn_needs_up(w)) cpu::matmul(pool, w.up, x, n, h, ws.mm_scratch.data());
  ffn_neuron_values(w, act, ws.gate.data(), n_ff, h, n_ff, n, n_ff, nullptr);
  return h;
}

void ffn_down_all(ThreadPool& pool, const FfnWeights& w, const float* h, int64_t n, float* out, Workspace& ws) {
  const int64_t n_ff = w.n_ff(), n_embd = w.n_embd();
  if (w.down.valid()) {
    cpu::matmul(pool, w.down, h, n, out, ws.mm_scratch.data());
  } else {
    EMBER_CHECK(w.down_t.valid(), "dense FFN: the layer has neither ffn_down nor ffn_down_t");
    EMBER_CHECK(static_cast<int64_t>(ws.all_neurons.size()) >= n_ff && ws.axpy_scratch.size() > 0,
                "dense FFN: the workspace was not set up for a neuron-major down projection");
    std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * n_embd));
    cpu::sparse_axpy(pool, w.down_t, ws.all_neurons.data(), n_ff, h, n, n_ff, out, n_embd, ws.axpy_scratch.data());
  }
  ffn_add_down_bias(w, out, n);
}

void FfnExecutor::run_moe(ThreadPool&, int64_t layer, const MoeWeights&, cpu::Activation, const float*, int64_t,
                          float*, Workspace&) {
  fail("layer {} is a mixture of experts, which this FFN executor does not run", layer);
}

void dense_ffn(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n, float* out,
               Workspace& ws, const FfnValuesHook& values) {
  if (ffn_gated_product(w)) {
    // The par rule in one dispatch: gate and up share one activation quantization, and
    // act(gate) * up comes out of it (the same bits as the two steps: activations are exact
    // per value at every SIMD level).
    cpu::matmul_gated(pool, w.gate, w.up, act, x, n, ws.gate.data(), ws.up.data(), ws.mm_scratch.data());
    if (values) values(ws.gate.data(), n, w.n_ff());
    ffn_down_all(pool, w, ws.gate.data(), n, out, ws);
    return;
  }
  ffn_firing_all(pool, w, act, x, n, ws);
  float* h = ffn_values_all(pool, w, act, x, n, ws);
  if (values) values(h, n, w.n_ff());
  ffn_down_all(pool, w, h, n, out, ws);
}

}  // namespace ember
