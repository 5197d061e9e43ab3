#include "sparse/reorder.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.hpp"
#include "ops/cpu/sparse/sparse.hpp"

namespace ember {

std::vector<int32_t> hot_first_permutation(const float* counts, int64_t n) {
  std::vector<int32_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return counts[a] > counts[b]; });
  return perm;
}

std::vector<int32_t> inverse_permutation(const std::vector<int32_t>& perm) {
  std::vector<int32_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[static_cast<size_t>(perm[i])] = static_cast<int32_t>(i);
  return inv;
}

bool is_permutation(const std::vector<int32_t>& perm, int64_t n) {
  if (static_cast<int64_t>(perm.size()) != n) return false;
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (int32_t p : perm) {
    if (p < 0 || p >= n || seen[static_cast<size_t>(p)]) return false;
    seen[static_cast<size_t>(p)] = true;
  }
  return true;
}

std::vector<uint8_t> permute_rows(const TensorView& t, const std::vector<int32_t>& perm) {
  const bool vector = t.n_dims <= 1;
  const int64_t rows = vector ? t.n_elements() : t.rows();
  EMBER_CHECK(is_permutation(perm, rows), "reorder: permutation of {} entries does not fit '{}' ({} rows)", perm.size(),
              t.name, rows);
  EMBER_CHECK(!vector || t.type == DType::F32, "reorder: 1-D tensor '{}' must be F32, is {}", t.name, dtype_name(t.type));
  const size_t stride = vector ? sizeof(float) : t.row_stride();
  std::vector<uint8_t> out(stride * static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(out.data() + static_cast<size_t>(i) * stride, t.data + static_cast<size_t>(perm[i]) * stride, stride);
  return out;
}

std::vector<uint8_t> permute_bundle(const std::vector<TensorView>& parts, const std::vector<int32_t>& perm,
                                    size_t stride) {
  size_t bytes = 0;
  for (const TensorView& t : parts) {
    EMBER_CHECK(t.n_dims == 2 && is_permutation(perm, t.rows()), "reorder: permutation of {} entries does not fit '{}' "
                "({} rows)", perm.size(), t.name, t.rows());
    bytes += t.row_size();
  }
  EMBER_CHECK(bytes <= stride, "reorder: a bundle of {} bytes does not fit a stride of {}", bytes, stride);
  std::vector<uint8_t> out(stride * perm.size(), 0);
  for (size_t i = 0; i < perm.size(); ++i) {
    uint8_t* row = out.data() + i * stride;
    for (const TensorView& t : parts) {
      std::memcpy(row, t.row(perm[i]), t.row_size());
      row += t.row_size();
    }
  }
  return out;
}

std::vector<uint8_t> neuron_major_permuted(ThreadPool& pool, const TensorView& down, DType type,
                                           const std::vector<int32_t>& perm) {
  const cpu::NeuronMajorMatrix nm = cpu::make_neuron_major(pool, down, type);
  return permute_rows(nm.view, perm);
}

}  // namespace ember
