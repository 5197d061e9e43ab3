// Q4_K_R16 (layout in r16.hpp): repacking and the scalar reference kernel.
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "ops/cpu/r16_kernels.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {
namespace {

constexpr size_t kGroupBlockBytes = kR16Rows * sizeof(BlockQ4_K);  // 2304
constexpr size_t kLoAt = 64, kHiAt = 64 + 128, kSubBlocksAt = 64 + 192, kSubBlockBytes = 256;

// Element i (0..255) of a Q4_K super-block: each 32 bytes of qs hold two sub-blocks, the low
// nibbles the first.
int q4_value(const BlockQ4_K& b, int i) {
  const uint8_t byte = b.qs[32 * (i / 64) + i % 32];
  return (i % 64) < 32 ? byte & 15 : byte >> 4;
}

}  // namespace

namespace detail {

void repack_q4_k_r16(const void* src, int64_t rows, int64_t k, void* dst) {
  const auto* in = static_cast<const BlockQ4_K*>(src);
  for_each_k_group_block("Q4_K_R16", rows, k, [&](int64_t g, int64_t b, int64_t nb) {
    uint8_t* o = static_cast<uint8_t*>(dst) + (g * nb + b) * kGroupBlockBytes;
    std::memset(o + kHiAt, 0, 64);
    for (int r = 0; r < kR16Rows; ++r) {
      const BlockQ4_K& blk = in[(g * kR16Rows + r) * nb + b];
      std::memcpy(o + 2 * r, &blk.d, 2);
      std::memcpy(o + 32 + 2 * r, &blk.dmin, 2);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        kquant_scale_min(blk.scales, j, sc, m);
        o[kLoAt + 16 * j + r] = static_cast<uint8_t>((sc & 15) | (m & 15) << 4);
        o[kHiAt + 16 * (j / 2) + r] |= static_cast<uint8_t>(((sc >> 4) | (m >> 4) << 2) << (4 * (j % 2)));
        uint8_t* sb = o + kSubBlocksAt + kSubBlockBytes * j + 4 * r;
        for (int c = 0; c < 4; ++c)
          for (int i = 0; i < 4; ++i)
            sb[64 * c + i] =
                static_cast<uint8_t>(q4_value(blk, 32 * j + 4 * c + i) | q4_value(blk, 32 * j + 16 + 4 * c + i) << 4);
      }
    }
  });
}

// The reference: the AVX-512 kernel does the same integer work and the same float operations
// in the same order, so the two agree bit for bit.
void gemm_q4_k_r16_scalar(const GemmArgs& a) {
  r16_scalar_k<kGroupBlockBytes>(a, [](const uint8_t* p, const BlockQ8_K& x, int r, float acc) {
    int32_t total = 0, mins = 0;
    for (int j = 0; j < 8; ++j) {
      const int lo = p[kLoAt + 16 * j + r], hi = p[kHiAt + 16 * (j / 2) + r] >> (4 * (j % 2));
      const int sc = (lo & 15) | (hi & 3) << 4, m = (lo >> 4) | ((hi >> 2) & 3) << 4;
      const uint8_t* sb = p + kSubBlocksAt + kSubBlockBytes * j + 4 * r;
      int32_t s = 0;
      for (int c = 0; c < 4; ++c)
        for (int i = 0; i < 4; ++i)
          s += (sb[64 * c + i] & 15) * x.qs[32 * j + 4 * c + i] + (sb[64 * c + i] >> 4) * x.qs[32 * j + 16 + 4 * c + i];
      total += s * sc;
      mins += m * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
    }
    uint16_t h, hm;
    std::memcpy(&h, p + 2 * r, 2);
    std::memcpy(&hm, p + 32 + 2 * r, 2);
    acc = std::fma(static_cast<float>(total), fp16_to_fp32(h) * x.d, acc);
    return std::fma(-static_cast<float>(mins), fp16_to_fp32(hm) * x.d, acc);
  });
}

}  // namespace detail
}  // namespace ember::cpu
