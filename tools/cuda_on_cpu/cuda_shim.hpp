// The CUDA runtime names ops/cuda/ uses, on the HIP CPU runtime (tools/cuda_on_cpu/README.md):
// included instead of <cuda_fp16.h> / <cuda_runtime.h> by translate.py's output. A development
// check that runs the CUDA tests on a CPU, not part of any build of Ember.
#pragma once
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

// ops/cuda/ asks for this to leave out what the runtime lacks (graphs).
#define EMBER_CUDA_ON_CPU 1

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaStream_t hipStream_t
#define cudaEvent_t hipEvent_t
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocHost(p, n) hipHostMalloc(p, n)
#define cudaFreeHost hipHostFree
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpy hipMemcpy
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemGetInfo hipMemGetInfo
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventCreate hipEventCreate
#define cudaEventElapsedTime hipEventElapsedTime
// 32-lane warps (the runtime's warpSize is set to 32 by run.sh); full masks only.
#define __shfl_down_sync(mask, v, o) __shfl_down(v, o, 32)
#define __shfl_sync(mask, v, lane) __shfl(v, lane, 32)
#define __ballot_sync(mask, p) static_cast<unsigned>(__ballot(p))
#include <cmath>
#include <cstring>
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }  // nearest, ties even
// The four signed byte products of a and b, summed, plus c (CUDA's __dp4a on int operands).
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i)
    c += static_cast<int>(static_cast<signed char>(a >> (8 * i))) * static_cast<int>(static_cast<signed char>(b >> (8 * i)));
  return c;
}
