// Qwen3-MoE (`qwen3moe` in GGUF: Qwen3-30B-A3B, 235B-A22B), as llama.cpp runs it
// (src/models/qwen3moe.cpp there): Qwen3's attention (Q/K-norm, NeoX RoPE, no biases) and in
// every layer a mixture of experts (model/moe.hpp) instead of the dense FFN:
//
//   per layer:  h = x + attention as in qwen3.cpp
//               x = h + sum_{e in top-k} w_e down_e(silu(gate_e m) * up_e m),  m = rms_norm(h; ffn_norm)
//
// with k = qwen3moe.expert_used_count of qwen3moe.expert_count experts, each of width
// qwen3moe.expert_feed_forward_length (llama.cpp's fallback without it: n_ff / k), softmax
// router, chosen weights renormalised. Hparams::n_ff is the widest FFN the workspace holds.
#include <algorithm>

#include "core/error.hpp"
#include "model/loader.hpp"

namespace ember {

void load_qwen3moe(Model& m) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  hp.arch = "qwen3moe";
  read_common_hparams(r, hp);
  hp.act = cpu::Activation::silu;
  hp.rope.layout = cpu::RopeLayout::neox;
  EMBER_CHECK(hp.rope.n_rot == hp.head_dim, "{}: qwen3moe rotates whole heads, rope.dimension_count {} != head size {}",
              r.path(), hp.rope.n_rot, hp.head_dim);
  EMBER_CHECK(hp.n_expert >= 1, "{}: qwen3moe.expert_count is missing", r.path());
  const int64_t n_ff_exp = r.opt_int("qwen3moe.expert_feed_forward_length").value_or(hp.n_ff / hp.n_expert_used);
  EMBER_CHECK(n_ff_exp >= 1 && n_ff_exp <= (1 << 22), "{}: expert_feed_forward_length {} is out of range", r.path(),
              n_ff_exp);
  hp.n_ff = std::max(hp.n_ff, n_ff_exp);

  TensorBinder b(r, hp);
  bind_embeddings(b, m);
  m.layers.resize(hp.n_layer);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = m.layers[il];
    auto name = [&](const char* t) { return fmt::format("blk.{}.{}.weight", il, t); };
    L.attn_norm = b.norm(name("attn_norm"), hp.n_embd);
    bind_attention(b, hp, il, L, AttnBiases::none);
    L.q_norm = b.norm(name("attn_q_norm"), hp.head_dim);
    L.k_norm = b.norm(name("attn_k_norm"), hp.head_dim);
    bind_moe_ffn(b, hp, il, L, n_ff_exp);
  }
  build_rope(m);
}

}  // namespace ember
