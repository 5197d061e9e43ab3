// Q8_0_R16 (layout in r16/r16.hpp): repacking, unpacking and the scalar reference kernel.
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"
#include "ops/cpu/r16/words_sse2.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

constexpr size_t kGroupBlockBytes = kR16Rows * sizeof(BlockQ8_0);  // 544: 16 scales, 8 chunks of 64
constexpr size_t kQsAt = 32;

// Calls f(plain block, group block, r) for every row r of every 16-row group and block;
// kQsAt + 64 c + 4 r is where row r's bytes 4c .. 4c + 3 go.
template <class F>
void for_each_block(int64_t rows, int64_t k, const F& f) {
  EMBER_CHECK(rows > 0 && rows % kR16Rows == 0 && k > 0 && k % kQK == 0,
              "Q8_0_R16 repacking needs a multiple of 16 rows and of 32 columns, got {} x {}", rows, k);
  const int64_t nb = k / kQK;
  for (int64_t g = 0; g < rows / kR16Rows; ++g)
    for (int64_t b = 0; b < nb; ++b)
      for (int r = 0; r < kR16Rows; ++r) f((g * kR16Rows + r) * nb + b, (g * nb + b) * kGroupBlockBytes, r);
}

}  // namespace

// Four rows at a time on 128-bit vectors (SSE2): each row's 32 values offset by 128, its 4-byte
// words transposed with the other three rows' so that word c of rows 4q .. 4q + 3 is one store.
void repack_q8_0_r16(const void* src, int64_t rows, int64_t k, void* dst) {
  const auto* in = static_cast<const BlockQ8_0*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for_each_block(rows, k, [&](int64_t plain, size_t group, int r) {
    std::memcpy(out + group + 2 * r, &in[plain].d, 2);
    if (r % 4 != 3) return;  // the four rows' values once the fourth is reached
    const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
    const int64_t nb = k / kQK;
    for (int half = 0; half < 2; ++half) {
      __m128i x[4], w[4];
      for (int i = 0; i < 4; ++i)
        x[i] = _mm_xor_si128(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(in[plain - (3 - i) * nb].qs + 16 * half)), flip);
      transpose_words4(x, w);
      for (int c = 0; c < 4; ++c)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + group + kQsAt + 64 * (4 * half + c) + 4 * (r - 3)), w[c]);
    }
  });
}

void unpack_q8_0_r16(const void* src, int64_t rows, int64_t k, void* dst) {
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<BlockQ8_0*>(dst);
  for_each_block(rows, k, [&](int64_t plain, size_t group, int r) {
    std::memcpy(&out[plain].d, in + group + 2 * r, 2);
    for (int c = 0; c < 8; ++c)
      for (int j = 0; j < 4; ++j)
        out[plain].qs[4 * c + j] = static_cast<int8_t>(in[group + kQsAt + 64 * c + 4 * r + j] ^ 0x80);
  });
}

// The reference: the AVX-512 kernel computes every output with the same operations in the same
// order (integer block dot of the biased weights, the bias taken off in integers, then one fused
// multiply-add per block), so the two agree bit for bit.
void gemm_q8_0_r16_scalar(const GemmArgs& a) {
  r16_scalar<R16Act, kQK, kGroupBlockBytes>(a, [](const uint8_t* p, const R16Act& x, int r, float acc) {
    int32_t s = x.c;
    for (int c = 0; c < 8; ++c)
      for (int j = 0; j < 4; ++j) s += p[kQsAt + 64 * c + 4 * r + j] * x.qs[4 * c + j];
    uint16_t h;
    std::memcpy(&h, p + 2 * r, 2);
    return std::fma(static_cast<float>(s), fp16_to_fp32(h) * x.d, acc);
  });
}

}  // namespace ember::cpu::detail
