#include "ops/cpu/gemm_table.hpp"

#include <array>

#include "core/error.hpp"

namespace ember::cpu::detail {

void GemmColumn::add(DType w, GemmFn fn, bool quads) {
  for (auto& e : entries_)
    if (e.first == w) {
      e.second = {fn, quads};
      return;
    }
  entries_.push_back({w, {fn, quads}});
}

const GemmKernel* GemmColumn::find(DType w) const {
  for (const auto& e : entries_)
    if (e.first == w) return &e.second;
  return nullptr;
}

std::vector<DType> GemmColumn::types() const {
  std::vector<DType> t;
  for (const auto& e : entries_) t.push_back(e.first);
  return t;
}

namespace {

// The columns, filled once; lookups index a flat array (matmul asks on every call).
constexpr int kLevels = 3;  // SimdLevel::scalar, avx2, avx512
constexpr size_t kSlots = 128;

// The slot of a weight type: file types (ids below 64) and their 16-row forms (0x1xxxx); kSlots for others.
size_t slot(DType w) {
  const uint32_t raw = static_cast<uint32_t>(w), hi = raw >> 16, lo = raw & 0xffff;
  return hi <= 1 && lo < 64 ? hi * 64 + lo : kSlots;
}

struct Table {
  std::array<GemmColumn, kLevels> columns;
  std::array<std::array<GemmKernel, kSlots>, kLevels> resolved;  // own kernel, else the scalar one
  std::array<std::array<bool, kSlots>, kLevels> own{};
};

Table build() {
  Table t;
  GemmColumn& scalar = t.columns[static_cast<int>(SimdLevel::scalar)];
  add_gemm_scalar(scalar);
  add_gemm_q5_kquant_scalar(scalar);
  add_gemm_r16_scalar(scalar);
  GemmColumn& avx2 = t.columns[static_cast<int>(SimdLevel::avx2)];
  add_gemm_avx2(avx2);
  add_gemm_q5_kquant_avx2(avx2);
  GemmColumn& avx512 = t.columns[static_cast<int>(SimdLevel::avx512)];
  add_gemm_avx512(avx512);
  add_gemm_q5_kquant_avx512(avx512);
  add_gemm_r16_avx512(avx512);
  for (int l = 0; l < kLevels; ++l)
    for (DType w : scalar.types()) {
      const size_t s = slot(w);
      if (s >= kSlots) continue;
      const GemmKernel* k = t.columns[l].find(w);
      t.own[l][s] = k != nullptr;
      t.resolved[l][s] = k ? *k : *scalar.find(w);
    }
  for (const GemmColumn& c : t.columns)  // every kernel is checked against a scalar one
    for (DType w : c.types())
      EMBER_CHECK(scalar.find(w) != nullptr && slot(w) < kSlots, "gemm table: {} has no scalar kernel", dtype_name(w));
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

bool gemm_has_own(DType w, SimdLevel level) {
  const size_t s = slot(w);
  return s < kSlots && table().own[static_cast<int>(level)][s];
}

std::vector<DType> gemm_weight_types() { return table().columns[static_cast<int>(SimdLevel::scalar)].types(); }

}  // namespace ember::cpu::detail
