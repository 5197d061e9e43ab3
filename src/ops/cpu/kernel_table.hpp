// One operation's kernels keyed by weight type and ISA: the way every type-dependent CPU kernel is
// found (GEMM: gemm/gemm_table.hpp; the sparse paths' row kernels, gathers and axpys: sparse/sparse_impl.hpp;
// the shared-scale axpy: nm4/nm4.hpp). The ISA files fill the table in (an add_* function each, next to
// their kernels); callers ask find() for the current level; tests iterate types() at every level.
#pragma once
#include <array>
#include <utility>
#include <vector>

#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "tensor/dtype.hpp"

namespace ember::cpu::detail {

// Entry: a kernel (a function pointer, or a struct of them convertible to bool: present or not).
template <class Entry>
class KernelTable {
 public:
  // The kernel of `level` for weight type w, added once (a second kernel for the same pair would
  // leave the first one registered, tested and never run).
  void add(SimdLevel level, DType w, Entry e) {
    auto& row = row_of(w);
    EMBER_CHECK(!row[static_cast<size_t>(level)], "kernel table: a second kernel for {} at {}", dtype_name(w),
                simd_level_name(level));
    row[static_cast<size_t>(level)] = e;
  }
  // The kernel of the highest level <= `level` that has one for w (an ISA without a kernel of its
  // own runs the next lower one's); a null Entry when there is none.
  Entry find(DType w, SimdLevel level) const {
    for (const auto& [type, row] : rows_)
      if (type == w)
        for (int l = static_cast<int>(level); l >= 0; --l)
          if (row[static_cast<size_t>(l)]) return row[static_cast<size_t>(l)];
    return Entry{};
  }
  // Whether `level` has a kernel of its own for w.
  bool has_own(DType w, SimdLevel level) const {
    for (const auto& [type, row] : rows_)
      if (type == w) return static_cast<bool>(row[static_cast<size_t>(level)]);
    return false;
  }
  // Every type with a kernel at some level, in the order first added.
  std::vector<DType> types() const {
    std::vector<DType> t;
    for (const auto& r : rows_) t.push_back(r.first);
    return t;
  }

 private:
  static constexpr size_t kLevels = kSimdLevels;
  std::array<Entry, kLevels>& row_of(DType w) {
    for (auto& r : rows_)
      if (r.first == w) return r.second;
    rows_.push_back({w, {}});
    return rows_.back().second;
  }
  std::vector<std::pair<DType, std::array<Entry, kLevels>>> rows_;
};

}  // namespace ember::cpu::detail
