#include "ops/cpu/r16.hpp"

#include <cmath>
#include <cstring>

#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "ops/cpu/r16_kernels.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {
namespace {

constexpr size_t kGroupBlockBytes = kR16Rows * sizeof(BlockQ4_0);  // 288

void check_shape(int64_t rows, int64_t k) {
  EMBER_CHECK(rows > 0 && rows % kR16Rows == 0 && k > 0 && k % kQK == 0,
              "Q4_0_R16 repacking needs a multiple of 16 rows and of 32 columns, got {} x {}", rows, k);
}

// Calls f(plain block of row r, group block bytes, r) for every row r of group g and block b.
template <class F>
void for_each_block(int64_t rows, int64_t k, const F& f) {
  const int64_t nb = k / kQK;
  for (int64_t g = 0; g < rows / kR16Rows; ++g)
    for (int64_t b = 0; b < nb; ++b)
      for (int r = 0; r < kR16Rows; ++r)
        f((g * kR16Rows + r) * nb + b, (g * nb + b) * kGroupBlockBytes, r);
}

}  // namespace

bool r16_fast() { return simd_level() == SimdLevel::avx512; }

DType r16_type(DType t) {
  switch (t) {
    case DType::Q4_0: return DType::Q4_0_R16;
    case DType::Q6_K: return DType::Q6_K_R16;
    default: return t;
  }
}

void repack_r16(DType t, const void* src, int64_t rows, int64_t k, void* dst) {
  switch (t) {
    case DType::Q4_0: repack_q4_0_r16(src, rows, k, dst); return;
    case DType::Q6_K: repack_q6_k_r16(src, rows, k, dst); return;
    default: fail("no 16-row repacked layout for {}", dtype_name(t));
  }
}

void repack_q4_0_r16(const void* src, int64_t rows, int64_t k, void* dst) {
  check_shape(rows, k);
  const auto* in = static_cast<const BlockQ4_0*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for_each_block(rows, k, [&](int64_t plain, size_t group, int r) {
    std::memcpy(out + group + 2 * r, &in[plain].d, 2);
    for (int c = 0; c < 4; ++c) std::memcpy(out + group + 32 + 64 * c + 4 * r, in[plain].qs + 4 * c, 4);
  });
}

void unpack_q4_0_r16(const void* src, int64_t rows, int64_t k, void* dst) {
  check_shape(rows, k);
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<BlockQ4_0*>(dst);
  for_each_block(rows, k, [&](int64_t plain, size_t group, int r) {
    std::memcpy(&out[plain].d, in + group + 2 * r, 2);
    for (int c = 0; c < 4; ++c) std::memcpy(out[plain].qs + 4 * c, in + group + 32 + 64 * c + 4 * r, 4);
  });
}

namespace detail {

void prepare_r16(const void* q8_0_row, void* out, int64_t k) {
  const auto* in = static_cast<const BlockQ8_0*>(q8_0_row);
  auto* o = static_cast<R16Act*>(out);
  for (int64_t b = 0; b < k / kQK; ++b) {
    int32_t sum = 0;
    for (int i = 0; i < kQK; ++i) sum += in[b].qs[i];
    o[b].d = fp16_to_fp32(in[b].d);
    o[b].c = -8 * sum;
    std::memcpy(o[b].qs, in[b].qs, kQK);
  }
}

// The reference: the AVX-512 kernel computes every output with the same operations in the same
// order (integer block dot, then one fused multiply-add per block), so the two agree bit for bit.
void gemm_q4_0_r16_scalar(const GemmArgs& a) {
  const int64_t nb = a.k / kQK;
  for (int64_t g = 0; g < a.nrows / kR16Rows; ++g) {
    const uint8_t* wg = a.w + g * kR16Rows * a.w_stride;
    for (int64_t t = 0; t < a.ntok; ++t) {
      const auto* x = reinterpret_cast<const R16Act*>(a.x + t * a.x_stride);
      for (int r = 0; r < kR16Rows; ++r) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* p = wg + b * kGroupBlockBytes;
          uint16_t h;
          std::memcpy(&h, p + 2 * r, 2);
          int32_t s = x[b].c;
          for (int c = 0; c < 4; ++c)
            for (int j = 0; j < 4; ++j) {
              const uint8_t q = p[32 + 64 * c + 4 * r + j];
              s += (q & 15) * x[b].qs[4 * c + j] + (q >> 4) * x[b].qs[16 + 4 * c + j];
            }
          acc = std::fma(static_cast<float>(s), fp16_to_fp32(h) * x[b].d, acc);
        }
        a.y[t * a.y_stride + g * kR16Rows + r] = acc;
      }
    }
  }
}

}  // namespace detail
}  // namespace ember::cpu
