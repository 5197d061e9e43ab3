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
