#include "ops/cpu/nm4.hpp"

#include <cmath>
#include <cstring>

#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {
namespace {

// Code of output j in a neuron row.
inline int code_at(const uint8_t* row, int64_t j) {
  const uint8_t b = row[(j / 32) * 16 + (j % 16)];
  return (j % 32) < 16 ? (b & 0x0F) : (b >> 4);
}

}  // namespace

DType nm4_type_of(DType down_type) {
  EMBER_CHECK(down_type == DType::Q4_0 || down_type == DType::Q4_1,
              "neuron-major 4-bit copy: down must be Q4_0 or Q4_1, not {}", dtype_name(down_type));
  return down_type == DType::Q4_0 ? DType::Q4_0_NM : DType::Q4_1_NM;
}

size_t nm4_table_bytes(DType t, int64_t n_ff, int64_t n_embd) {
  return static_cast<size_t>(n_ff / 32) * static_cast<size_t>(nm4_tables_per_block(t)) * static_cast<size_t>(n_embd) *
         sizeof(uint16_t);
}

size_t nm4_bytes(DType t, int64_t n_ff, int64_t n_embd) {
  return static_cast<size_t>(n_ff) * static_cast<size_t>(n_embd / 2) + nm4_table_bytes(t, n_ff, n_embd);
}

void nm4_from_down(ThreadPool& pool, const TensorView& down, uint8_t* dst) {
  const DType t = nm4_type_of(down.type);
  const int64_t n_ff = down.cols(), n_embd = down.rows();
  EMBER_CHECK(n_ff % 32 == 0 && n_embd % 32 == 0, "neuron-major copy of {}: n_ff {} and n_embd {} must be multiples "
              "of 32", down.name, n_ff, n_embd);
  const size_t row_len = static_cast<size_t>(n_embd / 2);
  uint16_t* tables = reinterpret_cast<uint16_t*>(dst + static_cast<size_t>(n_ff) * row_len);
  const bool q41 = t == DType::Q4_1_NM;
  const size_t in_block = q41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  pool.parallel_for(n_ff / 32, 1, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      uint8_t* rows = dst + static_cast<size_t>(b * 32) * row_len;
      std::memset(rows, 0, 32 * row_len);
      uint16_t* d = tables + b * nm4_tables_per_block(t) * n_embd;
      for (int64_t r = 0; r < n_embd; ++r) {
        const uint8_t* blk = down.row(r) + static_cast<size_t>(b) * in_block;
        const uint8_t* qs = blk + (q41 ? 4 : 2);
        std::memcpy(d + r, blk, sizeof(uint16_t));
        if (q41) std::memcpy(d + n_embd + r, blk + 2, sizeof(uint16_t));
        // Neuron k of the block: low nibble of byte k (k < 16) or high nibble of byte k - 16.
        const size_t at = static_cast<size_t>((r / 32) * 16 + (r % 16));
        const int shift = (r % 32) < 16 ? 0 : 4;
        for (int k = 0; k < 32; ++k) {
          const int q = k < 16 ? (qs[k] & 0x0F) : (qs[k - 16] >> 4);
          rows[static_cast<size_t>(k) * row_len + at] |= static_cast<uint8_t>(q << shift);
        }
      }
    }
  });
}

void nm4_dequantize_neuron(const TensorView& D, int64_t i, float* dst) {
  const uint8_t* row = D.row(i);
  const uint16_t* d = nm4_scales(D, i / 32);
  const int64_t n = D.cols();
  for (int64_t j = 0; j < n; ++j) {
    const int q = code_at(row, j);
    dst[j] = D.type == DType::Q4_1_NM ? fp16_to_fp32(d[j]) * static_cast<float>(q) + fp16_to_fp32(d[n + j])
                                      : fp16_to_fp32(d[j]) * static_cast<float>(q - 8);
  }
}

namespace detail {

void nm4_axpy_scalar(const TensorView& D, const int32_t* rows, const float* h, int64_t n, int64_t col0, int64_t len,
                     float* out) {
  const bool q41 = D.type == DType::Q4_1_NM;
  const int64_t n_embd = D.cols();
  nm4_segments(rows, h, n, [&](const int32_t* ids, const float* hs, int c, int64_t block, int64_t) {
    const uint16_t* d = nm4_scales(D, block) + col0;
    const float s = nm4_factor_sum(hs, c);
    for (int64_t j = 0; j < len; ++j) {
      float acc = 0.0f;
      for (int r = 0; r < c; ++r) {
        const int q = code_at(D.row(ids[r]), col0 + j);
        acc = std::fma(hs[r], static_cast<float>(q41 ? q : q - 8), acc);
      }
      float o = out[j];
      if (q41) o = std::fma(fp16_to_fp32(d[n_embd + j]), s, o);
      out[j] = std::fma(fp16_to_fp32(d[j]), acc, o);
    }
  });
}

}  // namespace detail

void nm4_axpy(const TensorView& D, const int32_t* rows, const float* h, int64_t n, int64_t col0, int64_t len,
              float* out) {
  EMBER_CHECK(is_nm4(D.type) && col0 % 32 == 0 && len % 32 == 0 && col0 + len <= D.cols(),
              "nm4_axpy: {} columns [{}, {}) of a {}-wide {} matrix", D.name, col0, col0 + len, D.cols(),
              dtype_name(D.type));
  detail::Nm4AxpyFn fn = nullptr;
  if (simd_level() == SimdLevel::avx512) fn = detail::nm4_axpy_avx512(D.type);
  if (!fn && simd_level() >= SimdLevel::avx2) fn = detail::nm4_axpy_avx2(D.type);
  if (!fn) fn = &detail::nm4_axpy_scalar;
  fn(D, rows, h, n, col0, len, out);
}

}  // namespace ember::cpu
