// Q4_0_R16, Q4_1_R16 and Q5_0_R16 (layout in r16/r16.hpp): repacking and the scalar reference
// kernels (the formats' table and the activations' layout: r16.cpp).
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {
namespace {

// Bytes of one block of a group: the 16 rows' scales (and mins, or fifth bits), then 256 bytes
// of nibbles.
template <class B>
constexpr size_t kGroupBlockBytes = kR16Rows * sizeof(B);  // 288 (Q4_0), 320 (Q4_1), 352 (Q5_0)
template <class B>
constexpr size_t kQsAt = kGroupBlockBytes<B> - 256;
template <class B>
constexpr bool kHasMin = std::is_same_v<B, BlockQ4_1>;
template <class B>
constexpr bool kHasQh = std::is_same_v<B, BlockQ5_0>;

template <class B>
void check_shape(int64_t rows, int64_t k) {
  EMBER_CHECK(rows > 0 && rows % kR16Rows == 0 && k > 0 && k % kQK == 0,
              "{}_R16 repacking needs a multiple of 16 rows and of 32 columns, got {} x {}",
              kHasMin<B> ? "Q4_1" : kHasQh<B> ? "Q5_0" : "Q4_0", rows, k);
}

// A Q5_0 block's 32 fifth bits (bit e: element e) as the R16 layout stores them (r16_qh_bit):
// element 16 s + 4c + i at bit r16_qh_bit(c, s) of byte i. A chunk's 4 bits x go to bit 0 of
// bytes 0..3 at once: x * 0x00204081 puts bit i at 8i (copies at i, i + 7, i + 14, i + 21, disjoint
// ranges, so no carries), and the mask keeps those.
uint32_t qh_to_r16(uint32_t qh) {
  uint32_t out = 0;
  for (int s = 0; s < 2; ++s)
    for (int c = 0; c < 4; ++c)
      out |= (((qh >> (16 * s + 4 * c)) & 15u) * 0x00204081u & 0x01010101u) << detail::r16_qh_bit(c, s);
  return out;
}
uint32_t qh_from_r16(uint32_t v) {
  uint32_t qh = 0;
  for (int s = 0; s < 2; ++s)
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 4; ++i) qh |= ((v >> (8 * i + detail::r16_qh_bit(c, s))) & 1u) << (16 * s + 4 * c + i);
  return qh;
}

// Calls f(plain block index, its row's group block, r) for every row r of every group and block.
template <class B, class F>
void for_each_block(int64_t rows, int64_t k, const F& f) {
  const int64_t nb = k / kQK;
  for (int64_t g = 0; g < rows / kR16Rows; ++g)
    for (int64_t b = 0; b < nb; ++b)
      for (int r = 0; r < kR16Rows; ++r) f((g * kR16Rows + r) * nb + b, (g * nb + b) * kGroupBlockBytes<B>, r);
}

// Where one row's block lives in its group: d (and m, or qh) in the arrays after the group
// block's start, qs in four chunks.
template <class B>
struct BlockPlaces {
  size_t d, m, qh, qs[4];
  BlockPlaces(size_t group, int r) : d(group + 2 * r), m(group + 32 + 2 * r), qh(group + 32 + 4 * r) {
    for (int c = 0; c < 4; ++c) qs[c] = group + kQsAt<B> + 64 * c + 4 * r;
  }
};

template <class B>
void repack(const void* src, int64_t rows, int64_t k, void* dst) {
  check_shape<B>(rows, k);
  const auto* in = static_cast<const B*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for_each_block<B>(rows, k, [&](int64_t plain, size_t group, int r) {
    const BlockPlaces<B> at(group, r);
    std::memcpy(out + at.d, &in[plain].d, 2);
    if constexpr (kHasMin<B>) std::memcpy(out + at.m, &in[plain].m, 2);
    if constexpr (kHasQh<B>) {
      uint32_t qh;
      std::memcpy(&qh, in[plain].qh, 4);
      qh = qh_to_r16(qh);
      std::memcpy(out + at.qh, &qh, 4);
    }
    for (int c = 0; c < 4; ++c) std::memcpy(out + at.qs[c], in[plain].qs + 4 * c, 4);
  });
}

template <class B>
void unpack(const void* src, int64_t rows, int64_t k, void* dst) {
  check_shape<B>(rows, k);
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<B*>(dst);
  for_each_block<B>(rows, k, [&](int64_t plain, size_t group, int r) {
    const BlockPlaces<B> at(group, r);
    std::memcpy(&out[plain].d, in + at.d, 2);
    if constexpr (kHasMin<B>) std::memcpy(&out[plain].m, in + at.m, 2);
    if constexpr (kHasQh<B>) {
      uint32_t v;
      std::memcpy(&v, in + at.qh, 4);
      v = qh_from_r16(v);
      std::memcpy(out[plain].qh, &v, 4);
    }
    for (int c = 0; c < 4; ++c) std::memcpy(out[plain].qs + 4 * c, in + at.qs[c], 4);
  });
}

// The reference: the AVX-512 kernels compute every output with the same operations in the same
// order (integer block dot, then one fused multiply-add per block, and for Q4_1 a second for
// the mins), so the two agree bit for bit.
template <class B>
void gemm_scalar(const detail::GemmArgs& a) {
  detail::r16_scalar<detail::R16Act, kQK, kGroupBlockBytes<B>>(
      a, [](const uint8_t* p, const detail::R16Act& x, int r, float acc) {
        int32_t s = kHasMin<B> ? 0 : x.c;
        for (int c = 0; c < 4; ++c)
          for (int j = 0; j < 4; ++j) {
            const uint8_t q = p[kQsAt<B> + 64 * c + 4 * r + j];
            int lo = q & 15, hi = q >> 4;
            if constexpr (kHasQh<B>) {
              const uint8_t qh = p[32 + 4 * r + j];
              lo |= ((qh >> detail::r16_qh_bit(c, 0)) & 1) << 4;
              hi |= ((qh >> detail::r16_qh_bit(c, 1)) & 1) << 4;
            }
            s += lo * x.qs[4 * c + j] + hi * x.qs[16 + 4 * c + j];
          }
        uint16_t h;
        std::memcpy(&h, p + 2 * r, 2);
        acc = std::fma(static_cast<float>(s), fp16_to_fp32(h) * x.d, acc);
        if constexpr (kHasMin<B>) {
          std::memcpy(&h, p + 32 + 2 * r, 2);
          acc = std::fma(fp16_to_fp32(h), x.s, acc);
        }
        return acc;
      });
}

}  // namespace

namespace detail {

void repack_q4_0_r16(const void* src, int64_t rows, int64_t k, void* dst) { repack<BlockQ4_0>(src, rows, k, dst); }
void repack_q4_1_r16(const void* src, int64_t rows, int64_t k, void* dst) { repack<BlockQ4_1>(src, rows, k, dst); }
void repack_q5_0_r16(const void* src, int64_t rows, int64_t k, void* dst) { repack<BlockQ5_0>(src, rows, k, dst); }
void unpack_q4_0_r16(const void* src, int64_t rows, int64_t k, void* dst) { unpack<BlockQ4_0>(src, rows, k, dst); }
void unpack_q4_1_r16(const void* src, int64_t rows, int64_t k, void* dst) { unpack<BlockQ4_1>(src, rows, k, dst); }
void unpack_q5_0_r16(const void* src, int64_t rows, int64_t k, void* dst) { unpack<BlockQ5_0>(src, rows, k, dst); }

void gemm_q4_0_r16_scalar(const GemmArgs& a) { gemm_scalar<BlockQ4_0>(a); }
void gemm_q4_1_r16_scalar(const GemmArgs& a) { gemm_scalar<BlockQ4_1>(a); }
void gemm_q5_0_r16_scalar(const GemmArgs& a) { gemm_scalar<BlockQ5_0>(a); }

}  // namespace detail
}  // namespace ember::cpu
