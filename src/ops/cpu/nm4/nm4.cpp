#include "ops/cpu/nm4/nm4.hpp"

#include <cmath>
#include <cstring>

#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {
namespace {

// Code of neuron i at output j.
inline int code_at(const TensorView& D, int64_t i, int64_t j) {
  const Nm4Position p = nm4_code_position(D.cols(), j);
  return (nm4_row(D, i)[nm4_chunk_at(D.cols(), j).start / 2 + p.byte] >> p.shift) & 0x0F;
}

}  // namespace

DType nm4_type_of(DType down_type, bool narrow) {
  EMBER_CHECK(down_type == DType::Q4_0 || down_type == DType::Q4_1 || down_type == DType::Q4_K,
              "neuron-major 4-bit copy: down must be Q4_0, Q4_1 or Q4_K, not {}", dtype_name(down_type));
  if (down_type == DType::Q4_0) return narrow ? DType::Q4_0_NM8 : DType::Q4_0_NM;
  return narrow ? DType::Q4_1_NM8 : DType::Q4_1_NM;
}

size_t nm4_block_table_bytes(DType t, int64_t n_embd) {
  const size_t n = static_cast<size_t>(nm4_tables_per_block(t)) * static_cast<size_t>(n_embd);
  return nm4_narrow(t) ? n + n / kNm8Group * 2 * sizeof(uint16_t) : n * sizeof(uint16_t);
}

size_t nm4_table_bytes(DType t, int64_t n_ff, int64_t n_embd) {
  return static_cast<size_t>(n_ff / kNm4Block) * nm4_block_table_bytes(t, n_embd);
}

size_t nm4_bytes(DType t, int64_t n_ff, int64_t n_embd) {
  return static_cast<size_t>(n_ff) * static_cast<size_t>(n_embd / 2) + nm4_table_bytes(t, n_ff, n_embd);
}

void nm4_narrow_table(const float* v, int64_t n, uint8_t* codes, uint16_t* scale_base) {
  for (int64_t g = 0; g < n / kNm8Group; ++g) {
    const float* x = v + g * kNm8Group;
    const auto [lo, hi] = std::minmax_element(x, x + kNm8Group);
    const uint16_t base16 = fp32_to_fp16(*lo);
    const float base = fp16_to_fp32(base16);
    const uint16_t scale16 = fp32_to_fp16(std::max(*hi - base, 0.0f) / 255.0f);
    const float scale = fp16_to_fp32(scale16);  // the codes are steps of the scale and base as stored
    scale_base[2 * g] = scale16;
    scale_base[2 * g + 1] = base16;
    for (int64_t k = 0; k < kNm8Group; ++k) {
      const float c = scale > 0.0f ? std::nearbyint((x[k] - base) / scale) : 0.0f;
      codes[g * kNm8Group + k] = c >= 255.0f ? 255 : c > 0.0f ? static_cast<uint8_t>(c) : 0;  // (NaN: 0)
    }
  }
}

Nm4Chunk nm4_chunk_at(int64_t n_embd, int64_t j) {
  // 128 wide, or at a row's end 64 and then 32, or 32.
  const int64_t start = j / kNm4Chunk * kNm4Chunk, rest = n_embd - start;
  if (rest >= kNm4Chunk) return {start, kNm4Chunk};
  if (rest >= 64) return j < start + 64 ? Nm4Chunk{start, 64} : Nm4Chunk{start + 64, 32};
  return {start, 32};
}

Nm4Position nm4_code_position(int64_t n_embd, int64_t j) {
  const Nm4Chunk c = nm4_chunk_at(n_embd, j);
  const int64_t x = j - c.start, half = c.width / 2, lanes = c.width / 32;
  const int shift = x < half ? 0 : 4;
  const int64_t y = x < half ? x : x - half;  // position among the chunk's low (or high) nibbles
  const int64_t m = y / (4 * lanes), lane = y % (4 * lanes) / 4, k = y % 4;
  return {16 * lane + 4 * m + k, shift};
}

float nm4_table_value(const TensorView& D, int64_t i, int64_t j, bool min) {
  const int64_t b = i / kNm4Block, at = (min ? D.cols() : 0) + j;
  if (!nm4_narrow(D.type)) return fp16_to_fp32(nm4_scales(D, b)[at]);
  const uint16_t* sb = nm4_group_scales(D, b) + 2 * (at / kNm8Group);
  return static_cast<float>(nm4_codes8(D, b)[at]) * fp16_to_fp32(sb[0]) + fp16_to_fp32(sb[1]);  // (exact product)
}

void nm4_from_down(ThreadPool& pool, const TensorView& down, DType t, uint8_t* dst) {
  EMBER_CHECK(is_nm4(t) && nm4_type_of(down.type, nm4_narrow(t)) == t, "neuron-major copy of {}: a {} matrix "
              "cannot become {}", down.name, dtype_name(down.type), dtype_name(t));
  const int64_t n_ff = down.cols(), n_embd = down.rows();
  EMBER_CHECK(n_ff % kNm4Block == 0 && n_embd % 32 == 0, "neuron-major copy of {}: n_ff {} and n_embd {} must be "
              "multiples of 32", down.name, n_ff, n_embd);
  TensorView D;
  D.type = t;
  D.n_dims = 2;
  D.ne[0] = n_embd;
  D.ne[1] = n_ff;
  D.data = dst;
  const bool q41 = nm4_has_min(t), q4k = down.type == DType::Q4_K, narrow = nm4_narrow(t);
  const size_t in_block = q41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  std::memset(dst, 0, static_cast<size_t>(n_ff) * static_cast<size_t>(n_embd / 2));
  pool.parallel_for(n_ff / kNm4Block, 1, [&](int64_t b0, int64_t b1, int) {
    uint8_t q[32];
    std::vector<float> table(static_cast<size_t>(2 * n_embd));  // a block's d, then m, as floats
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t r = 0; r < n_embd; ++r) {
        float& d = table[static_cast<size_t>(r)];
        float& m = table[static_cast<size_t>(n_embd + r)];
        if (q4k) {  // sub-block b % 8 of super-block b / 8: x = d sc q - dmin m, as Q4_1 d' q + m'
          const auto* blk = reinterpret_cast<const BlockQ4_K*>(down.row(r)) + b / 8;
          const int sub = static_cast<int>(b % 8);
          uint8_t sc, mn;
          kquant_scale_min(blk->scales, sub, sc, mn);
          d = fp16_to_fp32(blk->d) * static_cast<float>(sc);
          m = -(fp16_to_fp32(blk->dmin) * static_cast<float>(mn));
          const uint8_t* qs = blk->qs + 32 * (sub / 2);  // low nibbles: even sub-blocks, high: odd
          for (int k = 0; k < 32; ++k) q[k] = sub % 2 == 0 ? (qs[k] & 0x0F) : (qs[k] >> 4);
        } else {  // the block's own scale (and min); neuron k: low nibble of byte k (k < 16), else high of k - 16
          const uint8_t* blk = down.row(r) + static_cast<size_t>(b) * in_block;
          const uint8_t* qs = blk + (q41 ? 4 : 2);
          uint16_t h[2];
          std::memcpy(h, blk, q41 ? 2 * sizeof(uint16_t) : sizeof(uint16_t));
          d = fp16_to_fp32(h[0]);  // exact: back to fp16 unchanged below
          if (q41) m = fp16_to_fp32(h[1]);
          for (int k = 0; k < 32; ++k) q[k] = k < 16 ? (qs[k] & 0x0F) : (qs[k - 16] >> 4);
        }
        const Nm4Position at = nm4_code_position(n_embd, r);
        const int64_t byte = nm4_chunk_at(n_embd, r).start / 2 + at.byte;
        for (int k = 0; k < 32; ++k)
          const_cast<uint8_t*>(nm4_row(D, b * kNm4Block + k))[byte] |= static_cast<uint8_t>(q[k] << at.shift);
      }
      const int tables = nm4_tables_per_block(t);
      if (narrow) {
        auto* codes = const_cast<uint8_t*>(nm4_codes8(D, b));
        auto* scales = const_cast<uint16_t*>(nm4_group_scales(D, b));
        for (int k = 0; k < tables; ++k)
          nm4_narrow_table(table.data() + k * n_embd, n_embd, codes + k * n_embd,
                           scales + 2 * k * (n_embd / kNm8Group));
      } else {
        auto* out = const_cast<uint16_t*>(nm4_scales(D, b));
        for (int64_t k = 0; k < tables * n_embd; ++k) out[k] = fp32_to_fp16(table[static_cast<size_t>(k)]);
      }
    }
  });
}

void nm4_dequantize_neuron(const TensorView& D, int64_t i, float* dst) {
  const int64_t n = D.cols();
  for (int64_t j = 0; j < n; ++j) {
    const int q = code_at(D, i, j);
    dst[j] = nm4_has_min(D.type)
                 ? nm4_table_value(D, i, j, false) * static_cast<float>(q) + nm4_table_value(D, i, j, true)
                 : nm4_table_value(D, i, j, false) * static_cast<float>(q - 8);
  }
}

namespace detail {

void nm4_prepare_segments(const int32_t* rows, const float* h, int64_t n, std::vector<Nm4Seg>& segs) {
  segs.clear();
  nm4_segments(rows, h, n, [&](const int32_t* ids, const float* hs, int c, int64_t block, int64_t) {
    const Nm4Factors f = nm4_quantize_factors(hs, c);
    Nm4Seg& s = segs.emplace_back();  // (built in place: a copy of the struct cost as much as the rest)
    s.count = c;
    s.quads = (c + 3) / 4;
    for (int r = 0; r < 4 * s.quads; ++r) s.ids[r] = ids[r < c ? r : c - 1];
    for (int k = 0; k < s.quads; ++k) {
      uint32_t lane = 0;
      for (int r = 0; r < 4; ++r) lane |= static_cast<uint32_t>(static_cast<uint8_t>(f.q[4 * k + r])) << (8 * r);
      s.quad_f[k] = static_cast<int32_t>(lane);
    }
    for (int r = 0; r < c; ++r) s.q[r] = f.q[r];
    s.offset = 8 * f.q_sum;
    s.scale = f.scale;
    s.sum = f.sum;
    s.block = block;
  });
}

void nm4_axpy_scalar(const TensorView& D, const Nm4Seg* segs, int64_t n_segs, int64_t col0, int64_t len,
                     float* out) {
  const bool q41 = nm4_has_min(D.type), narrow = nm4_narrow(D.type);
  for (int64_t j = 0; j < len; ++j) {
    float o = out[j];
    for (int64_t k = 0; k < n_segs; ++k) {
      const Nm4Seg& s = segs[k];
      int32_t acc = 0;
      for (int r = 0; r < s.count; ++r) {
        const int q = code_at(D, s.ids[r], col0 + j);
        acc += s.q[r] * (q41 ? q : q - 8);
      }
      const int64_t i = s.ids[0], c = col0 + j;
      if (narrow) {  // the group's scale and base taken into the segment's factors (nm4/nm4.hpp)
        const Nm4Tables t = nm4_tables(D, s.block);
        const uint16_t* dsb = t.dsb + 2 * (c / kNm8Group);
        if (q41) {
          const uint16_t* msb = t.msb + 2 * (c / kNm8Group);
          o = o + std::fma(static_cast<float>(t.mc[c]), fp16_to_fp32(msb[0]) * s.sum, fp16_to_fp32(msb[1]) * s.sum);
        }
        const float de = std::fma(static_cast<float>(t.dc[c]), fp16_to_fp32(dsb[0]) * s.scale,
                                  fp16_to_fp32(dsb[1]) * s.scale);
        o = std::fma(de, static_cast<float>(acc), o);
        continue;
      }
      if (q41) o = std::fma(nm4_table_value(D, i, c, true), s.sum, o);
      o = std::fma(nm4_table_value(D, i, c, false) * s.scale, static_cast<float>(acc), o);
    }
    out[j] = o;
  }
}

}  // namespace detail

void detail::add_nm4_axpys(KernelTable<Nm4AxpyFn>& t, SimdLevel level, const std::array<Nm4AxpyFn, 4>& fns) {
  const DType types[] = {DType::Q4_0_NM, DType::Q4_1_NM, DType::Q4_0_NM8, DType::Q4_1_NM8};
  for (size_t i = 0; i < 4; ++i) t.add(level, types[i], fns[i]);
}

const detail::KernelTable<detail::Nm4AxpyFn>& detail::nm4_axpy_table() {
  static const KernelTable<Nm4AxpyFn> t = [] {
    KernelTable<Nm4AxpyFn> k;
    add_nm4_axpys(k, SimdLevel::scalar, {&nm4_axpy_scalar, &nm4_axpy_scalar, &nm4_axpy_scalar, &nm4_axpy_scalar});
    add_nm4_axpy_avx2(k);
    add_nm4_axpy_avx_vnni(k);
    add_nm4_axpy_avx512(k);
    return k;
  }();
  return t;
}

void nm4_axpy(const TensorView& D, const int32_t* rows, const float* h, int64_t n, int64_t col0, int64_t len,
              float* out) {
  EMBER_CHECK(is_nm4(D.type) && col0 % kNm4Chunk == 0 && len > 0 && col0 + len <= D.cols() &&
                  ((col0 + len) % kNm4Chunk == 0 || col0 + len == D.cols()),
              "nm4_axpy: {} columns [{}, {}) of a {}-wide {} matrix", D.name, col0, col0 + len, D.cols(),
              dtype_name(D.type));
  thread_local std::vector<detail::Nm4Seg> segs;
  detail::nm4_prepare_segments(rows, h, n, segs);
  if (segs.empty()) return;
  detail::nm4_axpy_table().find(D.type, simd_level())(D, segs.data(), static_cast<int64_t>(segs.size()), col0, len, out);
}

}  // namespace ember::cpu
