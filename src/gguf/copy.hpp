// Writing a GGUF file that is another one with changes (`ember prepare`, `ember sparsify`): a
// tensor's shape as the writer takes it, and its bytes copied from the input's map only when the
// output is written (one tensor in memory at a time).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "gguf/reader.hpp"
#include "gguf/writer.hpp"

namespace ember::gguf {

inline std::vector<int64_t> shape_of(const TensorInfo& t) {
  return std::vector<int64_t>(t.ne, t.ne + std::max(1, t.n_dims));
}

inline std::vector<uint8_t> copy_of(const TensorView& v) { return std::vector<uint8_t>(v.data, v.data + v.nbytes); }

// Adds tensor t of r to w unchanged, copied when w is written (r must outlive that).
inline void add_tensor_copy(Writer& w, const Reader& r, const TensorInfo& t) {
  const TensorView v = r.view(t);
  w.add_tensor_lazy(t.name, t.type, shape_of(t), [v] { return copy_of(v); });
}

}  // namespace ember::gguf
