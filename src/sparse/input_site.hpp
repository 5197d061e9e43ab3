// The four inputs of a layer's matrices that input sparsity thresholds (sparse/input_sparse.hpp)
// and the profiler measures (sparse/profile.hpp):
//
//   site        input                      matrices that read it
//   attn_in     attn_norm(x)               wq, wk, wv
//   attn_out    the attention's output     wo
//   ffn_in      ffn_norm(x)                gate and up (up alone without a gate)
//   ffn_hidden  h, the neurons' values     down
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ember {

enum class InputSite : int { attn_in = 0, attn_out = 1, ffn_in = 2, ffn_hidden = 3 };
constexpr int kInputSites = 4;
const char* input_site_name(int site);  // "attn_in", "attn_out", "ffn_in", "ffn_hidden"

// Per layer, per site: an input entry is kept when |x| > t (t < 0 keeps every entry).
using InputThresholds = std::vector<std::array<float, kInputSites>>;

// A site whose input-channel-major rows would be shorter than this decodes with the dense
// kernels on its masked input instead of through a copy (sparse/input_sparse.hpp): a kept row is
// one scattered read, and short ones stream far slower than the dense kernel reads. Measured on
// Zen 4 (`ember bench --versus-dense`, docs/benchmarks.md): SmolLM2's 360-1920-byte rows made input mode
// 0.72x dense at 50 %, dense sites 0.89x; the 7B shape's shortest rows (o, down: 2304 bytes)
// are sparse in every measurement of its 1.16x / 1.32x at 40 / 50 %.
constexpr size_t kInputMinRowBytes = 2048;
// As a minimum row length: no copy at all, every site on the dense kernels with masked inputs
// (the prompt path's function for every token: the block allocation's runs, tests).
constexpr size_t kInputNoCopies = SIZE_MAX;

// The rate at which the input-channel-major axpy reads a copy's kept rows, as a share of the
// rate of the dense kernels, by the copy's row length: a kept row is a new scattered stream, and
// short ones stream slower. Measured on Zen 4 (bench_sparse, docs/benchmarks.md:
// SparseAxpy/Q4_0_NM at 50 % against Matvec/Q4_0_R16, side by side): 0.63 at rows of 2 KiB,
// 0.72 at 3 KiB, 0.88 at 14 KiB; linear in log(row bytes) between them, the nearest outside.
double input_copy_rate(size_t row_bytes);

// A site whose inputs keep on average more than this many times its copy's break-even count
// (input_copy_max_kept) keeps no copy: the tokens that keep fewer than the break-even are the
// few far below the mean, and near the break-even the copy saves nearly nothing (its time there
// is the dense kernels' by definition). Measured (`ember bench --versus-dense`, docs/benchmarks.md):
// the 7B shape's q|k|v and o inputs at a 50 % target never took their copies.
constexpr double kInputCopySlack = 1.0;

}  // namespace ember
