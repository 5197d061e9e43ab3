// Repacking a loaded model's matrices into the layouts the dense kernels read fastest
// (Q4_0 -> Q4_0_R16, ops/cpu/r16/r16.hpp), as llama.cpp repacks Q4_0 at load, and optionally
// copying the other per-token matrices out of the file too. A repacked matrix
// is copied out of the file into Model::owned_weights (its file pages are released), and its
// rows are addressable only 16 at a time: only matrices that the forward pass multiplies whole
// are repacked, the token embedding only when it is also the output matrix and its type can be
// unpacked a group at a time for the lookup (cpu::get_rows), and the FFN only when it runs dense
// (the sparse paths gather single rows of up and down, and in predictor mode of the gate too).
#pragma once
#include <cstddef>

#include "model/model.hpp"

namespace ember {

enum class RepackScope {
  none,
  output,            // the output matrix
  attention_output,  // ... and the attention projections
  attention_output_gate,  // ... and the FFN's gate (oracle and threshold modes compute it whole)
  all,               // ... and the FFN's gate, up and down
};

// Where the matrices that are not repacked stay.
enum class ResidentWeights {
  in_file,  // in the file's memory map (4 KiB pages of the page cache), used in place
  // copied into the model's buffer with the repacked ones: huge pages (core/huge_pages.hpp), the
  // file's pages released. Every matrix the forward pass reads each token: the attention and
  // FFN matrices (ffn_down_t, predictors included) and the output matrix; not the token
  // embedding (a row per token) unless it is the tied output matrix.
  copy,
};

struct RepackStats {
  int tensors = 0;  // repacked
  size_t bytes = 0;
  int copied_tensors = 0;  // ResidentWeights::copy: copied as they are
  size_t copied_bytes = 0;
  size_t huge_page_bytes = 0;  // the process's memory in huge pages afterwards (0: none or unknown)
  size_t copy_skipped_bytes = 0;  // ResidentWeights::copy: left in the file for want of memory
  size_t repack_skipped_bytes = 0;  // left in the file's layout: past a memory_budget
  int bundled_layers = 0;  // ResidentWeights::copy: FFN layers whose neurons' rows were bundled
  double seconds = 0;
};

// Repacks what `scope` names where a fast kernel exists for the repacked layout at the current
// SIMD level (else nothing), and with ResidentWeights::copy copies the other per-token matrices,
// all into one buffer in Model::owned_weights. Views of the model change type and data; shapes
// stay. Where an FFN layer has a neuron-major down (ffn_down_t) and it and up are copied (not
// repacked), each neuron's rows are bundled: its gate row (when the gate is copied too), its up
// row and its down row one after the other, and those views get a TensorView::stride. The
// copies are made only if they fit, with the repacked matrices, in `memory_budget`
// bytes (0: 90 % of the memory available now, core/huge_pages.hpp); otherwise they stay in the
// file (copy_skipped_bytes), so a model larger than memory still runs from its map. A model with
// a Model::resident_weight_budget (larger than its memory budget) bounds the repacked matrices as
// well: they take it but for the page cache's slack (page_cache_slack, model/hot_rows.hpp), in
// order, the others keeping the file's layout (repack_skipped_bytes).
// Whether repack_for_dense_kernels repacks w where its scope names it (a fast kernel reads the
// repacked layout at this SIMD level, and w's shape takes it). The expert cache asks it too.
bool repack_pays(const TensorView& w);

RepackStats repack_for_dense_kernels(Model& model, RepackScope scope,
                                     ResidentWeights resident = ResidentWeights::in_file, size_t memory_budget = 0);

}  // namespace ember
