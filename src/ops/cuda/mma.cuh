// Tensor-core products (mma.sync) of the tile kernels (tiles.cu, axpy.cu), and their definition
// written with shuffles where the instruction is absent (cards before compute capability 8.0, the
// HIP CPU runtime). Included by .cu files only.
#pragma once
#include "ops/cuda/cuda_common.cuh"

namespace ember::cuda::detail {

// The m16n8 mma instructions' definition where they are absent (the HIP CPU runtime): with
// g = lane / 4 and q = lane % 4, a[r] holds row g + 8 (r % 2), k word q + 4 (r / 2) of A, b[r]
// column g, k word q + 4 r of B, c[e] row g + 8 (e / 2), column 2 q + e % 2 of C; each lane
// gathers its rows' and columns' eight k words with shuffles and adds dot(a word, b word) for
// each. Every lane shuffles alike (the runtime's shuffles wait for the whole block).
template <class W, class C, class Dot>
__device__ __forceinline__ void mma_by_shuffles(const W (&a)[4], const W (&b)[2], C (&c)[4], Dot dot) {
  const int lane = threadIdx.x % kWarp, g = lane / 4, q = lane % 4;
#pragma unroll
  for (int w = 0; w < 8; ++w) {  // k word w: A's words from lane 4 g + w % 4, B's from 4 n + w % 4
    const W a_lo = __shfl_sync(0xffffffffu, a[2 * (w / 4)], 4 * g + w % 4);
    const W a_hi = __shfl_sync(0xffffffffu, a[2 * (w / 4) + 1], 4 * g + w % 4);
    const W b0 = __shfl_sync(0xffffffffu, b[w / 4], 4 * (2 * q) + w % 4);
    const W b1 = __shfl_sync(0xffffffffu, b[w / 4], 4 * (2 * q + 1) + w % 4);
    c[0] = dot(a_lo, b0, c[0]);
    c[1] = dot(a_lo, b1, c[1]);
    c[2] = dot(a_hi, b0, c[2]);
    c[3] = dot(a_hi, b1, c[3]);
  }
}

// c += A B for a warp's fragments of mma.m16n8k32 with 8-bit signed integers (PTX ISA, "Matrix
// fragments for mma.m16n8k32"): A is 16 rows x 32, B 32 x 8 columns, C 16 x 8 int32, in
// mma_by_shuffles' layout with words of four consecutive k. Sums of products of integers: exact, so the tiles' results do not depend on this instruction
// or the dp4a that stands in for it on cards without one (and on the HIP CPU runtime, where the
// definition is written out with shuffles, so that the fragments the kernel loads are tested).
__device__ __forceinline__ void mma_s8_16x8x32(const int (&a)[4], const int (&b)[2], int (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(EMBER_CUDA_ON_CPU)
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  mma_by_shuffles(a, b, c, [](int x, int y, int acc) { return __dp4a(x, y, acc); });
#endif
}

// bf16 as the upper 16 bits of a float: to it with rounding to nearest even (finite values), and back.
__device__ __forceinline__ unsigned bf16_bits(float v) {
  const unsigned u = __float_as_uint(v);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float bf16_value(unsigned b) { return __uint_as_float(b << 16); }
// Two consecutive bf16 (k, k + 1) as one fragment word, k in the low half.
__device__ __forceinline__ unsigned bf16_pair(const uint16_t* p) { return p[0] | static_cast<unsigned>(p[1]) << 16; }

// c += A B for a warp's fragments of mma.m16n8k16 with bf16 inputs and float sums (PTX ISA,
// "Matrix fragments for mma.m16n8k16 with floating point type"): the same layout as
// mma_s8_16x8x32's with a word holding two consecutive k (the lower k in the low half). Products
// of two bf16 values are exact in float; the sums' order is the instruction's (or, where it is
// absent, the definition's written out as in mma_s8_16x8x32).
__device__ __forceinline__ void mma_bf16_16x8x16(const unsigned (&a)[4], const unsigned (&b)[2], float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(EMBER_CUDA_ON_CPU)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  mma_by_shuffles(a, b, c, [](unsigned x, unsigned y, float acc) {
    return acc + (bf16_value(x & 0xffffu) * bf16_value(y & 0xffffu) + bf16_value(x >> 16) * bf16_value(y >> 16));
  });
#endif
}

}  // namespace ember::cuda::detail
