// Scale and min (6 bits each) of sub-block j < 8 of a Q4_K / Q5_K super-block, as ggml packs
// them: j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 in the nibbles of byte j + 4 plus
// the top 2 bits of bytes j - 4 (scale) and j (min). One rule for the CPU (tensor/quant.hpp
// includes it) and the CUDA kernels (ops/cuda/cuda_common.cuh), so a host and device function.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define EMBER_HOST_DEVICE __host__ __device__
#else
#define EMBER_HOST_DEVICE
#endif

namespace ember {

EMBER_HOST_DEVICE inline void kquant_scale_min(const uint8_t* q, int j, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace ember
