// Scalar reference dot products for Q5_0, Q5_1 and the K-quants (Q2_K .. Q6_K): integer sums per (sub-)block,
// one float accumulator, as gemm/gemm_scalar.cpp does for the other types.
#include <cstring>

#include "ops/cpu/gemm/gemm_table.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

template <class WB>
void unpack5(const WB& b, int q[kQK]) {  // 5-bit unsigned values of a Q5_0 / Q5_1 block
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = (b.qs[j] & 0x0F) | static_cast<int>((qh >> j) & 1) << 4;
    q[j + kQK / 2] = (b.qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
  }
}

float dot_q5_0(int64_t k, const uint8_t* w, const uint8_t* x) {
  const auto* a = reinterpret_cast<const BlockQ5_0*>(w);
  const auto* b = reinterpret_cast<const BlockQ8_0*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k / kQK; ++i) {
    int q[kQK], s = 0;
    unpack5(a[i], q);
    for (int j = 0; j < kQK; ++j) s += (q[j] - 16) * b[i].qs[j];
    sum += static_cast<float>(s) * (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d));
  }
  return sum;
}

float dot_q5_1(int64_t k, const uint8_t* w, const uint8_t* x) {
  const auto* a = reinterpret_cast<const BlockQ5_1*>(w);
  const auto* b = reinterpret_cast<const BlockQ8_1*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k / kQK; ++i) {
    int q[kQK], s = 0;
    unpack5(a[i], q);
    for (int j = 0; j < kQK; ++j) s += q[j] * b[i].qs[j];
    sum += static_cast<float>(s) * (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d)) +
           fp16_to_fp32(a[i].m) * fp16_to_fp32(b[i].s);
  }
  return sum;
}

// Q4_K / Q5_K: sum_j d*sc_j*(q.x)_j - dmin*m_j*(sum x)_j, the sums of x from the Q8_K bsums.
template <class WB>
float dot_k45(int64_t k, const uint8_t* w, const uint8_t* x) {
  const auto* a = reinterpret_cast<const WB*>(w);
  const auto* b = reinterpret_cast<const BlockQ8_K*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    int isum = 0, msum = 0;
    for (int c = 0; c < 4; ++c) {
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * c + h;
        uint8_t sc, m;
        kquant_scale_min(a[i].scales, j, sc, m);
        int s = 0;
        for (int l = 0; l < 32; ++l) {
          int q = h == 0 ? a[i].qs[32 * c + l] & 0x0F : a[i].qs[32 * c + l] >> 4;
          if constexpr (sizeof(WB) == sizeof(BlockQ5_K)) q |= ((a[i].qh[l] >> j) & 1) << 4;
          s += q * b[i].qs[32 * j + l];
        }
        isum += s * sc;
        msum += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
      }
    }
    sum += fp16_to_fp32(a[i].d) * b[i].d * static_cast<float>(isum) -
           fp16_to_fp32(a[i].dmin) * b[i].d * static_cast<float>(msum);
  }
  return sum;
}

// Q2_K: sum_g d*sc_g*(q.x)_g - dmin*m_g*(sum x)_g over the 16 sub-blocks of 16 (= the bsums).
// Q3_K: sum_g d*s_g*(q.x)_g with signed q. Element e = 128n + 32j + l as in quant.hpp.
template <class WB>
float dot_q23(int64_t k, const uint8_t* w, const uint8_t* x) {
  constexpr bool kQ3 = sizeof(WB) == sizeof(BlockQ3_K);
  const auto* a = reinterpret_cast<const WB*>(w);
  const auto* b = reinterpret_cast<const BlockQ8_K*>(x);
  float sum = 0.f;
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    int isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) {
        const int n = e / 128, j = (e % 128) / 32, l = e % 32;
        int q = (a[i].qs[32 * n + l] >> (2 * j)) & 3;
        if constexpr (kQ3) q -= (a[i].hmask[l] >> (4 * n + j)) & 1 ? 0 : 4;
        s += q * b[i].qs[e];
      }
      if constexpr (kQ3) {
        isum += s * q3_k_scale(a[i].scales, g);
      } else {
        isum += s * (a[i].scales[g] & 0xF);
        msum += (a[i].scales[g] >> 4) * b[i].bsums[g];
      }
    }
    if constexpr (kQ3) {
      sum += fp16_to_fp32(a[i].d) * b[i].d * static_cast<float>(isum);
    } else {
      sum += fp16_to_fp32(a[i].d) * b[i].d * static_cast<float>(isum) -
             fp16_to_fp32(a[i].dmin) * b[i].d * static_cast<float>(msum);
    }
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

void add_gemm_q5_kquant_scalar(GemmTable& t) {
  t.add(SimdLevel::scalar, DType::Q5_0, {&gemm_by_dot<dot_q5_0>});
  t.add(SimdLevel::scalar, DType::Q5_1, {&gemm_by_dot<dot_q5_1>});
  t.add(SimdLevel::scalar, DType::Q4_K, {&gemm_by_dot<dot_k45<BlockQ4_K>>});
  t.add(SimdLevel::scalar, DType::Q5_K, {&gemm_by_dot<dot_k45<BlockQ5_K>>});
  t.add(SimdLevel::scalar, DType::Q2_K, {&gemm_by_dot<dot_q23<BlockQ2_K>>});
  t.add(SimdLevel::scalar, DType::Q3_K, {&gemm_by_dot<dot_q23<BlockQ3_K>>});
  t.add(SimdLevel::scalar, DType::Q6_K, {&gemm_by_dot<dot_q6_k>});
}

}  // namespace ember::cpu::detail
