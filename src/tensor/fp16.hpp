// IEEE half and bfloat16 conversions (scalar, exact round-to-nearest-even).
#pragma once
#include <bit>
#include <cstdint>

namespace ember {

inline float fp16_to_fp32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while (!(mant & 0x400));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t fp32_to_fp16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx >= 0x7f800000) return static_cast<uint16_t>(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));
  if (absx >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (absx < 0x38800000) {  // subnormal or zero in half
    // value = absx as float; half subnormal unit is 2^-24
    float v = std::bit_cast<float>(absx);
    // round to nearest even in units of 2^-24
    float scaled = v * 16777216.0f;  // exact (power of two)
    uint32_t m = static_cast<uint32_t>(scaled);
    float frac = scaled - static_cast<float>(m);
    if (frac > 0.5f || (frac == 0.5f && (m & 1))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant = absx & 0x7fffff;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = exp << 10 | mant >> 13;
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // may carry into exponent: correct
  return static_cast<uint16_t>(sign | h);
}

inline float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t fp32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace ember
