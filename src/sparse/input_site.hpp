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
#include <vector>

namespace ember {

enum class InputSite : int { attn_in = 0, attn_out = 1, ffn_in = 2, ffn_hidden = 3 };
constexpr int kInputSites = 4;
const char* input_site_name(int site);  // "attn_in", "attn_out", "ffn_in", "ffn_hidden"

// Per layer, per site: an input entry is kept when |x| > t (t < 0 keeps every entry).
using InputThresholds = std::vector<std::array<float, kInputSites>>;

}  // namespace ember
