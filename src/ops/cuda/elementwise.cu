// Elementwise kernels of the FFN's device path (see cuda_ops.hpp).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.hpp"

namespace ember::cuda {

using namespace detail;

namespace {

__global__ void relu_kernel(float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(y[i], 0.0f);
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
}  // namespace

void relu(float* y, int64_t n, void* stream) {
  if (n == 0) return;
  relu_kernel<<<grid_of(n, 256), 256, 0, as_stream(stream)>>>(y, n);
  launched("relu kernel");
}

void add(const float* a, const float* b, float* out, int64_t n, void* stream) {
  if (n == 0) return;
  add_kernel<<<grid_of(n, 256), 256, 0, as_stream(stream)>>>(a, b, out, n);
  launched("add kernel");
}

}  // namespace ember::cuda
