#include "model/repack.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <initializer_list>

#include "core/timer.hpp"
#include "ops/cpu/q4_0_r16.hpp"

namespace ember {
namespace {

bool repackable(const TensorView& w) {
  return w.valid() && w.type == DType::Q4_0 && w.n_dims == 2 && w.rows() % cpu::kR16Rows == 0 &&
         w.cols() % 32 == 0;
}

// Gives the whole pages inside [p, p + n) back to the kernel: the file stays mapped, and a page
// is read again from the page cache if anything touches it later.
void release_pages(const uint8_t* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void repack(Model& model, TensorView& w, RepackStats& st) {
  AlignedBuffer<uint8_t> buf(w.nbytes);
  cpu::repack_q4_0_r16(w.data, w.rows(), w.cols(), buf.data());
  release_pages(w.data, w.nbytes);
  w.type = DType::Q4_0_R16;
  w.data = buf.data();
  model.owned_weights.push_back(std::move(buf));
  ++st.tensors;
  st.bytes += w.nbytes;
}

}  // namespace

RepackStats repack_for_dense_kernels(Model& model, RepackScope scope) {
  RepackStats st;
  if (scope == RepackScope::none || !cpu::q4_0_r16_fast()) return st;
  Timer timer;
  // Matrices multiplied together in one fused call (Q, K, V; gate and up) must share their type:
  // they are repacked all or none.
  const auto group = [&](std::initializer_list<TensorView*> ws) {
    for (TensorView* w : ws)
      if (!repackable(*w)) return;
    for (TensorView* w : ws) repack(model, *w, st);
  };
  for (LayerWeights& l : model.layers) {
    group({&l.wq, &l.wk, &l.wv});
    group({&l.wo});
    if (scope == RepackScope::all) {
      group({&l.ffn.gate, &l.ffn.up});
      group({&l.ffn.down});
    }
  }
  // A tied output matrix is the token embedding, whose rows are looked up one at a time.
  if (model.output.data != model.tok_embd.data) group({&model.output});
  st.seconds = timer.seconds();
  return st;
}

}  // namespace ember
