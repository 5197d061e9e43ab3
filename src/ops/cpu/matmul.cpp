#include "ops/cpu/matmul.hpp"

#include <algorithm>
#include <cstring>
#include <span>

#include "core/aligned_buffer.hpp"
#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "ops/cpu/gemm/gemm_table.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {
namespace {

using detail::GemmArgs;
using detail::GemmFn;

// The activation type each weight type's dot product takes (its row in the type table).
DType activation_type(DType w) {
  const std::optional<DType> a = info(w).dot;
  EMBER_CHECK(a.has_value(), "matmul: no kernel for weight type {}", dtype_name(w));
  return *a;
}

// The kernel for a weight type at the current SIMD level (gemm/gemm_table.hpp), and whether it takes
// its activations rearranged rather than as plain quantized rows.
using Kernel = detail::GemmKernel;

const Kernel& gemm_for(DType w) {
  const Kernel& k = detail::gemm_kernel(w, simd_level());
  EMBER_CHECK(k.fn != nullptr, "matmul: no kernel for weight type {}", dtype_name(w));
  return k;
}

// The rearranged activation layout of the kernels with Kernel::quads set: the quad layout
// (gemm/gemm_kernels.hpp), or R16Act blocks for Q4_0_R16 / Q4_1_R16 / Q5_0_R16 / Q8_0_R16 (r16/r16.hpp).
bool r16_act(DType w) {
  return w == DType::Q4_0_R16 || w == DType::Q4_1_R16 || w == DType::Q5_0_R16 || w == DType::Q8_0_R16;
}
bool may_use_quads(DType w) {
  return w == DType::Q4_0 || w == DType::Q4_1 || w == DType::Q5_0 || w == DType::Q5_1 || r16_act(w);
}

size_t rearranged_row_bytes(DType w, int64_t k) {
  return r16_act(w) ? detail::r16_act_row_bytes(k) : detail::quad_row_bytes(k);
}
void rearrange(DType w, const void* xq_row, void* out, int64_t k) {
  if (r16_act(w)) detail::prepare_r16(w, xq_row, out, k);
  else detail::prepare_quads(w, xq_row, out, k);
}

// A repacked matrix's rows come 16 at a time: a range must start and end on a group.
void check_r16_rows(const TensorView& W, int64_t row_begin, int64_t row_end) {
  if (r16_base(W.type) != W.type)
    EMBER_CHECK(row_begin % kR16Rows == 0 && row_end % kR16Rows == 0,
                "rows [{}, {}) of the repacked {} do not start and end on a 16-row group", row_begin, row_end, W.name);
}

// Runs a kernel on activations given as quantize_activations() rows, preparing quads first
// where the kernel wants them (into a per-thread buffer that only grows).
void run_on_quantized(const Kernel& kern, DType w, GemmArgs a) {
  if (!kern.quads) {
    kern.fn(a);
    return;
  }
  thread_local AlignedBuffer<uint8_t> buf;
  const size_t qstride = rearranged_row_bytes(w, a.k);
  buf.resize(qstride * static_cast<size_t>(a.ntok));
  for (int64_t t = 0; t < a.ntok; ++t) rearrange(w, a.x + t * a.x_stride, buf.data() + t * qstride, a.k);
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
constexpr int64_t kTokenBlock = kMatmulTokenBlock;
constexpr int64_t kRowAlign = 16;  // decode splits rows in multiples of this

}  // namespace

void detail::prepare_quads(DType weight_type, const void* xq_row, void* out, int64_t k) {
  const int64_t nb = k / kQK, nq = (nb + 3) / 4;
  const bool q4_1 = weight_type == DType::Q4_1 || weight_type == DType::Q5_1;  // Q8_1 rows
  const int32_t offset = weight_type == DType::Q5_0 ? 16 : 8;                  // Q4_0 or Q5_0
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
        c[4 * i + j] = -offset * sum;
      }
    }
  }
}

size_t matmul_scratch_bytes(DType weight_type, int64_t k, int64_t n_tokens) {
  check_k(weight_type, k);
  size_t bytes = row_bytes(activation_type(weight_type), k) * static_cast<size_t>(n_tokens);
  // Room for the quad layout after the quantized rows (64-byte aligned).
  if (may_use_quads(weight_type)) bytes += 64 + rearranged_row_bytes(weight_type, k) * static_cast<size_t>(n_tokens);
  return bytes;
}

namespace detail {
const ActQuantizers& act_quantizers() {
  static const ActQuantizers none;
  switch (vector_level()) {
    case SimdLevel::avx512: return act_quantizers_avx512();
    case SimdLevel::avx2: return act_quantizers_avx2();
    default: break;
  }
  return none;
}
}  // namespace detail

void quantize_activations(DType weight_type, const float* X, int64_t n_tokens, int64_t k, void* out) {
  check_k(weight_type, k);
  const DType at = activation_type(weight_type);
  const size_t stride = row_bytes(at, k);
  const detail::ActQuantizers& q = detail::act_quantizers();
  void (*fast)(const float*, void*, int64_t) =
      at == DType::Q8_0 ? q.q8_0 : at == DType::Q8_1 ? q.q8_1 : at == DType::Q8_K ? q.q8_k : nullptr;
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
  check_r16_rows(W, row_begin, row_end);
  GemmArgs a{k,        W.row(row_begin), W.row_stride(), row_end - row_begin,
             static_cast<const uint8_t*>(x_quantized), row_bytes(activation_type(W.type), k),
             n_tokens, Y,   y_stride};
  run_on_quantized(gemm_for(W.type), W.type, a);
}

const void* prepare_activations(DType w, const void* x_quantized, int64_t n_tokens, int64_t k, size_t* x_stride) {
  check_k(w, k);
  *x_stride = row_bytes(activation_type(w), k);
  if (!gemm_for(w).quads) return x_quantized;
  thread_local AlignedBuffer<uint8_t> buf;
  const size_t qstride = rearranged_row_bytes(w, k);
  buf.resize(qstride * static_cast<size_t>(std::max<int64_t>(n_tokens, 1)));
  for (int64_t t = 0; t < n_tokens; ++t)
    rearrange(w, static_cast<const uint8_t*>(x_quantized) + t * *x_stride, buf.data() + t * qstride, k);
  *x_stride = qstride;
  return buf.data();
}

void matmul_rows_prepared(const TensorView& W, const void* x_prepared, size_t x_stride, int64_t n_tokens,
                          int64_t row_begin, int64_t row_end, float* Y, int64_t y_stride) {
  if (row_end <= row_begin || n_tokens <= 0) return;
  check_r16_rows(W, row_begin, row_end);
  GemmArgs a{W.cols(), W.row(row_begin), W.row_stride(), row_end - row_begin, static_cast<const uint8_t*>(x_prepared),
             x_stride, n_tokens, Y, y_stride};
  gemm_for(W.type).fn(a);
}

namespace {

// Activations as the kernel reads them: quantized rows, or their quad layout, or X itself.
using Prepared = PreparedRows;

// f(t0, t1) for the tokens: on the calling thread for one token, else split over the pool.
template <class F>
void over_tokens(ThreadPool& pool, int64_t n_tokens, const F& f) {
  if (n_tokens == 1 || pool.size() == 1) {
    f(int64_t{0}, n_tokens);
    return;
  }
  pool.run([&](int ith, int nth) {
    int64_t t0, t1;
    split_range(n_tokens, ith, nth, t0, t1);
    f(t0, t1);
  });
}

// Quantizes X once for all matrices of type w (rows into the scratch, quads after them).
Prepared prepare_activations(ThreadPool& pool, const Kernel& kern, DType w, const float* X, int64_t n_tokens,
                             int64_t k, void* scratch) {
  const DType at = activation_type(w);
  if (at == DType::F32) return {reinterpret_cast<const uint8_t*>(X), row_bytes(at, k)};  // float weights take X
  const size_t x_stride = row_bytes(at, k);
  auto* out = static_cast<uint8_t*>(scratch);
  if (!kern.quads) {
    const auto quantize = [&](int64_t t0, int64_t t1) {
      if (t1 > t0) quantize_activations(w, X + t0 * k, t1 - t0, k, out + t0 * x_stride);
    };
    over_tokens(pool, n_tokens, quantize);
    return {out, x_stride};
  }
  // Quad-layout kernels: straight from X where the ISA can (bit-identical to quantizing and
  // rearranging), else through the quantized rows in the scratch.
  uint8_t* quads = align64(out + x_stride * n_tokens);
  const size_t qstride = rearranged_row_bytes(w, k);
  const detail::ActQuantizers& q = detail::act_quantizers();
  void (*direct)(const float*, void*, int64_t) = w != DType::Q4_0 && w != DType::Q4_1  // Q5_0/Q5_1 quads differ
                                                     ? nullptr
                                                     : at == DType::Q8_0 ? q.quads_q8_0 : q.quads_q8_1;
  const auto prepare = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (direct) {
        direct(X + t * k, quads + t * qstride, k);
      } else {
        quantize_activations(w, X + t * k, 1, k, out + t * x_stride);
        rearrange(w, out + t * x_stride, quads + t * qstride, k);
      }
    }
  };
  over_tokens(pool, n_tokens, prepare);
  return {quads, qstride};
}

// Decode (one token): rows are handed out in chunks, dynamically, so that a thread that starts
// late or streams slower (the two cores rarely read at the same rate) does not leave the other
// waiting at the end of every product. A chunk is a multiple of kRowAlign rows and at most a
// quarter of a thread's even share, so each thread still streams long contiguous runs.
int64_t decode_chunk_rows(int64_t rows, int nth) {
  const int64_t share = (rows + 4 * nth - 1) / (4 * nth);
  return std::max<int64_t>(kRowAlign, (share + kRowAlign - 1) / kRowAlign * kRowAlign);
}

// Rows [r0, r1) of W for one token into y[r0, r1).
void decode_slice(GemmFn fn, const TensorView& W, const Prepared& x, int64_t r0, int64_t r1, float* y) {
  if (r1 <= r0) return;
  GemmArgs a{W.cols(), W.row(r0), W.row_stride(), r1 - r0, x.x, x.stride, 1, y + r0, W.rows()};
  fn(a);
}

// Runs f(matrix index, r0, r1) over the decode chunks of all matrices in `rows`, dynamically.
template <class F>
void decode_chunks(ThreadPool& pool, std::span<const int64_t> rows, const F& f) {
  int64_t total = 0;
  int64_t chunk[8], first[9];
  EMBER_CHECK(rows.size() <= 8, "decode_chunks: at most 8 matrices per dispatch, got {}", rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    chunk[i] = decode_chunk_rows(rows[i], pool.size());
    first[i] = total;
    total += (rows[i] + chunk[i] - 1) / chunk[i];
  }
  first[rows.size()] = total;
  pool.parallel_for(total, 1, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c) {
      size_t i = 0;
      while (c >= first[i + 1]) ++i;
      const int64_t r0 = (c - first[i]) * chunk[i];
      f(i, r0, std::min(rows[i], r0 + chunk[i]));
    }
  });
}

// Several products sharing prepared activations, in one dispatch. Decode splits each matrix
// over the threads; prompts hand out blocks of rows x tokens of all matrices dynamically.
void run_products(ThreadPool& pool, GemmFn fn, std::span<const MatmulOut> outs, const Prepared& x, int64_t n_tokens) {
  if (n_tokens == 1) {
    int64_t rows[8];
    EMBER_CHECK(outs.size() <= 8, "matmul_multi: at most 8 matrices per call, got {}", outs.size());
    for (size_t i = 0; i < outs.size(); ++i) rows[i] = outs[i].w.rows();
    decode_chunks(pool, std::span<const int64_t>(rows, outs.size()), [&](size_t i, int64_t r0, int64_t r1) {
      decode_slice(fn, outs[i].w, x, r0, r1, outs[i].y);
    });
    return;
  }
  // Row blocks of all matrices numbered one after the other.
  int64_t total = 0;
  for (const MatmulOut& o : outs) total += (o.w.rows() + kRowBlock - 1) / kRowBlock;
  pool.parallel_for(total, 1, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t local = b;
      size_t i = 0;
      for (int64_t nb; local >= (nb = (outs[i].w.rows() + kRowBlock - 1) / kRowBlock); ++i) local -= nb;
      const TensorView& W = outs[i].w;
      const int64_t rows = W.rows(), r0 = local * kRowBlock, r1 = std::min(rows, r0 + kRowBlock);
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
        const int64_t nt = std::min(kTokenBlock, n_tokens - t0);
        GemmArgs a{W.cols(), W.row(r0), W.row_stride(), r1 - r0, x.x + t0 * x.stride, x.stride,
                   nt,       outs[i].y + t0 * rows + r0, rows};
        fn(a);
      }
    }
  });
}

// The type and width all matrices share (each fused call takes one activation quantization).
void check_same_input(std::span<const MatmulOut> outs) {
  EMBER_CHECK(!outs.empty(), "matmul_multi: no matrices");
  for (const MatmulOut& o : outs)
    EMBER_CHECK(o.w.type == outs[0].w.type && o.w.cols() == outs[0].w.cols(),
                "matmul_multi: {} ({}, {} columns) does not share the type and width of {} ({}, {} columns)", o.w.name,
                dtype_name(o.w.type), o.w.cols(), outs[0].w.name, dtype_name(outs[0].w.type), outs[0].w.cols());
}

}  // namespace

void matmul_multi(ThreadPool& pool, std::span<const MatmulOut> outs, const float* X, int64_t n_tokens, void* scratch) {
  check_same_input(outs);
  const TensorView& W0 = outs[0].w;
  const int64_t k = W0.cols();
  check_k(W0.type, k);
  if (n_tokens <= 0) return;
  const Kernel kern = gemm_for(W0.type);
  const Prepared x = prepare_activations(pool, kern, W0.type, X, n_tokens, k, scratch);
  run_products(pool, kern.fn, outs, x, n_tokens);
}

size_t prepared_row_bytes(DType weight_type, int64_t k) {
  check_k(weight_type, k);
  return gemm_for(weight_type).quads ? rearranged_row_bytes(weight_type, k) : row_bytes(activation_type(weight_type), k);
}

PreparedRows prepare_rows(ThreadPool& pool, DType weight_type, const float* X, int64_t n_tokens, int64_t k,
                          void* scratch) {
  check_k(weight_type, k);
  return prepare_activations(pool, gemm_for(weight_type), weight_type, X, n_tokens, k, scratch);
}

void matmul(ThreadPool& pool, const TensorView& W, const float* X, int64_t n_tokens, float* Y, void* scratch) {
  const MatmulOut one[] = {{W, Y}};
  matmul_multi(pool, one, X, n_tokens, scratch);
}

void matmul_gated_each(ThreadPool& pool, std::span<const GatedOut> outs, Activation act, const float* x,
                       void* scratch) {
  EMBER_CHECK(!outs.empty() && outs.size() <= 8, "matmul_gated_each: 1 to 8 products, got {}", outs.size());
  int64_t rows[8];
  for (size_t i = 0; i < outs.size(); ++i) {
    const GatedOut& o = outs[i];
    const MatmulOut pair[] = {{*o.gate, o.out}, {*o.up, o.up_buf}, {*outs[0].gate, o.out}};
    check_same_input(pair);
    EMBER_CHECK(o.gate->rows() == o.up->rows(), "matmul_gated: {} has {} rows but {} has {}", o.gate->name,
                o.gate->rows(), o.up->name, o.up->rows());
    rows[i] = o.gate->rows();
  }
  const TensorView& W0 = *outs[0].gate;
  check_k(W0.type, W0.cols());
  const Kernel kern = gemm_for(W0.type);
  const Prepared xp = prepare_activations(pool, kern, W0.type, x, 1, W0.cols(), scratch);
  // Each thread gates the neurons whose gate and up rows it computed: no second pass.
  decode_chunks(pool, std::span<const int64_t>(rows, outs.size()), [&](size_t i, int64_t r0, int64_t r1) {
    const GatedOut& o = outs[i];
    decode_slice(kern.fn, *o.gate, xp, r0, r1, o.out);
    decode_slice(kern.fn, *o.up, xp, r0, r1, o.up_buf);
    gated_activation(act, o.out + r0, o.up_buf + r0, o.out + r0, r1 - r0);
  });
}

size_t matmul_each_scratch_bytes(DType weight_type, int64_t k, size_t n_jobs) {
  return n_jobs * (matmul_scratch_bytes(weight_type, k, 1) + 64);
}

void matmul_each(ThreadPool& pool, std::span<const MatmulJob> jobs, void* scratch) {
  EMBER_CHECK(!jobs.empty() && jobs.size() <= 8, "matmul_each: 1 to 8 products, got {}", jobs.size());
  const TensorView& W0 = *jobs[0].w;
  const int64_t k = W0.cols();
  check_k(W0.type, k);
  const Kernel kern = gemm_for(W0.type);
  const size_t each = matmul_scratch_bytes(W0.type, k, 1) + 64;
  Prepared xp[8];
  int64_t rows[8];
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulOut pair[] = {{W0, jobs[i].y}, {*jobs[i].w, jobs[i].y}};
    check_same_input(pair);
    xp[i] = prepare_activations(pool, kern, W0.type, jobs[i].x, 1, k, align64(static_cast<uint8_t*>(scratch) + i * each));
    rows[i] = jobs[i].w->rows();
  }
  decode_chunks(pool, std::span<const int64_t>(rows, jobs.size()), [&](size_t i, int64_t r0, int64_t r1) {
    decode_slice(kern.fn, *jobs[i].w, xp[i], r0, r1, jobs[i].y);
  });
}

void matmul_gated(ThreadPool& pool, const TensorView& gate, const TensorView& up, Activation act, const float* X,
                  int64_t n_tokens, float* out, float* up_buf, void* scratch) {
  if (n_tokens == 1) {
    const GatedOut one[] = {{&gate, &up, out, up_buf}};
    return matmul_gated_each(pool, one, act, X, scratch);
  }
  EMBER_CHECK(gate.rows() == up.rows(), "matmul_gated: {} has {} rows but {} has {}", gate.name, gate.rows(), up.name,
              up.rows());
  const MatmulOut outs[] = {{gate, out}, {up, up_buf}};
  check_same_input(outs);
  const int64_t k = gate.cols(), rows = gate.rows();
  check_k(gate.type, k);
  if (n_tokens <= 0) return;
  const Kernel kern = gemm_for(gate.type);
  const Prepared x = prepare_activations(pool, kern, gate.type, X, n_tokens, k, scratch);
  run_products(pool, kern.fn, outs, x, n_tokens);
  constexpr int64_t kChunk = 4096;
  const int64_t total = n_tokens * rows;
  pool.parallel_for((total + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1, int) {
    const int64_t i0 = c0 * kChunk, i1 = std::min(total, c1 * kChunk);
    gated_activation(act, out + i0, up_buf + i0, out + i0, i1 - i0);
  });
}

void get_rows(const TensorView& W, const int32_t* ids, int64_t n, float* out) {
  const int64_t k = W.cols(), rows = W.rows();
  const DType base = r16_base(W.type);
  // A repacked matrix (a tied output matrix that is also the token embedding): the row's group
  // of 16 unpacked, then its row (into a per-thread buffer that only grows).
  thread_local std::vector<uint8_t> group;
  for (int64_t i = 0; i < n; ++i) {
    EMBER_CHECK(ids[i] >= 0 && ids[i] < rows, "get_rows: row id {} out of range [0, {}) of {}", ids[i], rows, W.name);
    if (base == W.type) {
      dequantize_row(W.type, W.row(ids[i]), out + i * k, k);
      continue;
    }
    group.resize(W.row_stride() * static_cast<size_t>(kR16Rows));
    const int64_t g = ids[i] / kR16Rows;
    unpack_r16(base, W.row(g * kR16Rows), kR16Rows, k, group.data());
    dequantize_row(base, group.data() + static_cast<size_t>(ids[i] % kR16Rows) * W.row_stride(), out + i * k, k);
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
