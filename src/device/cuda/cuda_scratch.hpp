// The scratch CUDA's kernels keep in its arena, and the sizes of its 8-bit activations and firing
// counts (the device, its kernels' tests and the plan of a CUDA session read them here).
#pragma once
#include <cstdint>

#include "sparse/placement.hpp"

namespace ember {

// n_tokens rows of `cols` activations rounded to 8 bits in Q8_1 blocks of 32 (36 bytes each, the
// last block of a row padded): what CUDA's quantized matvecs read (cuda::quantize_q8).
inline uint64_t gpu_q8_bytes(int64_t cols, int64_t n_tokens) {
  return static_cast<uint64_t>((cols + 31) / 32) * 36 * static_cast<uint64_t>(n_tokens);
}
// CUDA's firing counts of an FFN layer: a 64-bit total of the fired (token, neuron) pairs, then
// an int32 per neuron (cuda::compact reads them).
uint64_t gpu_ffn_counts_bytes(const PlanModel& m);

// CUDA's layout of its scratch (PlanOptions::scratch for a CUDA session; DeviceCaps::scratch).
const DeviceScratch& cuda_scratch();

}  // namespace ember
