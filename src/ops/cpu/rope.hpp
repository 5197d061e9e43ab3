// Rotary position embeddings. A RopeTable holds the inverse frequencies (from the base, the
// rotated dimension count, linear scaling and optional per-dimension frequency factors); the
// per-position cos/sin are computed once per token and shared by all layers and heads.
#pragma once
#include <cstdint>
#include <vector>

namespace ember::cpu {

enum class RopeLayout {
  normal,  // rotates pairs (2i, 2i+1): llama's layout in GGUF
  neox,    // rotates pairs (i, i + n_rot/2): GPT-NeoX, Gemma, Qwen
};

struct RopeConfig {
  int n_rot = 0;             // dimensions rotated per head (<= head_dim)
  double base = 10000.0;
  double linear_scale = 1.0; // positions are divided by this (rope.scaling.type = linear)
  RopeLayout layout = RopeLayout::normal;
  std::vector<float> freq_factors;  // optional, n_rot/2 entries: theta_i /= factor_i
  // cos and sin are multiplied by this (rope.scaling.attn_factor: Phi-3's LongRoPE scale)
  double attn_factor = 1.0;
};

class RopeTable {
 public:
  explicit RopeTable(RopeConfig config);
  const RopeConfig& config() const { return config_; }
  // cos_sin receives n_rot/2 (cos, sin) pairs for position `pos`.
  void angles(int64_t pos, float* cos_sin) const;
  // Rotates n_heads heads (each head_dim long, contiguous) of one token in place.
  void apply(float* x, int64_t n_heads, int64_t head_dim, const float* cos_sin) const;
  // n_rot / 2 inverse frequencies (scaling and factors applied): angle i = pos * inv_freq()[i].
  const std::vector<double>& inv_freq() const { return inv_freq_; }

 private:
  RopeConfig config_;
  std::vector<double> inv_freq_;
};

}  // namespace ember::cpu
