#include "ops/cpu/matmul.hpp"

#include <algorithm>
#include <cstring>

#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "ops/cpu/kernels.hpp"
#include "ops/cpu/kquant.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {
namespace {

using detail::GemmArgs;
using detail::GemmFn;
using detail::KernelSet;

// The activation type each weight type's dot product takes.
DType activation_type(DType w) {
  switch (w) {
    case DType::F32: case DType::F16: case DType::BF16: return DType::F32;
    case DType::Q8_0: case DType::Q4_0: return DType::Q8_0;
    case DType::Q4_1: return DType::Q8_1;
    case DType::Q6_K: return DType::Q8_K;
    case DType::Q5_0: return DType::Q8_0;
    case DType::Q5_1: return DType::Q8_1;
    case DType::Q4_K: case DType::Q5_K: return DType::Q8_K;
    default: fail("matmul: no kernel for weight type {}", dtype_name(w));
  }
}

GemmFn pick(const KernelSet& s, DType w) {
  switch (w) {
    case DType::F32: return s.f32;
    case DType::F16: return s.f16;
    case DType::BF16: return s.bf16;
    case DType::Q8_0: return s.q8_0;
    case DType::Q4_0: return s.q4_0;
    case DType::Q4_1: return s.q4_1;
    case DType::Q6_K: return s.q6_k;
    default: return detail::kquant_pick(s, w);  // Q5_0, Q5_1, Q4_K, Q5_K (kquant_*.cpp)
  }
}

GemmFn gemm_for(DType w) {
  GemmFn fn = nullptr;
  switch (simd_level()) {
    case SimdLevel::avx512: fn = pick(detail::kernels_avx512(), w); break;
    case SimdLevel::avx2: fn = pick(detail::kernels_avx2(), w); break;
    default: break;
  }
  if (!fn) fn = pick(detail::kernels_scalar(), w);
  EMBER_CHECK(fn != nullptr, "matmul: no kernel for weight type {}", dtype_name(w));
  return fn;
}

void check_k(DType w, int64_t k) {
  const int64_t need = std::max(info(w).block_size, info(activation_type(w)).block_size);
  EMBER_CHECK(k > 0 && k % need == 0, "matmul: row length {} of a {} matrix must be a positive multiple of {}", k,
              dtype_name(w), need);
}

// Prompt processing works on blocks of rows x tokens that fit in L2 together (64 rows of a
// 5632-wide Q4_0 matrix are 200 KB, 64 tokens of its Q8_0 activations 380 KB); inside a block
// the kernel's register tiles reuse each decoded weight block across several tokens.
constexpr int64_t kRowBlock = 64;
constexpr int64_t kTokenBlock = 64;
constexpr int64_t kRowAlign = 16;  // decode splits rows in multiples of this

}  // namespace

size_t matmul_scratch_bytes(DType weight_type, int64_t k, int64_t n_tokens) {
  check_k(weight_type, k);
  return row_bytes(activation_type(weight_type), k) * static_cast<size_t>(n_tokens);
}

void quantize_activations(DType weight_type, const float* X, int64_t n_tokens, int64_t k, void* out) {
  check_k(weight_type, k);
  const DType at = activation_type(weight_type);
  const size_t stride = row_bytes(at, k);
  void (*fast)(const float*, void*, int64_t) = nullptr;
  if (simd_level() == SimdLevel::avx512) {
    const KernelSet& s = detail::kernels_avx512();
    fast = at == DType::Q8_0 ? s.quantize_q8_0 : at == DType::Q8_1 ? s.quantize_q8_1 : nullptr;
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    uint8_t* dst = static_cast<uint8_t*>(out) + t * stride;
    if (fast) fast(X + t * k, dst, k);
    else quantize_row(at, X + t * k, dst, k);
  }
}

void matmul_rows(const TensorView& W, const void* x_quantized, int64_t n_tokens, int64_t row_begin,
                 int64_t row_end, float* Y, int64_t y_stride) {
  const int64_t k = W.cols();
  check_k(W.type, k);
  if (row_end <= row_begin || n_tokens <= 0) return;
  GemmArgs a{k,        W.row(row_begin), W.row_stride(), row_end - row_begin,
             static_cast<const uint8_t*>(x_quantized), row_bytes(activation_type(W.type), k),
             n_tokens, Y,   y_stride};
  gemm_for(W.type)(a);
}

void matmul(ThreadPool& pool, const TensorView& W, const float* X, int64_t n_tokens, float* Y, void* scratch) {
  const int64_t k = W.cols(), rows = W.rows();
  check_k(W.type, k);
  if (n_tokens <= 0 || rows <= 0) return;
  const DType at = activation_type(W.type);
  const size_t x_stride = row_bytes(at, k);
  const uint8_t* xq;
  if (at == DType::F32) {
    xq = reinterpret_cast<const uint8_t*>(X);  // float weights take X as it is
  } else {
    auto* out = static_cast<uint8_t*>(scratch);
    if (n_tokens == 1 || pool.size() == 1) {
      quantize_activations(W.type, X, n_tokens, k, out);
    } else {
      pool.run([&](int ith, int nth) {
        int64_t t0, t1;
        split_range(n_tokens, ith, nth, t0, t1);
        if (t1 > t0) quantize_activations(W.type, X + t0 * k, t1 - t0, k, out + t0 * x_stride);
      });
    }
    xq = out;
  }
  const GemmFn fn = gemm_for(W.type);
  const uint8_t* w = W.data;
  const size_t w_stride = W.row_stride();

  if (n_tokens == 1) {
    // Decode: each thread streams one contiguous slice of the weights.
    const int64_t groups = (rows + kRowAlign - 1) / kRowAlign;
    pool.run([&](int ith, int nth) {
      int64_t g0, g1;
      split_range(groups, ith, nth, g0, g1);
      const int64_t r0 = g0 * kRowAlign, r1 = std::min(rows, g1 * kRowAlign);
      if (r1 <= r0) return;
      GemmArgs a{k, w + r0 * w_stride, w_stride, r1 - r0, xq, x_stride, 1, Y + r0, rows};
      fn(a);
    });
    return;
  }
  const int64_t row_blocks = (rows + kRowBlock - 1) / kRowBlock;
  pool.parallel_for(row_blocks, 1, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, r1 = std::min(rows, r0 + kRowBlock);
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
        const int64_t nt = std::min(kTokenBlock, n_tokens - t0);
        GemmArgs a{k, w + r0 * w_stride, w_stride, r1 - r0, xq + t0 * x_stride, x_stride, nt, Y + t0 * rows + r0, rows};
        fn(a);
      }
    }
  });
}

void get_rows(const TensorView& W, const int32_t* ids, int64_t n, float* out) {
  const int64_t k = W.cols(), rows = W.rows();
  for (int64_t i = 0; i < n; ++i) {
    EMBER_CHECK(ids[i] >= 0 && ids[i] < rows, "get_rows: row id {} out of range [0, {}) of {}", ids[i], rows, W.name);
    dequantize_row(W.type, W.row(ids[i]), out + i * k, k);
  }
}

float vec_dot(DType type, int64_t k, const void* w_row, const void* x_quantized_row) {
  check_k(type, k);
  float y = 0.f;
  GemmArgs a{k, static_cast<const uint8_t*>(w_row), 0, 1, static_cast<const uint8_t*>(x_quantized_row), 0, 1, &y, 1};
  gemm_for(type)(a);
  return y;
}

}  // namespace ember::cpu
