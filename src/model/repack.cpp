#include "model/repack.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <thread>
#include <vector>

#include "core/timer.hpp"
#include "ops/cpu/r16.hpp"

namespace ember {
namespace {

bool repackable(const TensorView& w) {
  return w.valid() && cpu::r16_type(w.type) != w.type && w.n_dims == 2 && w.rows() % cpu::kR16Rows == 0 &&
         w.cols() % info(w.type).block_size == 0;
}

// Gives the whole pages inside [p, p + n) back to the kernel: the file stays mapped, and a page
// is read again from the page cache if anything touches it later.
void release_pages(const uint8_t* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// repack_r16 on the machine's cores: 16-row groups are independent and keep their place, so
// each thread repacks a contiguous range of them (the K-quant layouts cost real arithmetic, and
// the first touch of the file's and the buffer's pages is spread too).
void repack_parallel(const TensorView& w, uint8_t* dst) {
  const int64_t groups = w.rows() / cpu::kR16Rows;
  const size_t group_bytes = w.row_stride() * static_cast<size_t>(cpu::kR16Rows);
  const int64_t nth = std::clamp<int64_t>(static_cast<int64_t>(std::thread::hardware_concurrency()), 1,
                                          std::max<int64_t>(1, groups / 8));
  const auto part = [&](int64_t i) {
    const int64_t g0 = groups * i / nth, g1 = groups * (i + 1) / nth;
    if (g1 > g0)
      cpu::repack_r16(w.type, w.data + static_cast<size_t>(g0) * group_bytes, (g1 - g0) * cpu::kR16Rows, w.cols(),
                      dst + static_cast<size_t>(g0) * group_bytes);
  };
  std::vector<std::thread> threads;
  for (int64_t i = 1; i < nth; ++i) threads.emplace_back(part, i);
  part(0);
  for (auto& t : threads) t.join();
}

void repack(Model& model, TensorView& w, RepackStats& st) {
  AlignedBuffer<uint8_t> buf(w.nbytes);
  repack_parallel(w, buf.data());
  release_pages(w.data, w.nbytes);
  w.type = cpu::r16_type(w.type);
  w.data = buf.data();
  model.owned_weights.push_back(std::move(buf));
  ++st.tensors;
  st.bytes += w.nbytes;
}

}  // namespace

RepackStats repack_for_dense_kernels(Model& model, RepackScope scope) {
  RepackStats st;
  if (scope == RepackScope::none || !cpu::r16_fast()) return st;
  Timer timer;
  // Matrices multiplied together in one fused call when they share their type (Q, K, V; gate and
  // up) keep sharing it: they are repacked all or none. Of mixed types, each goes on its own.
  const auto group = [&](std::initializer_list<TensorView*> ws) {
    bool same = true, all = true;
    for (TensorView* w : ws) same &= w->type == (*ws.begin())->type, all &= repackable(*w);
    for (TensorView* w : ws)
      if (!same || all) {
        if (repackable(*w)) repack(model, *w, st);
      }
  };
  for (LayerWeights& l : model.layers) {
    group({&l.wq, &l.wk, &l.wv});
    group({&l.wo});
    if (scope == RepackScope::all) {
      group({&l.ffn.gate, &l.ffn.up});
      group({&l.ffn.down});
    } else if (scope == RepackScope::attention_output_gate) {
      group({&l.ffn.gate});
    }
  }
  if (model.output.data != model.tok_embd.data) {
    group({&model.output});
  } else if (repackable(model.output) && cpu::r16_unpackable(model.output.type)) {
    // A tied output matrix is also the token embedding: its rows are then looked up by
    // unpacking their group of 16 (get_rows), so it can be repacked where that is possible.
    repack(model, model.output, st);
    model.tok_embd.type = model.output.type;
    model.tok_embd.data = model.output.data;
  }
  st.seconds = timer.seconds();
  return st;
}

}  // namespace ember
