// The CUDA runtime behind cuda_ops.hpp's wrappers (no kernels): devices, memory, streams, events,
// graphs, the launch counter, and the weight types and their device layout (pack_matrix).
#include <atomic>
#include <cstring>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.hpp"
#include "tensor/quant.hpp"

namespace ember::cuda {

using namespace detail;

namespace {
std::atomic<uint64_t> g_launches{0};
}  // namespace

void detail::count_launch() { g_launches.fetch_add(1, std::memory_order_relaxed); }


bool available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device found";
    return false;
  }
  return true;
}

std::string device_name() {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  return p.name;
}

void* malloc_device(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return p;
}
void free_device(void* p) { cudaFree(p); }
void* malloc_host_pinned(size_t bytes) {
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes == 0 ? 1 : bytes), "cudaMallocHost");
  return p;
}
void free_host_pinned(void* p) { cudaFreeHost(p); }
void* stream_create() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}
void stream_destroy(void* s) { cudaStreamDestroy(as_stream(s)); }
void stream_sync(void* s) { check(cudaStreamSynchronize(as_stream(s)), "cudaStreamSynchronize"); }
void copy_to_device(void* dst, const void* src, size_t bytes, void* s) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(s)), "cudaMemcpyAsync (to device)");
}
void copy_to_host(void* dst, const void* src, size_t bytes, void* s) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(s)), "cudaMemcpyAsync (to host)");
}
void copy_device(void* dst, const void* src, size_t bytes, void* s) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(s)), "cudaMemcpyAsync (on device)");
}
void copy_to_device_sync(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (to device)");
}
void mem_info(size_t* free_bytes, size_t* total_bytes) {
  check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}
void copy_to_host_sync(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (to host)");
}

void* event_create() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}
void event_destroy(void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
void event_record(void* e, void* s) { check(cudaEventRecord(static_cast<cudaEvent_t>(e), as_stream(s)), "cudaEventRecord"); }
void event_sync(void* e) { check(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize"); }
void* timing_event_create() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreate(&e), "cudaEventCreate");
  return e;
}
float event_elapsed_ms(void* a, void* b) {
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)), "cudaEventElapsedTime");
  return ms;
}

uint64_t launches() { return g_launches.load(std::memory_order_relaxed); }


#ifdef EMBER_CUDA_ON_CPU
bool graphs_supported() { return false; }
void capture_begin(void*) { fail("CUDA graphs: the HIP CPU runtime has none"); }
void* capture_end(void*, size_t*) { fail("CUDA graphs: the HIP CPU runtime has none"); }
void graph_launch(void*, void*) { fail("CUDA graphs: the HIP CPU runtime has none"); }
void graph_destroy(void*) {}
#else
bool graphs_supported() { return true; }
void capture_begin(void* s) {
  check(cudaStreamBeginCapture(as_stream(s), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}
void* capture_end(void* s, size_t* nodes) {
  cudaGraph_t g = nullptr;
  check(cudaStreamEndCapture(as_stream(s), &g), "cudaStreamEndCapture");
  size_t n = 0;
  check(cudaGraphGetNodes(g, nullptr, &n), "cudaGraphGetNodes");
  if (nodes) *nodes = n;
  cudaGraphExec_t e = nullptr;
  const cudaError_t r = cudaGraphInstantiate(&e, g, 0);
  cudaGraphDestroy(g);
  check(r, "cudaGraphInstantiate");
  return e;
}
void graph_launch(void* g, void* s) {
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g), as_stream(s)), "cudaGraphLaunch");
}
void graph_destroy(void* g) {
  if (g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
}
#endif

void pack_matrix(DType type, const void* src, int64_t rows, int64_t cols, void* dst) {
  check_type(type, cols);
  const size_t rb = row_bytes(type, cols);
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (!takes_q8(type)) {
    std::memcpy(d, s, rb * static_cast<size_t>(rows));
    return;
  }
  const int64_t nb = cols / kQK;
  uint8_t* codes = d;
  if (type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K) {
    // Per super-block: its factors (Q4_K, Q5_K: its first 16 bytes, d, dmin and the scales; Q6_K:
    // its last 18, the scales then d) after every row's codes, and each block of 32's codes
    // (cuda_common.cuh's Split) from the elements' codes (tensor/quant.hpp's rules).
    const size_t code = split_shape(type).code_bytes, group = split_shape(type).group_bytes;
    const size_t from = type == DType::Q6_K ? 192 : 0;
    const size_t sb_bytes = row_bytes(type, kQKK);
    const auto element = [&](const uint8_t* blk, int e) {  // the code, 0..15 / 0..31 / 0..63
      if (type == DType::Q4_K) return q4_k_code(*reinterpret_cast<const BlockQ4_K*>(blk), e);
      if (type == DType::Q5_K) return q5_k_code(*reinterpret_cast<const BlockQ5_K*>(blk), e);
      return q6_k_code(*reinterpret_cast<const BlockQ6_K*>(blk), e) + 32;
    };
    uint8_t* factors = d + static_cast<size_t>(rows * nb) * code;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t sb = 0; sb < cols / kQKK; ++sb) {
        const uint8_t* blk = s + static_cast<size_t>(r) * rb + static_cast<size_t>(sb) * sb_bytes;
        std::memcpy(factors + static_cast<size_t>(r * (nb / 8) + sb) * group, blk + from, group);
        for (int j = 0; j < 8; ++j) {
          uint8_t* c = codes + static_cast<size_t>(r * nb + 8 * sb + j) * code;
          std::memset(c, 0, code);
          for (int t = 0; t < 32; ++t) {
            const int q = element(blk, 32 * j + t);
            c[t % 16] |= static_cast<uint8_t>((q & 15) << (t < 16 ? 0 : 4));
            if (type == DType::Q5_K) c[16 + t / 8] |= static_cast<uint8_t>((q >> 4) << (t % 8));
            if (type == DType::Q6_K) c[16 + t / 4] |= static_cast<uint8_t>((q >> 4) << (2 * (t % 4)));
          }
        }
      }
    return;
  }
  // GGUF blocks of 32: the factors (d; Q4_1, Q5_1: d, m) first, then the codes; Q5_0 and Q5_1's
  // codes are the fifth bits' word then the nibbles (already in Q4_1's order), which the device
  // keeps the other way round.
  const size_t factor = split_shape(type).group_bytes, code = split_shape(type).code_bytes, block = factor + code;
  const bool fifth = type == DType::Q5_0 || type == DType::Q5_1;
  uint8_t* factors = d + static_cast<size_t>(rows * nb) * code;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = s + static_cast<size_t>(r) * rb + static_cast<size_t>(b) * block;
      uint8_t* c = codes + static_cast<size_t>(r * nb + b) * code;
      std::memcpy(factors + static_cast<size_t>(r * nb + b) * factor, blk, factor);
      if (!fifth) {
        std::memcpy(c, blk + factor, code);
        continue;
      }
      std::memcpy(c, blk + factor + 4, 16);
      std::memcpy(c + 16, blk + factor, 4);
    }
}

}  // namespace ember::cuda
