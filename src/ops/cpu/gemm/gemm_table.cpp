#include "ops/cpu/gemm/gemm_table.hpp"

#include <array>

#include "core/error.hpp"

namespace ember::cpu::detail {

namespace {

// The table, filled once; lookups index a flat array of what it finds (matmul asks on every call).
constexpr int kLevels = kSimdLevels;
constexpr size_t kSlots = 128;

// The slot of a weight type: file types (ids below 64) and their 16-row forms (0x1xxxx); kSlots for others.
size_t slot(DType w) {
  const uint32_t raw = static_cast<uint32_t>(w), hi = raw >> 16, lo = raw & 0xffff;
  return hi <= 1 && lo < 64 ? hi * 64 + lo : kSlots;
}

struct Table {
  GemmTable kernels;
  std::array<std::array<GemmKernel, kSlots>, kLevels> resolved;  // KernelTable::find, flat
};

Table build() {
  Table t;
  add_gemm_scalar(t.kernels);
  add_gemm_q5_kquant_scalar(t.kernels);
  add_gemm_r16_scalar(t.kernels);
  add_gemm_avx2(t.kernels);
  add_gemm_q5_kquant_avx2(t.kernels);
  add_gemm_r16_avx2(t.kernels);
  add_gemm_r16_avx_vnni(t.kernels);
  add_gemm_avx512(t.kernels);
  add_gemm_q5_kquant_avx512(t.kernels);
  add_gemm_r16_avx512(t.kernels);
  for (DType w : t.kernels.types()) {  // every kernel is checked against a scalar one
    const size_t s = slot(w);
    EMBER_CHECK(t.kernels.has_own(w, SimdLevel::scalar) && s < kSlots, "gemm table: {} has no scalar kernel",
                dtype_name(w));
    for (int l = 0; l < kLevels; ++l) t.resolved[l][s] = t.kernels.find(w, static_cast<SimdLevel>(l));
  }
  return t;
}

const Table& table() {
  static const Table t = build();
  return t;
}

}  // namespace

const GemmKernel& gemm_kernel(DType w, SimdLevel level) {
  static const GemmKernel none;
  const size_t s = slot(w);
  return s < kSlots ? table().resolved[static_cast<int>(level)][s] : none;
}

bool gemm_has_own(DType w, SimdLevel level) { return table().kernels.has_own(w, level); }

std::vector<DType> gemm_weight_types() { return table().kernels.types(); }

}  // namespace ember::cpu::detail
