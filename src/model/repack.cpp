#include "model/repack.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <thread>
#include <vector>

#include "core/huge_pages.hpp"
#include "core/mmap_file.hpp"
#include "core/timer.hpp"
#include "model/hot_rows.hpp"
#include "ops/cpu/r16/r16.hpp"

namespace ember {
namespace {

bool repackable(const TensorView& w) {
  return w.valid() && cpu::r16_pays(w.type) && w.n_dims == 2 && w.rows() % cpu::kR16Rows == 0 &&
         w.cols() % info(w.type).block_size == 0;
}

// part(0 .. nth - 1) on up to `units` / `per_thread` of the machine's cores (at least one): the
// calling thread takes part 0.
template <class F>
void on_cores(int64_t units, int64_t per_thread, const F& part) {
  const int64_t nth = std::clamp<int64_t>(static_cast<int64_t>(std::thread::hardware_concurrency()), 1,
                                          std::max<int64_t>(1, units / per_thread));
  std::vector<std::thread> threads;
  for (int64_t i = 1; i < nth; ++i) threads.emplace_back(part, i, nth);
  part(int64_t{0}, nth);
  for (auto& t : threads) t.join();
}

// repack_r16 on the machine's cores: 16-row groups are independent and keep their place, so
// each thread repacks a contiguous range of them (the K-quant layouts cost real arithmetic, and
// the first touch of the file's and the buffer's pages is spread too).
// A matrix whose rows are interleaved with others' (a bundle, TensorView::stride) is gathered a
// group at a time into contiguous rows first.
void repack_parallel(const TensorView& w, uint8_t* dst) {
  const int64_t groups = w.rows() / cpu::kR16Rows;
  const size_t group_bytes = w.row_size() * static_cast<size_t>(cpu::kR16Rows);
  on_cores(groups, 8, [&](int64_t i, int64_t nth) {
    const int64_t g0 = groups * i / nth, g1 = groups * (i + 1) / nth;
    if (g1 <= g0) return;
    if (w.contiguous()) {
      cpu::repack_r16(w.type, w.row(g0 * cpu::kR16Rows), (g1 - g0) * cpu::kR16Rows, w.cols(),
                      dst + static_cast<size_t>(g0) * group_bytes);
      return;
    }
    std::vector<uint8_t> rows(group_bytes);
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t r = 0; r < cpu::kR16Rows; ++r)
        std::memcpy(rows.data() + static_cast<size_t>(r) * w.row_size(), w.row(g * cpu::kR16Rows + r), w.row_size());
      cpu::repack_r16(w.type, rows.data(), cpu::kR16Rows, w.cols(), dst + static_cast<size_t>(g) * group_bytes);
    }
  });
}

// A plain copy into contiguous rows, split the same way in pieces of at least 1 MiB.
void copy_parallel(const TensorView& w, uint8_t* dst) {
  if (!w.contiguous()) {
    const int64_t rows = w.rows();
    on_cores(static_cast<int64_t>(w.nbytes >> 20), 1, [&](int64_t i, int64_t nth) {
      for (int64_t r = rows * i / nth; r < rows * (i + 1) / nth; ++r)
        std::memcpy(dst + static_cast<size_t>(r) * w.row_size(), w.row(r), w.row_size());
    });
    return;
  }
  const size_t n = w.nbytes;
  on_cores(static_cast<int64_t>(n >> 20), 1, [&](int64_t i, int64_t nth) {
    const size_t b0 = n * static_cast<size_t>(i) / static_cast<size_t>(nth);
    const size_t b1 = n * static_cast<size_t>(i + 1) / static_cast<size_t>(nth);
    std::memcpy(dst + b0, w.data + b0, b1 - b0);
  });
}

// Gives a matrix's pages in the file's map back once it has been copied out. Rows interleaved
// with other matrices' (a bundle in the file) share their pages, which those may still read.
void release_copied(const TensorView& w) {
  if (w.contiguous()) release_mapped_pages(w.data, w.nbytes);
}

// What goes into the model's buffer: matrices to repack, and (ResidentWeights::copy) the other
// matrices the forward pass reads every token, copied as they are.
struct Planned {
  TensorView* w;
  bool repack;
  size_t at = 0;  // offset in the buffer
  int bundle = -1;  // copied into that bundle's rows instead
};

// An FFN layer's matrices with a row per neuron that a sparse path reads together, copied row
// by row in turn: neuron j's rows (its gate row where the gate is gathered, its up row and its
// neuron-major down row) are one contiguous read. A gathered row is a short read that the
// hardware prefetchers cannot see coming; the rows that follow it in memory they fetch on their
// own, while the kernel still computes the first.
struct Bundle {
  std::vector<Planned*> members;
  int64_t rows = 0;
  size_t stride = 0;  // bytes per neuron: the members' rows
  size_t at = 0;      // offset in the buffer
};

// Copies the bundle's members into dst (rows x stride bytes) on the machine's cores.
void copy_bundle(const Bundle& b, uint8_t* dst) {
  on_cores(static_cast<int64_t>((b.stride * static_cast<size_t>(b.rows)) >> 20), 1, [&](int64_t i, int64_t nth) {
    const int64_t r0 = b.rows * i / nth, r1 = b.rows * (i + 1) / nth;
    for (int64_t r = r0; r < r1; ++r) {
      uint8_t* row = dst + static_cast<size_t>(r) * b.stride;
      for (const Planned* m : b.members) {
        const size_t n = m->w->row_size();
        std::memcpy(row, m->w->row(r), n);
        row += n;
      }
    }
  });
}

}  // namespace

bool repack_pays(const TensorView& w) { return cpu::r16_fast() && repackable(w); }

RepackStats repack_for_dense_kernels(Model& model, RepackScope scope, ResidentWeights resident, size_t memory_budget) {
  RepackStats st;
  const bool repacking = scope != RepackScope::none && cpu::r16_fast();
  if (!repacking && resident == ResidentWeights::in_file) return st;
  Timer timer;
  std::vector<Planned> plan;
  const auto planned = [&](const TensorView* w) {
    for (const Planned& p : plan)
      if (p.w->data == w->data) return true;
    return false;
  };
  // Matrices multiplied together in one fused call when they share their type (Q, K, V; gate and
  // up) keep sharing it: they are repacked all or none. Of mixed types, each goes on its own.
  const auto group = [&](std::initializer_list<TensorView*> ws) {
    if (!repacking) return;
    bool same = true, all = true;
    for (TensorView* w : ws) same &= w->type == (*ws.begin())->type, all &= repackable(*w);
    for (TensorView* w : ws)
      if ((!same || all) && repackable(*w)) plan.push_back({w, true});
  };
  for (LayerWeights& l : model.layers) {
    if (scope == RepackScope::output) continue;
    group({&l.wq, &l.wk, &l.wv});
    group({&l.wo});
    // A mixture's experts always run as dense FFNs of their own (no executor gathers their rows;
    // the memory tier's are repacked in its slots).
    for (FfnWeights& e : l.moe.experts) {
      if (model.expert_cache) break;
      group({&e.gate, &e.up});
      group({&e.down});
    }
    if (scope == RepackScope::all) {
      group({&l.ffn.gate, &l.ffn.up});
      group({&l.ffn.down});
    } else if (scope == RepackScope::attention_output_gate) {
      group({&l.ffn.gate});
    }
  }
  const bool tied = model.output.data == model.tok_embd.data;
  if (!tied) {
    group({&model.output});
  } else if (repacking && repackable(model.output) && cpu::r16_unpackable(model.output.type)) {
    // A tied output matrix is also the token embedding: its rows are then looked up by
    // unpacking their group of 16 (get_rows), so it can be repacked where that is possible.
    plan.push_back({&model.output, true});
  }
  if (resident == ResidentWeights::copy) {
    const auto copy = [&](TensorView* w) {
      if (w->valid() && w->n_dims == 2 && !planned(w)) plan.push_back({w, false});
    };
    for (LayerWeights& l : model.layers)
      for (TensorView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn.gate, &l.ffn.up, &l.ffn.down, &l.ffn.down_t, &l.ffn.fc1,
                            &l.ffn.fc2})
        copy(w);
    copy(&model.output);  // tied: the embedding follows it below
    size_t all = 0, copies = 0;
    for (const Planned& p : plan) all += p.w->nbytes, copies += p.repack ? 0 : p.w->nbytes;
    const size_t budget = memory_budget ? memory_budget : available_memory_bytes() / 10 * 9;
    if (budget > 0 && all > budget) {
      st.copy_skipped_bytes = copies;
      plan.erase(std::remove_if(plan.begin(), plan.end(), [](const Planned& p) { return !p.repack; }), plan.end());
    }
  }
  if (model.resident_weight_budget > 0) {
    // A model larger than its budget: the repacked matrices, in the plan's order (attention
    // first, layer by layer), take what it holds but for the page cache's slack; the rest stays
    // in the file's map, and what the budget then leaves keeps the hot rows (model/hot_rows.hpp).
    size_t kept = 0;
    const size_t slack = page_cache_slack(model.resident_weight_budget);
    const size_t most = model.resident_weight_budget > slack ? model.resident_weight_budget - slack : 0;
    plan.erase(std::remove_if(plan.begin(), plan.end(),
                              [&](const Planned& p) {
                                if (kept + p.w->nbytes > most) return st.repack_skipped_bytes += p.w->nbytes, true;
                                kept += p.w->nbytes;
                                return false;
                              }),
               plan.end());
  }
  if (plan.empty()) return st;
  std::vector<Bundle> bundles;
  for (LayerWeights& l : model.layers) {
    const auto copied = [&](const TensorView& w) -> Planned* {
      for (Planned& p : plan)
        if (p.w == &w && !p.repack && w.rows() == l.ffn.up.rows()) return &p;
      return nullptr;
    };
    Planned* up = copied(l.ffn.up);
    Planned* down_t = copied(l.ffn.down_t);
    if (!up || !down_t) continue;
    Bundle b;
    if (Planned* gate = copied(l.ffn.gate)) b.members.push_back(gate);
    b.members.push_back(up);
    b.members.push_back(down_t);
    b.rows = l.ffn.up.rows();
    for (Planned* m : b.members) b.stride += m->w->row_size(), m->bundle = static_cast<int>(bundles.size());
    bundles.push_back(std::move(b));
  }
  size_t total = 0;
  for (Planned& p : plan) {
    if (p.bundle >= 0) continue;
    p.at = total;
    total += (p.w->nbytes + 63) / 64 * 64;
  }
  for (Bundle& b : bundles) {
    b.at = total;
    total += (b.stride * static_cast<size_t>(b.rows) + 63) / 64 * 64;
  }
  // Untouched: the threads below make its pages resident as they fill them.
  AlignedBuffer<uint8_t> buf(total, AlignedBuffer<uint8_t>::Untouched{});
  const uint8_t* const embd = model.tok_embd.data;
  for (Planned& p : plan) {
    if (p.bundle >= 0) continue;
    TensorView& w = *p.w;
    uint8_t* dst = buf.data() + p.at;
    if (p.repack) {
      repack_parallel(w, dst);
      w.type = cpu::r16_type(w.type);
      ++st.tensors;
      st.bytes += w.nbytes;
    } else {
      copy_parallel(w, dst);
      ++st.copied_tensors;
      st.copied_bytes += w.nbytes;
    }
    release_copied(w);
    w.data = dst;
    w.stride = 0;
  }
  for (const Bundle& b : bundles) {
    copy_bundle(b, buf.data() + b.at);
    size_t offset = 0;
    for (Planned* m : b.members) {
      TensorView& w = *m->w;
      const size_t row = w.row_size();
      ++st.copied_tensors;
      st.copied_bytes += w.nbytes;
      release_copied(w);
      w.data = buf.data() + b.at + offset;
      w.stride = b.stride;
      offset += row;
    }
    ++st.bundled_layers;
  }
  if (tied && model.output.data != embd) {  // the embedding follows its tied output matrix
    model.tok_embd.type = model.output.type;
    model.tok_embd.data = model.output.data;
  }
  model.owned_weights.push_back(std::move(buf));
  st.huge_page_bytes = anon_huge_page_bytes();
  st.seconds = timer.seconds();
  return st;
}

}  // namespace ember
