// The 6-bit scales and mins of a Q4_K_R16 / Q5_K_R16 super-block (layout in r16/r16.hpp) unpacked
// to bytes, for the AVX2, AVX-VNNI and AVX-512 kernels: once per row group for all its tiles of
// tokens, or once per super-block as a single token's product streams past, where unpacking each
// sub-block's as 32-bit lanes in the kernel's loop cost ~12-16 vector operations a sub-block and
// tile. 256-bit code; each including translation unit (built for AVX2 or above) keeps its own copy.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "ops/cpu/r16/r16_kernels.hpp"

namespace ember::cpu::detail {
namespace {

constexpr size_t kKScaleTableBytes = 256;  // a super-block's table

// A super-block's 6-bit scales and mins of all 16 rows as bytes, tab[32 j + r] the scale and
// tab[32 j + 16 + r] the min of sub-block j (r16/r16.hpp: their low 4 bits in the low and high
// nibble of lo[j], their high 2 bits in bits 4 (j % 2) .. +1 and +2 .. +3 of hi[j / 2]); two
// sub-blocks a 256-bit register, ~60 operations a super-block.
inline void k_scale_table(const uint8_t* p, uint8_t* tab) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
  for (int i = 0; i < 4; ++i) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kR16Q4KLoAt + 32 * i));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kR16Q4KHiAt + 16 * i));
    // Sub-block 2i's high bits in the low 128 bits, 2i + 1's (bits 4 ..) in the high ones; the
    // 16-bit shifts carry a neighbour's bits into bits the masks drop.
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(hi), _mm_srli_epi16(hi, 4), 1);
    const __m256i sc = _mm256_or_si256(_mm256_and_si256(lo, m4), _mm256_slli_epi16(_mm256_and_si256(h, three), 4));
    const __m256i m = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo, 4), m4),
                                      _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), three), 4));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tab + 64 * i), _mm256_permute2x128_si256(sc, m, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tab + 64 * i + 32), _mm256_permute2x128_si256(sc, m, 0x31));
  }
}

// Room for a row group's scale tables (kKScaleTableBytes a super-block), this thread's, grown as needed.
inline uint8_t* scale_tables(int64_t nb) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < static_cast<size_t>(nb) * kKScaleTableBytes) buf.resize(static_cast<size_t>(nb) * kKScaleTableBytes);
  return buf.data();
}

// A product of one token (decode) unpacks each super-block's table as its weights stream past,
// so they are read in one pass; one of several tokens unpacks a row group's tables before its
// tiles (prepare_k_scale_tables), once for all of them.
inline bool k_scale_tables_inline(const GemmArgs& a) { return a.ntok == 1; }
inline void prepare_k_scale_tables(const GemmArgs& a, int64_t g, size_t group_block_bytes) {
  if (k_scale_tables_inline(a)) return;
  const int64_t nb = a.k / kQK_K;
  uint8_t* const tables = scale_tables(nb);
  const uint8_t* wg = a.w + g * kR16Rows * a.w_stride;
  for (int64_t b = 0; b < nb; ++b) k_scale_table(wg + b * group_block_bytes, tables + kKScaleTableBytes * b);
}

}  // namespace
}  // namespace ember::cpu::detail
