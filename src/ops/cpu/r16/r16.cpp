// The 16-row repacked formats (r16.hpp), one row each: the file type, its repacked type, and the
// functions that repack it and (where the layout allows) unpack it; and the R16Act activations
// their kernels read.
#include "ops/cpu/r16/r16.hpp"

#include <cstring>

#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "ops/cpu/gemm/gemm_table.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu {
namespace {

using RepackFn = void (*)(const void* src, int64_t rows, int64_t k, void* dst);

// The repacked layouts' functions, by repacked type (the file type's row in the type table names its
// repacked form, tensor/dtype.cpp).
struct R16Format {
  DType packed;
  RepackFn repack;
  RepackFn unpack;  // null: not unpackable
};

constexpr R16Format kFormats[] = {
    {DType::Q4_0_R16, &detail::repack_q4_0_r16, &detail::unpack_q4_0_r16},
    {DType::Q4_1_R16, &detail::repack_q4_1_r16, &detail::unpack_q4_1_r16},
    {DType::Q5_0_R16, &detail::repack_q5_0_r16, &detail::unpack_q5_0_r16},
    {DType::Q8_0_R16, &detail::repack_q8_0_r16, &detail::unpack_q8_0_r16},
    {DType::Q4_K_R16, &detail::repack_q4_k_r16, nullptr},
    {DType::Q5_K_R16, &detail::repack_q5_k_r16, nullptr},
    {DType::Q6_K_R16, &detail::repack_q6_k_r16, nullptr},
};

// The format of file type t's repacked form, or null.
const R16Format* format_of(DType t) {
  const std::optional<DType> packed = info(t).repacked;
  if (!packed) return nullptr;
  for (const R16Format& f : kFormats)
    if (f.packed == *packed) return &f;
  fail("{}'s repacked form {} has no repacking", dtype_name(t), dtype_name(*packed));
}

}  // namespace

bool r16_pays(DType t) {
  const R16Format* f = format_of(t);
  if (!f) return false;
  for (int l = static_cast<int>(simd_level()); l > 0; --l)  // a SIMD kernel at this level or one it falls back to
    if (detail::gemm_has_own(f->packed, static_cast<SimdLevel>(l))) return true;
  return false;
}

bool r16_fast() {
  for (const R16Format& f : kFormats)
    if (r16_pays(r16_base(f.packed))) return true;
  return false;
}

DType r16_type(DType t) { return info(t).repacked.value_or(t); }

DType r16_base(DType t) {
  const std::optional<DType> base = info(t).base;
  return base && info(*base).repacked == t ? *base : t;
}

void repack_r16(DType t, const void* src, int64_t rows, int64_t k, void* dst) {
  const R16Format* f = format_of(t);
  EMBER_CHECK(f != nullptr, "no 16-row repacked layout for {}", dtype_name(t));
  f->repack(src, rows, k, dst);
}

bool r16_unpackable(DType t) {
  const R16Format* f = format_of(t);
  return f && f->unpack;
}

void unpack_r16(DType t, const void* src, int64_t rows, int64_t k, void* dst) {
  const R16Format* f = format_of(t);
  EMBER_CHECK(f && f->unpack, "unpack_r16: {} has no unpacking", dtype_name(t));
  f->unpack(src, rows, k, dst);
}

namespace detail {

void prepare_r16(DType weight_type, const void* q8_row, void* out, int64_t k) {
  auto* o = static_cast<R16Act*>(out);
  for (int64_t b = 0; b < k / kQK; ++b) {
    const int8_t* qs;
    if (weight_type == DType::Q4_1_R16) {  // Q8_1 rows: s = d * sum(q) as ggml stores it (fp16)
      const auto& in = static_cast<const BlockQ8_1*>(q8_row)[b];
      o[b].d = fp16_to_fp32(in.d);
      o[b].s = fp16_to_fp32(in.s);
      qs = in.qs;
    } else {
      const auto& in = static_cast<const BlockQ8_0*>(q8_row)[b];
      int32_t sum = 0;
      for (int i = 0; i < kQK; ++i) sum += in.qs[i];
      o[b].d = fp16_to_fp32(in.d);
      o[b].c = (weight_type == DType::Q8_0_R16 ? -128 : weight_type == DType::Q5_0_R16 ? -16 : -8) * sum;
      qs = in.qs;
    }
    std::memcpy(o[b].qs, qs, kQK);
  }
}

}  // namespace detail
}  // namespace ember::cpu
