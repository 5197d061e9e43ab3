// exp on every lane of a float vector of either width (ops/cpu/simd_f32.hpp), the approximation
// ops/cpu/activation_impl.hpp describes, with its constants. Include it only inside an anonymous
// namespace, after activation_impl.hpp and simd_f32.hpp, as simd_f32.hpp says: each file keeps
// its own copy, compiled with its own contraction setting.
#pragma once

// exp on every lane, the approximation ops/cpu/activation_impl.hpp describes (its constants).
template <class V>
inline V exp_approx(V x) {
  using S = F32<V>;
  x = S::min(S::max(x, S::set1(kExpMin)), S::set1(kExpMax));
  const V n = S::round(S::mul(x, S::set1(kLog2e)));
  V r = S::fmadd(n, S::set1(-kLn2Hi), x);
  r = S::fmadd(n, S::set1(-kLn2Lo), r);
  V p = S::set1(kExpP[0]);
  for (int i = 1; i < 6; ++i) p = S::fmadd(p, r, S::set1(kExpP[i]));
  const V y = S::add(S::fmadd(p, S::mul(r, r), r), S::set1(1.0f));
  return S::mul(y, S::pow2(n));
}
