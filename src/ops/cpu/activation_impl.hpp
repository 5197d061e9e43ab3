// Internal to activation.cpp / activation_avx512.cpp: the constants of the exp approximation
// both evaluate, operation for operation, so that a value gets the same bits from the scalar
// function and from any lane of the vector one.
//
// exp(x): x clamped to [kExpMin, kExpMax] (so 2^n stays a normal float), n = nearest integer
// to x log2(e), r = x - n ln 2 in two steps (Cody-Waite), e^r = 1 + r + r^2 P(r) with P the
// degree-5 polynomial of Cephes' expf (about 1 ulp on [-ln2/2, ln2/2]), times 2^n built from
// its exponent bits.
#pragma once

namespace ember::cpu::detail {

constexpr float kExpMin = -87.0f, kExpMax = 88.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
// log1p(e) for e in [0, 1] (the logistic loss, activation.hpp): 2 atanh(s) with s = e / (2 + e) in
// [0, 1/3], as 2 s (1 + s^2 / 3 + s^4 / 5 + ... + s^12 / 13); the first term left out, s^14 / 15,
// is below 2^-26 of the sum.
constexpr float kLog1pP[7] = {1.0f / 13, 1.0f / 11, 1.0f / 9, 1.0f / 7, 1.0f / 5, 1.0f / 3, 1.0f};
constexpr float kGelu2A = 1.5957691216057308f, kGeluB = 0.044715f;  // 2 sqrt(2/pi), the cubic term

}  // namespace ember::cpu::detail
