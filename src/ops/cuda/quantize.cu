// Activations rounded to 8 bits on the device (quantize_q8; see cuda_ops.hpp).
#include <cstring>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.hpp"

namespace ember::cuda {

using namespace detail;

namespace {

// A warp per block of 32 values (of n_blocks over all tokens).
__global__ void quantize_q8_kernel(const float* x, int64_t n_blocks, uint8_t* codes, __half* ds) {
  const int lane = threadIdx.x % kWarp;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const bool valid = blk < n_blocks;
  warp_quantize_q8(valid ? x[blk * kQK + lane] : 0.0f, valid, codes + blk * kQK, ds + 2 * blk);
}

}  // namespace

void quantize_q8(const float* x, int64_t n_tokens, int64_t cols, void* xq, void* stream) {
  EMBER_CHECK(cols % kQK == 0, "CUDA quantize_q8: rows of {} values (a multiple of 32)", cols);
  const int64_t n_blocks = n_tokens * cols / kQK;
  if (n_blocks == 0) return;
  constexpr int kWarpsPerBlock = 8;
  auto* codes = static_cast<uint8_t*>(xq);
  auto* ds = reinterpret_cast<__half*>(codes + n_blocks * kQK);
  quantize_q8_kernel<<<grid_of(n_blocks, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0, as_stream(stream)>>>(x, n_blocks,
                                                                                                         codes, ds);
  launched("quantize_q8 kernel");
}

void q8_to_blocks(const void* host_xq, int64_t n_tokens, int64_t cols, void* host_blocks) {
  const int64_t n_blocks = n_tokens * cols / kQK;
  const auto* codes = static_cast<const uint8_t*>(host_xq);
  const uint8_t* ds = codes + n_blocks * kQK;
  auto* out = static_cast<uint8_t*>(host_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) {
    std::memcpy(out + b * kQ8_1Bytes, ds + b * 4, 4);
    std::memcpy(out + b * kQ8_1Bytes + 4, codes + b * kQK, kQK);
  }
}

}  // namespace ember::cuda
