// Compaction of the fired positions (see cuda_ops.hpp): counting, no atomics.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.hpp"

namespace ember::cuda {

using namespace detail;

namespace {

// Block-wide compaction step, in thread order: every thread of the block calls it with its
// flag; a flagged thread gets its slot among the block's flagged threads in *slot. Returns the
// block's count (the same in every thread).
__device__ int block_compact(int flag, int* slot) {
  __shared__ int warp_base[32];
  __shared__ int chunk_total;
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;
  const unsigned m = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_base[w] = __popc(m);
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (int q = 0; q < n_warps; ++q) {
      const int c = warp_base[q];
      warp_base[q] = s;
      s += c;
    }
    chunk_total = s;
  }
  __syncthreads();
  *slot = warp_base[w] + __popc(m & ((1u << lane) - 1u));
  const int total = chunk_total;
  __syncthreads();
  return total;
}

// Block b (kCompactSpan threads): positions b kCompactSpan .. + kCompactSpan - 1. Its offset is
// the number of flagged positions before it, counted here; the block holding the last position
// writes the totals.
__global__ void __launch_bounds__(kCompactSpan) compact_kernel(const int32_t* counts, int64_t max_n,
                                                               const int32_t* n_valid, const int32_t* ids,
                                                               int32_t* out_ids, int32_t* out_pos, int32_t* totals,
                                                               unsigned long long* fired_total) {
  __shared__ int red[33];
  const int64_t n = n_valid ? *n_valid : max_n;
  const int64_t b = blockIdx.x, start = b * kCompactSpan;
  const int64_t last = n > 0 ? (n - 1) / kCompactSpan : 0;
  if (b > last) return;  // the whole block: its barriers stay uniform
  int before = 0;
  for (int64_t j = threadIdx.x; j < start; j += blockDim.x) before += counts[j] > 0;
  const int offset = block_sum(before, red);
  const int64_t i = start + threadIdx.x;
  const int flag = i < n && counts[i] > 0;
  int slot = 0;
  const int total = block_compact(flag, &slot);
  if (flag) {
    out_ids[offset + slot] = ids ? ids[i] : static_cast<int32_t>(i);
    if (out_pos) out_pos[offset + slot] = static_cast<int32_t>(i);
  }
  if (b != last) return;
  int pairs = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) pairs += counts[j];
  pairs = block_sum(pairs, red);
  if (threadIdx.x == 0) {
    totals[0] = offset + total;
    totals[1] = pairs;
    if (fired_total) atomicAdd(fired_total, static_cast<unsigned long long>(pairs));  // integers: order-free
  }
}
}  // namespace

void compact(const int32_t* counts, int64_t max_n, const int32_t* n_valid, const int32_t* ids, int32_t* out_ids,
             int32_t* out_pos, int32_t* totals, void* stream, uint64_t* fired_total) {
  const unsigned blocks = grid_of(std::max<int64_t>(max_n, 1), kCompactSpan);
  compact_kernel<<<blocks, kCompactSpan, 0, as_stream(stream)>>>(counts, max_n, n_valid, ids, out_ids, out_pos, totals,
                                                                 reinterpret_cast<unsigned long long*>(fired_total));
  launched("compact kernel");
}

}  // namespace ember::cuda
