// Float vectors of one width, for kernels written once for both SIMD levels: F32<__m256> names
// the AVX2 + FMA + F16C intrinsics, F32<__m512> the AVX-512 ones (where the file is compiled
// for AVX-512). A kernel templated on the vector type V runs the same sequence of operations at
// either width, so each width gives the bits its own hand-written copy gave. (The widths are
// keyed by their lane count: a vector type as a class template's argument loses its attributes.)
//
// Include it only inside an anonymous namespace of a *_avx2.cpp / *_avx512.cpp file, after
// <immintrin.h>: each file keeps its own instantiations, compiled with its own target and
// contraction flags (activation_avx512.cpp is built without contraction; a shared definition
// would let the linker hand it a fused copy from elsewhere, and break the one-definition rule
// across target flags).
#pragma once

template <int kLanes>
struct F32Lanes;

template <class V>
using F32 = F32Lanes<static_cast<int>(sizeof(V) / sizeof(float))>;

template <>
struct F32Lanes<8> {
  using V = __m256;
  using I = __m256i;
  static constexpr int kLanes = 8;
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V round(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V abs(V x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
  // a where m > 0, b elsewhere (m NaN: b).
  static V where_positive(V m, V a, V b) { return _mm256_blendv_ps(b, a, _mm256_cmp_ps(m, zero(), _CMP_GT_OQ)); }
  static V from_i32(I v) { return _mm256_cvtepi32_ps(v); }
  // The lanes' sum: the two halves added, then within the 128-bit half; their max the same way.
  static float reduce_add(V v) { return fold<_mm_add_ps, _mm_add_ss>(v); }
  static float reduce_max(V v) { return fold<_mm_max_ps, _mm_max_ss>(v); }
  template <__m128 (*op)(__m128, __m128), __m128 (*op_ss)(__m128, __m128)>
  static float fold(V v) {
    __m128 s = op(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = op(s, _mm_movehl_ps(s, s));
    s = op_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // 2^n for integral n in float range: n + 127 in the exponent field.
  static V pow2(V n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  // kLanes fp16 values, or kLanes bytes as unsigned integers.
  static V from_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V from_u8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};

#ifdef __AVX512F__
template <>
struct F32Lanes<16> {
  using V = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V round(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V abs(V x) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x); }
  static V where_positive(V m, V a, V b) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m, zero(), _CMP_GT_OQ), b, a); }
  static V from_i32(I v) { return _mm512_cvtepi32_ps(v); }
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  static V pow2(V n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static V from_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V from_u8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
};
#endif
