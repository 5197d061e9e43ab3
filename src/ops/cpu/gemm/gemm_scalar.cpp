// Scalar reference dot products: plain loops, integer sums per block, one float accumulator.
#include "ops/cpu/gemm/gemm_table.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

float dot_f32(int64_t k, const uint8_t* w, const uint8_t* x) {
  const auto* a = reinterpret_cast<const float*>(w);
  const auto* b = reinterpret_cast<const float*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k; ++i) sum += a[i] * b[i];
  return sum;
}

float dot_f16(int64_t k, const uint8_t* w, const uint8_t* x) {
  const auto* a = reinterpret_cast<const uint16_t*>(w);
  const auto* b = reinterpret_cast<const float*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k; ++i) sum += fp16_to_fp32(a[i]) * b[i];
  return sum;
}

float dot_bf16(int64_t k, const uint8_t* w, const uint8_t* x) {
  const auto* a = reinterpret_cast<const uint16_t*>(w);
  const auto* b = reinterpret_cast<const float*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k; ++i) sum += bf16_to_fp32(a[i]) * b[i];
  return sum;
}

float dot_q8_0(int64_t k, const uint8_t* w, const uint8_t* x) {
  const auto* a = reinterpret_cast<const BlockQ8_0*>(w);
  const auto* b = reinterpret_cast<const BlockQ8_0*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k / kQK; ++i) {
    int s = 0;
    for (int j = 0; j < kQK; ++j) s += a[i].qs[j] * b[i].qs[j];
    sum += static_cast<float>(s) * (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d));
  }
  return sum;
}

float dot_q4_0(int64_t k, const uint8_t* w, const uint8_t* x) {
  const auto* a = reinterpret_cast<const BlockQ4_0*>(w);
  const auto* b = reinterpret_cast<const BlockQ8_0*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k / kQK; ++i) {
    int s = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      s += ((a[i].qs[j] & 0x0F) - 8) * b[i].qs[j];
      s += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + kQK / 2];
    }
    sum += static_cast<float>(s) * (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d));
  }
  return sum;
}

float dot_q4_1(int64_t k, const uint8_t* w, const uint8_t* x) {
  const auto* a = reinterpret_cast<const BlockQ4_1*>(w);
  const auto* b = reinterpret_cast<const BlockQ8_1*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k / kQK; ++i) {
    int s = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      s += (a[i].qs[j] & 0x0F) * b[i].qs[j];
      s += (a[i].qs[j] >> 4) * b[i].qs[j + kQK / 2];
    }
    sum += static_cast<float>(s) * (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d)) +
           fp16_to_fp32(a[i].m) * fp16_to_fp32(b[i].s);
  }
  return sum;
}

float dot_q6_k(int64_t k, const uint8_t* w, const uint8_t* x) {
  const auto* a = reinterpret_cast<const BlockQ6_K*>(w);
  const auto* b = reinterpret_cast<const BlockQ8_K*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    int8_t q[kQK_K];
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = a[i].ql + 64 * half;
      const uint8_t* qh = a[i].qh + 32 * half;
      int8_t* qq = q + 128 * half;
      for (int l = 0; l < 32; ++l) {
        qq[l] = static_cast<int8_t>(((ql[l] & 0x0F) | ((qh[l] >> 0) & 3) << 4) - 32);
        qq[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) - 32);
        qq[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
        qq[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
      }
    }
    int s = 0;
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sg = 0;
      for (int j = 0; j < 16; ++j) sg += q[16 * g + j] * b[i].qs[16 * g + j];
      s += sg * a[i].scales[g];
    }
    sum += static_cast<float>(s) * (fp16_to_fp32(a[i].d) * b[i].d);
  }
  return sum;
}


}  // namespace

void add_gemm_scalar(GemmTable& t) {
  t.add(SimdLevel::scalar, DType::F32, {&gemm_by_dot<dot_f32>});
  t.add(SimdLevel::scalar, DType::F16, {&gemm_by_dot<dot_f16>});
  t.add(SimdLevel::scalar, DType::BF16, {&gemm_by_dot<dot_bf16>});
  t.add(SimdLevel::scalar, DType::Q8_0, {&gemm_by_dot<dot_q8_0>});
  t.add(SimdLevel::scalar, DType::Q4_0, {&gemm_by_dot<dot_q4_0>});
  t.add(SimdLevel::scalar, DType::Q4_1, {&gemm_by_dot<dot_q4_1>});
  t.add(SimdLevel::scalar, DType::Q6_K, {&gemm_by_dot<dot_q6_k>});
}

}  // namespace ember::cpu::detail
