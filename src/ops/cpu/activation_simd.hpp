// The activations on float vectors of either width (ops/cpu/simd_f32.hpp): every lane computes
// what activate() in activation.cpp computes for its value, operation for operation, so that
// scalar and vector results have the same bits. Include it only inside an anonymous namespace of
// a file built without floating-point contraction (CMakeLists.txt), after simd_f32.hpp,
// activation_impl.hpp and exp_simd.hpp.
#pragma once

template <class V>
inline V activate_lanes(Activation a, V x) {
  using S = F32<V>;
  const V one = S::set1(1.0f);
  switch (a) {
    case Activation::silu: return S::div(x, S::add(one, exp_approx(S::sub(S::zero(), x))));
    case Activation::relu: return S::max(x, S::zero());
    case Activation::gelu_tanh: {
      const V z = S::mul(S::mul(S::set1(kGelu2A), x), S::add(one, S::mul(S::mul(S::set1(kGeluB), x), x)));
      return S::div(x, S::add(one, exp_approx(S::sub(S::zero(), z))));
    }
  }
  return x;
}

// out[i] = act(gate[i]) * up[i] for i < n (up null: out[i] = act(gate[i])); the last partial
// vector goes through zero-padded copies, so every element takes the same lane operations.
template <class V>
inline void activate_span(Activation a, const float* gate, const float* up, float* out, int64_t n) {
  using S = F32<V>;
  constexpr int L = S::kLanes;
  const auto one_vector = [&](const float* g, const float* u, float* o) {
    const V v = activate_lanes<V>(a, S::load(g));
    S::store(o, u ? S::mul(v, S::load(u)) : v);
  };
  int64_t i = 0;
  for (; i + L <= n; i += L) one_vector(gate + i, up ? up + i : nullptr, out + i);
  if (i == n) return;
  alignas(64) float g[L] = {}, u[L] = {}, o[L];
  const int64_t left = n - i;
  for (int64_t j = 0; j < left; ++j) g[j] = gate[i + j], u[j] = up ? up[i + j] : 0.f;
  one_vector(g, up ? u : nullptr, o);
  for (int64_t j = 0; j < left; ++j) out[i + j] = o[j];
}

// One vector of logistic_loss (activation.hpp): the loss terms and scale dL/dz, operation for
// operation as logistic_term in activation.cpp.
template <class V>
inline V logistic_lanes(V z, V pw, V scale, V& grad) {
  using S = F32<V>;
  const V one = S::set1(1.0f);
  const V e = exp_approx(S::sub(S::zero(), S::abs(z)));
  const V r = S::div(one, S::add(one, e));
  const V sig = S::where_positive(S::sub(S::zero(), z), S::mul(e, r), r);
  const V s = S::div(e, S::add(S::set1(2.0f), e)), w = S::mul(s, s);
  V p = S::set1(kLog1pP[0]);
  for (int i = 1; i < 7; ++i) p = S::fmadd(p, w, S::set1(kLog1pP[i]));
  const V l1p = S::mul(S::add(s, s), p);
  const V pos_loss = S::mul(pw, S::add(S::max(S::sub(S::zero(), z), S::zero()), l1p));
  const V neg_loss = S::add(S::max(z, S::zero()), l1p);
  grad = S::mul(scale, S::where_positive(pw, S::mul(pw, S::sub(sig, one)), sig));
  return S::where_positive(pw, pos_loss, neg_loss);
}

template <class V>
inline float logistic_loss_span(const float* z, const float* pw, float scale, float* grad, int64_t n) {
  using S = F32<V>;
  constexpr int L = S::kLanes;
  const V sc = S::set1(scale);
  V sum = S::zero(), g;
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    sum = S::add(sum, logistic_lanes<V>(S::load(z + i), S::load(pw + i), sc, g));
    S::store(grad + i, g);
  }
  float total = S::reduce_add(sum);
  if (i == n) return total;
  alignas(64) float zt[L] = {}, wt[L] = {}, gt[L], lt[L];
  const int64_t left = n - i;
  for (int64_t j = 0; j < left; ++j) zt[j] = z[i + j], wt[j] = pw[i + j];
  S::store(lt, logistic_lanes<V>(S::load(zt), S::load(wt), sc, g));
  S::store(gt, g);
  for (int64_t j = 0; j < left; ++j) grad[i + j] = gt[j], total += lt[j];
  return total;
}
