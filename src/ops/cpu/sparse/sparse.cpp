#include "ops/cpu/sparse/sparse.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "ops/cpu/gemm/gemm_table.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/nm4/nm4.hpp"
#include "ops/cpu/prefetch.hpp"
#include "ops/cpu/sparse/sparse_impl.hpp"
#include "ops/cpu/vec.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {

const detail::SparseTables& detail::sparse_tables() {
  static const SparseTables t = [] {
    SparseTables s;
    add_sparse_avx2(s);
    add_sparse_avx512(s);
    return s;
  }();
  return t;
}

namespace {

void check_active(const char* what, const TensorView& W, const int32_t* active, int64_t n_active) {
  EMBER_CHECK(n_active >= 0 && n_active <= W.rows(), "{}: {} active rows of a {}-row matrix {}", what, n_active,
              W.rows(), W.name);
  const int64_t rows = W.rows();
  for (int64_t i = 0; i < n_active; ++i)
    EMBER_CHECK(active[i] >= 0 && active[i] < rows, "{}: active row {} out of range [0, {}) of {}", what, active[i],
                rows, W.name);
}

detail::SparseKernels sparse_kernels(DType t) { return detail::sparse_tables().rows.find(t, simd_level()); }

// Column slices of the axpy are whole blocks and multiples of 64 floats, so a column's chain of
// operations (vector body or scalar tail) does not depend on where a slice starts.
int64_t slice_unit(DType t) {
  return is_nm4(t) ? kNm4Chunk : std::max<int64_t>(64, info(t).block_size);  // slices start at a chunk
}

// Active rows are scattered, so the hardware prefetchers cannot see the next one coming: ask
// for it a couple of rows ahead (the cost of a row is one DRAM latency otherwise).
constexpr int64_t kPrefetchRows = 2;

// Whether the AVX-512 one-token kernels over 4-bit rows (sparse/sparse_avx512.cpp) take activations
// that prepare_activations() laid out with row stride x_stride for a matrix of k columns.
bool quad_kernels_apply(int64_t n_tokens, int64_t k, size_t x_stride) {
  return n_tokens == 1 && simd_level() == SimdLevel::avx512 && detail::gemm_kernel(DType::Q4_0, SimdLevel::avx512).quads &&
         x_stride == detail::quad_row_bytes(k);
}

// Whether the one-token kernels over quantized activation blocks (sparse/sparse_avx2.cpp) give this
// level's dense bits: the row kernel that runs for t is AVX2's (at AVX2, and at AVX-VNNI, which
// has no row-major kernel of its own).
bool block_kernels_apply(DType t, int64_t n_tokens) {
  return n_tokens == 1 && simd_level() >= SimdLevel::avx2 &&
         detail::gemm_kernel(t, simd_level()).fn == detail::gemm_kernel(t, SimdLevel::avx2).fn;
}

}  // namespace

// ---- gather-matmul ---------------------------------------------------------------------------

size_t gather_matmul_scratch_bytes(DType weight_type, int64_t k, int64_t n_tokens) {
  return matmul_scratch_bytes(weight_type, k, n_tokens);
}

void gather_matmul_rows(const TensorView& W, const void* xq, int64_t n_tokens, const int32_t* active,
                        int64_t n_active, float* Y, int64_t y_stride) {
  const size_t stride = W.row_stride();
  // Activations in the kernel's layout once for the whole list, not once per run of rows.
  size_t x_stride = 0;
  const void* xp = prepare_activations(W.type, xq, n_tokens, W.cols(), &x_stride);
  // One token over 4-bit rows: the grouped kernel (several scattered rows in flight).
  detail::GatherFn gather = nullptr;
  if (quad_kernels_apply(n_tokens, W.cols(), x_stride)) gather = detail::sparse_tables().gather.find(W.type, simd_level());
  else if (block_kernels_apply(W.type, n_tokens)) gather = detail::sparse_tables().gather_blocks.find(W.type, simd_level());
  if (gather) {
    gather(W.row(0), stride, active, n_active, W.cols(), static_cast<const uint8_t*>(xp), Y);
    return;
  }
  for (int64_t i = 0; i < std::min(n_active, kPrefetchRows); ++i) prefetch_lines(W.row(active[i]), W.row_size());
  for (int64_t i = 0; i < n_active;) {
    if (i + kPrefetchRows < n_active) prefetch_lines(W.row(active[i + kPrefetchRows]), W.row_size());
    // A run of consecutive rows is one call of the dense row kernel (its register tiles span
    // several rows when the run is long).
    int64_t e = i + 1;
    while (e < n_active && active[e] == active[e - 1] + 1) ++e;
    matmul_rows_prepared(W, xp, x_stride, n_tokens, active[i], active[e - 1] + 1, Y + i, y_stride);
    i = e;
  }
}

void gather_matmul(ThreadPool& pool, const TensorView& W, const float* X, int64_t n_tokens, const int32_t* active,
                   int64_t n_active, float* Y, int64_t y_stride, void* scratch) {
  check_active("gather_matmul", W, active, n_active);
  if (n_active == 0 || n_tokens <= 0) return;
  const int64_t k = W.cols();
  quantize_activations(W.type, X, n_tokens, k, scratch);
  pool.run([&](int ith, int nth) {
    int64_t i0, i1;
    split_range(n_active, ith, nth, i0, i1);
    if (i1 > i0) gather_matmul_rows(W, scratch, n_tokens, active + i0, i1 - i0, Y + i0, y_stride);
  });
}

// ---- axpy ------------------------------------------------------------------------------------

size_t sparse_axpy_scratch_floats(int64_t n_embd, int64_t n_tokens, int n_threads, AxpySplit split) {
  const size_t row = static_cast<size_t>((n_embd + 15) / 16 * 16);
  size_t n = row * n_threads;
  if (split == AxpySplit::neurons) n += row * static_cast<size_t>(n_tokens) * n_threads;
  return n;
}

void sparse_axpy_rows(const TensorView& D, const int32_t* active, int64_t n_active, const float* H, int64_t n_tokens,
                      int64_t h_stride, int64_t col_begin, int64_t col_end, float* out, int64_t out_stride,
                      float* tmp) {
  const int64_t len = col_end - col_begin;
  if (len <= 0) return;
  if (is_nm4(D.type)) {  // the shared-scale layout has kernels of its own, a token at a time
    for (int64_t t = 0; t < n_tokens; ++t)
      nm4_axpy(D, active, H + t * h_stride, n_active, col_begin, len, out + t * out_stride + col_begin);
    return;
  }
  const size_t offset = row_bytes(D.type, col_begin);
  const detail::SparseKernels k = sparse_kernels(D.type);
  const size_t slice_bytes = row_bytes(D.type, col_end) - offset;
  if (n_tokens == 1 && simd_level() == SimdLevel::avx512 && len % 32 == 0) {
    // One token: the grouped kernel (several rows in flight, the output slice in registers).
    if (const detail::AxpyRowsFn axpy = detail::sparse_tables().axpy_rows.find(D.type, simd_level())) {
      axpy(D.row(0), D.row_stride(), offset, active, H, n_active, out + col_begin, len);
      return;
    }
  }
  for (int64_t i = 0; i < std::min(n_active, kPrefetchRows); ++i) prefetch_lines(D.row(active[i]) + offset, slice_bytes);
  for (int64_t i = 0; i < n_active; ++i) {
    if (i + kPrefetchRows < n_active) prefetch_lines(D.row(active[i + kPrefetchRows]) + offset, slice_bytes);
    const uint8_t* src = D.row(active[i]) + offset;
    if (n_tokens == 1 && k.axpy) {
      const float h = H[i];
      if (h != 0.0f) k.axpy(h, src, out + col_begin, len);
      continue;
    }
    bool any = false;
    for (int64_t t = 0; t < n_tokens && !any; ++t) any = H[t * h_stride + i] != 0.0f;
    if (!any) continue;
    // Dequantize the slice once, then add it to every token that uses the neuron.
    if (k.dequant) k.dequant(src, tmp, len);
    else dequantize_row(D.type, src, tmp, len);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float h = H[t * h_stride + i];
      if (h != 0.0f) axpy_f32(h, tmp, out + t * out_stride + col_begin, len);
    }
  }
}

void sparse_axpy(ThreadPool& pool, const TensorView& D, const int32_t* active, int64_t n_active, const float* H,
                 int64_t n_tokens, int64_t h_stride, float* out, int64_t out_stride, float* scratch, AxpySplit split) {
  check_active("sparse_axpy", D, active, n_active);
  if (n_active == 0 || n_tokens <= 0) return;
  const int64_t n_embd = D.cols();
  const int64_t row = (n_embd + 15) / 16 * 16;
  const int nth = pool.size();
  if (split == AxpySplit::columns) {
    const int64_t unit = slice_unit(D.type);
    const int64_t units = (n_embd + unit - 1) / unit;
    const int64_t slices = std::clamp<int64_t>(n_embd / kAxpyMinSlice, 1, std::min<int64_t>(nth, units));
    pool.run([&](int ith, int) {
      if (ith >= slices) return;
      int64_t u0, u1;
      split_range(units, ith, static_cast<int>(slices), u0, u1);
      const int64_t c0 = u0 * unit, c1 = std::min(n_embd, u1 * unit);
      sparse_axpy_rows(D, active, n_active, H, n_tokens, h_stride, c0, c1, out, out_stride, scratch + ith * row);
    });
    return;
  }
  // neurons: partial sums per thread over an equal share of the list, then added in order.
  float* partials = scratch + static_cast<size_t>(nth) * row;
  const int64_t pstride = row * n_tokens;
  pool.run([&](int ith, int) {
    int64_t i0, i1;
    split_range(n_active, ith, nth, i0, i1);
    float* p = partials + ith * pstride;
    std::memset(p, 0, sizeof(float) * pstride);
    sparse_axpy_rows(D, active + i0, i1 - i0, H + i0, n_tokens, h_stride, 0, n_embd, p, row, scratch + ith * row);
  });
  pool.run([&](int ith, int) {
    int64_t c0, c1;
    split_range(n_embd, ith, nth, c0, c1);
    if (c1 <= c0) return;
    for (int64_t t = 0; t < n_tokens; ++t) {
      float* o = out + t * out_stride;
      for (int64_t j = c0; j < c1; ++j) {
        float s = 0.0f;
        for (int th = 0; th < nth; ++th) s += partials[th * pstride + t * row + j];
        o[j] += s;
      }
    }
  });
}

// ---- up and down together -----------------------------------------------------------------------

void sparse_up_down_rows(const TensorView& up, const void* xq, const TensorView& D_nm, const int32_t* active,
                         int64_t n_active, const float* g, float* h, float* out, float* tmp) {
  if (n_active <= 0) return;
  const int64_t n_embd = D_nm.cols();
  size_t x_stride = 0;
  const void* xp = prepare_activations(up.type, xq, 1, up.cols(), &x_stride);
  if (quad_kernels_apply(1, up.cols(), x_stride) && up.cols() == n_embd && n_embd % 32 == 0 && !is_nm4(D_nm.type)) {
    if (const detail::UpDownFn f = detail::sparse_up_down_avx512(up.type, D_nm.type)) {
      f(up.row(0), up.row_stride(), D_nm.row(0), D_nm.row_stride(), active, g, n_active, n_embd,
        static_cast<const uint8_t*>(xp), h, out);
      return;
    }
  }
  gather_matmul_rows(up, xq, 1, active, n_active, h, n_active);
  for (int64_t i = 0; i < n_active; ++i) h[i] *= g[i];
  sparse_axpy_rows(D_nm, active, n_active, h, 1, n_active, 0, n_embd, out, n_embd, tmp);
}

// ---- neuron-major copy -------------------------------------------------------------------------

DType neuron_major_dtype(DType down_type, NeuronMajorType choice, int64_t n_embd, bool shared_scales) {
  DType t = down_type;
  switch (choice) {
    case NeuronMajorType::f32: t = DType::F32; break;
    case NeuronMajorType::f16: t = DType::F16; break;
    case NeuronMajorType::same: break;
    case NeuronMajorType::q8_0: t = DType::Q8_0; break;
    case NeuronMajorType::exact:
    case NeuronMajorType::compact:
      if (shared_scales && (down_type == DType::Q4_0 || down_type == DType::Q4_1 || down_type == DType::Q4_K) &&
          n_embd % 32 == 0)
        return nm4_type_of(down_type, choice == NeuronMajorType::compact);
      if (down_type != DType::F32 && down_type != DType::F16 && down_type != DType::BF16) t = DType::Q8_0;
      break;
  }
  // A width the block size does not divide falls back to a float type.
  if (n_embd % info(t).block_size != 0) t = DType::F16;
  return t;
}

NeuronMajorMatrix make_neuron_major(ThreadPool& pool, const TensorView& down, DType type) {
  const int64_t n_ff = down.cols(), n_embd = down.rows();
  EMBER_CHECK(n_embd % info(type).block_size == 0, "neuron-major copy of {}: n_embd {} is not a multiple of the {} "
              "block size {}", down.name, n_embd, dtype_name(type), info(type).block_size);
  NeuronMajorMatrix m;
  const size_t stride = row_bytes(type, n_embd);
  const size_t total = is_nm4(type) ? nm4_bytes(type, n_ff, n_embd) : stride * static_cast<size_t>(n_ff);
  m.bytes.resize(total);
  m.view.name = down.name + ".neuron_major";
  m.view.type = type;
  m.view.n_dims = 2;
  m.view.ne[0] = n_embd;
  m.view.ne[1] = n_ff;
  m.view.data = m.bytes.data();
  m.view.nbytes = total;
  if (is_nm4(type)) {
    nm4_from_down(pool, down, type, m.bytes.data());  // (checks that down's type can become it)
    return m;
  }
  // Neurons are taken a block of down's type at a time: each input-major row r contributes one
  // block, dequantized into column r of a (block x n_embd) tile, whose rows are then quantized.
  const int64_t bs = info(down.type).block_size;
  const int64_t nb = bs > 1 ? bs : 64;
  const int64_t n_groups = (n_ff + nb - 1) / nb;
  std::vector<std::vector<float>> tiles(pool.size());
  std::vector<std::vector<float>> blocks(pool.size());
  pool.parallel_for(n_groups, 1, [&](int64_t g0, int64_t g1, int ith) {
    std::vector<float>& tile = tiles[ith];
    std::vector<float>& blk = blocks[ith];
    tile.resize(static_cast<size_t>(nb * n_embd));
    blk.resize(static_cast<size_t>(nb));
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t j0 = g * nb, nj = std::min(nb, n_ff - j0);
      for (int64_t r = 0; r < n_embd; ++r) {
        dequantize_row(down.type, down.row(r) + row_bytes(down.type, j0), blk.data(), bs > 1 ? bs : nj);
        for (int64_t jj = 0; jj < nj; ++jj) tile[jj * n_embd + r] = blk[jj];
      }
      for (int64_t jj = 0; jj < nj; ++jj)
        quantize_row(type, tile.data() + jj * n_embd, m.bytes.data() + (j0 + jj) * stride, n_embd);
    }
  });
  return m;
}

void dequantize_neuron(const TensorView& D, int64_t i, float* dst) {
  if (is_nm4(D.type)) nm4_dequantize_neuron(D, i, dst);
  else dequantize_row(D.type, D.row(i), dst, D.cols());
}

uint64_t neuron_major_row_bytes(DType t, int64_t n_embd) {
  if (!is_nm4(t)) return row_bytes(t, n_embd);
  // Exact for fp16 tables (n_embd is a multiple of 32); a narrow table's 9/8 byte an entry is a
  // whole number of bytes a neuron where n_embd is a multiple of 256, else rounded up.
  return (nm4_bytes(t, kNm4Block, n_embd) + kNm4Block - 1) / kNm4Block;
}

NeuronMajorMatrix neuron_major_rows(ThreadPool& pool, const TensorView& D, const int32_t* ids, int64_t n,
                                    DType type) {
  const int64_t n_embd = D.cols();
  EMBER_CHECK(!is_nm4(type) && n_embd % info(type).block_size == 0, "neuron-major rows of {}: {} rows of {} values "
              "cannot be stored on their own", D.name, dtype_name(type), n_embd);
  check_active("neuron_major_rows", D, ids, n);
  NeuronMajorMatrix m;
  const size_t stride = row_bytes(type, n_embd);
  m.bytes.resize(std::max<size_t>(stride * static_cast<size_t>(n), 1));
  m.view = matrix_view(type, m.bytes.data(), n, n_embd);
  m.view.name = D.name + ".rows";
  const bool same = type == D.type;
  pool.parallel_for(n, 64, [&](int64_t i0, int64_t i1, int) {
    std::vector<float> row(same ? 0 : static_cast<size_t>(n_embd));
    for (int64_t i = i0; i < i1; ++i) {
      uint8_t* dst = m.bytes.data() + static_cast<size_t>(i) * stride;
      if (same) {
        std::memcpy(dst, D.row(ids[i]), stride);
        continue;
      }
      dequantize_neuron(D, ids[i], row.data());
      quantize_row(type, row.data(), dst, n_embd);
    }
  });
  return m;
}

}  // namespace ember::cpu
