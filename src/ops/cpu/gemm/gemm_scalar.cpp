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

}  // namespace

void add_gemm_scalar(GemmTable& t) {
  t.add(SimdLevel::scalar, DType::F32, {&gemm_by_dot<dot_f32>});
  t.add(SimdLevel::scalar, DType::F16, {&gemm_by_dot<dot_f16>});
  t.add(SimdLevel::scalar, DType::BF16, {&gemm_by_dot<dot_bf16>});
  t.add(SimdLevel::scalar, DType::Q8_0, {&gemm_by_dot<dot_q8_0>});
  t.add(SimdLevel::scalar, DType::Q4_0, {&gemm_by_dot<dot_q4_0>});
  t.add(SimdLevel::scalar, DType::Q4_1, {&gemm_by_dot<dot_q4_1>});
}

}  // namespace ember::cpu::detail
