#include "ops/cpu/matmul.hpp"

#include <algorithm>
#include <cstring>

#include "core/aligned_buffer.hpp"
#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "ops/cpu/kernels.hpp"
#include "ops/cpu/kquant.hpp"
#include "tensor/fp16.hpp"
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

// The kernel for w from an ISA's two tables (kernels.hpp and kquant.hpp); null when it has none.
GemmFn pick(const KernelSet& s, const detail::KQuantSet& q, DType w) {
  switch (w) {
    case DType::F32: return s.f32;
    case DType::F16: return s.f16;
    case DType::BF16: return s.bf16;
    case DType::Q8_0: return s.q8_0;
    case DType::Q4_0: return s.q4_0;
    case DType::Q4_1: return s.q4_1;
    case DType::Q6_K: return s.q6_k;
    case DType::Q5_0: return q.q5_0;
    case DType::Q5_1: return q.q5_1;
    case DType::Q4_K: return q.q4_k;
    case DType::Q5_K: return q.q5_k;
    default: return nullptr;
  }
}

// The kernel for a weight type at the current SIMD level, and whether it takes its activations
// in the quad layout (kernels.hpp) rather than as plain quantized rows.
struct Kernel {
  GemmFn fn = nullptr;
  bool quads = false;
};

Kernel gemm_for(DType w) {
  const KernelSet* set = nullptr;
  const detail::KQuantSet* kq = nullptr;
  switch (simd_level()) {
    case SimdLevel::avx512: set = &detail::kernels_avx512(), kq = &detail::kquant_avx512(); break;
    case SimdLevel::avx2: set = &detail::kernels_avx2(), kq = &detail::kquant_avx2(); break;
    default: break;
  }
  Kernel k;
  if (set && (k.fn = pick(*set, *kq, w)) != nullptr) {
    k.quads = set->q4_quads && (w == DType::Q4_0 || w == DType::Q4_1);
    return k;
  }
  k.fn = pick(detail::kernels_scalar(), detail::kquant_scalar(), w);
  EMBER_CHECK(k.fn != nullptr, "matmul: no kernel for weight type {}", dtype_name(w));
  return k;
}

bool may_use_quads(DType w) { return w == DType::Q4_0 || w == DType::Q4_1; }

uint8_t* align64(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

// Runs a kernel on activations given as quantize_activations() rows, preparing quads first
// where the kernel wants them (into a per-thread buffer that only grows).
void run_on_quantized(const Kernel& kern, DType w, GemmArgs a) {
  if (!kern.quads) {
    kern.fn(a);
    return;
  }
  thread_local AlignedBuffer<uint8_t> buf;
  const size_t qstride = detail::quad_row_bytes(a.k);
  buf.resize(qstride * static_cast<size_t>(a.ntok));
  for (int64_t t = 0; t < a.ntok; ++t) detail::prepare_quads(w, a.x + t * a.x_stride, buf.data() + t * qstride, a.k);
  a.x = buf.data();
  a.x_stride = qstride;
  kern.fn(a);
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

void detail::prepare_quads(DType weight_type, const void* xq_row, void* out, int64_t k) {
  const int64_t nb = k / kQK, nq = (nb + 3) / 4;
  const bool q4_1 = weight_type == DType::Q4_1;
  const auto* b0 = static_cast<const BlockQ8_0*>(xq_row);
  const auto* b1 = static_cast<const BlockQ8_1*>(xq_row);
  auto* o = static_cast<uint8_t*>(out);
  std::memset(o, 0, static_cast<size_t>(nq) * kQuadBytes);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* quad = o + (b / 4) * kQuadBytes;
    const int i = static_cast<int>(b % 4);
    const int8_t* qs = q4_1 ? b1[b].qs : b0[b].qs;
    const float d = fp16_to_fp32(q4_1 ? b1[b].d : b0[b].d);
    std::memcpy(quad + 16 * i, qs, 16);
    std::memcpy(quad + 64 + 16 * i, qs + 16, 16);
    auto* dl = reinterpret_cast<float*>(quad + 128);
    for (int j = 0; j < 4; ++j) dl[4 * i + j] = d;
    if (q4_1) {
      reinterpret_cast<float*>(quad + 192)[4 * i] = fp16_to_fp32(b1[b].s);
    } else {
      auto* c = reinterpret_cast<int32_t*>(quad + 192);
      for (int j = 0; j < 4; ++j) {
        int32_t sum = 0;
        for (int e = 0; e < 4; ++e) sum += qs[4 * j + e] + qs[16 + 4 * j + e];
        c[4 * i + j] = -8 * sum;
      }
    }
  }
}

size_t matmul_scratch_bytes(DType weight_type, int64_t k, int64_t n_tokens) {
  check_k(weight_type, k);
  size_t bytes = row_bytes(activation_type(weight_type), k) * static_cast<size_t>(n_tokens);
  // Room for the quad layout after the quantized rows (64-byte aligned).
  if (may_use_quads(weight_type)) bytes += 64 + detail::quad_row_bytes(k) * static_cast<size_t>(n_tokens);
  return bytes;
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
  run_on_quantized(gemm_for(W.type), W.type, a);
}

const void* prepare_activations(DType w, void* scratch, int64_t n_tokens, int64_t k) {
  if (!gemm_for(w).quads) return scratch;
  auto* out = static_cast<uint8_t*>(scratch);
  const size_t x_stride = row_bytes(activation_type(w), k), qstride = detail::quad_row_bytes(k);
  uint8_t* quads = align64(out + x_stride * n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) detail::prepare_quads(w, out + t * x_stride, quads + t * qstride, k);
  return quads;
}

void matmul_rows_prepared(const TensorView& W, const void* x_prepared, int64_t n_tokens, int64_t row_begin,
                          int64_t row_end, float* Y, int64_t y_stride) {
  const int64_t k = W.cols();
  if (row_end <= row_begin || n_tokens <= 0) return;
  const Kernel kern = gemm_for(W.type);
  const size_t stride = kern.quads ? detail::quad_row_bytes(k) : row_bytes(activation_type(W.type), k);
  GemmArgs a{k, W.row(row_begin), W.row_stride(), row_end - row_begin, static_cast<const uint8_t*>(x_prepared),
             stride, n_tokens, Y, y_stride};
  kern.fn(a);
}

void matmul(ThreadPool& pool, const TensorView& W, const float* X, int64_t n_tokens, float* Y, void* scratch) {
  const int64_t k = W.cols(), rows = W.rows();
  check_k(W.type, k);
  if (n_tokens <= 0 || rows <= 0) return;
  const DType at = activation_type(W.type);
  const size_t x_stride = row_bytes(at, k);
  const Kernel kern = gemm_for(W.type);
  const GemmFn fn = kern.fn;
  const uint8_t* xq;
  size_t x_stride_k = x_stride;  // stride of the activation rows the kernel reads
  if (at == DType::F32) {
    xq = reinterpret_cast<const uint8_t*>(X);  // float weights take X as it is
  } else {
    auto* out = static_cast<uint8_t*>(scratch);
    // Quad-layout kernels: the quantized rows are rearranged once per call, after them in the
    // scratch.
    uint8_t* quads = kern.quads ? align64(out + x_stride * n_tokens) : nullptr;
    const size_t qstride = detail::quad_row_bytes(k);
    const auto prepare = [&](int64_t t0, int64_t t1) {
      if (t1 <= t0) return;
      quantize_activations(W.type, X + t0 * k, t1 - t0, k, out + t0 * x_stride);
      if (quads)
        for (int64_t t = t0; t < t1; ++t) detail::prepare_quads(W.type, out + t * x_stride, quads + t * qstride, k);
    };
    if (n_tokens == 1 || pool.size() == 1) {
      prepare(0, n_tokens);
    } else {
      pool.run([&](int ith, int nth) {
        int64_t t0, t1;
        split_range(n_tokens, ith, nth, t0, t1);
        prepare(t0, t1);
      });
    }
    xq = quads ? quads : out;
    if (quads) x_stride_k = qstride;
  }
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
      GemmArgs a{k, w + r0 * w_stride, w_stride, r1 - r0, xq, x_stride_k, 1, Y + r0, rows};
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
        GemmArgs a{k, w + r0 * w_stride, w_stride, r1 - r0, xq + t0 * x_stride_k, x_stride_k, nt, Y + t0 * rows + r0, rows};
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
  run_on_quantized(gemm_for(type), type, a);
  return y;
}

}  // namespace ember::cpu
