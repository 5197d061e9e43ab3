// Qwen3 (`qwen3` in GGUF), as llama.cpp runs it (src/models/qwen3.cpp there), in the shared
// blocks (model/blocks.hpp):
//
//   x = embed(token)
//   per layer:  h = x + wo attn(rope(q_norm(wq n)), rope(k_norm(wk n)), wv n),  n = rms_norm(x; attn_norm)
//               x = h + down(silu(gate m) * up m),                           m = rms_norm(h; ffn_norm)
//   logits = output(rms_norm(x; output_norm))      output tied to token_embd when absent
//
// Qwen2 without the Q/K/V biases and with an RMSNorm of every q and k head (over head_dim,
// before RoPE; the Q/K-norm Gemma 3 has too). The head size is qwen3.attention.key_length and
// may differ from n_embd / n_head (Qwen3-0.6B: 1024 = 16 x 64, heads of 128). RoPE in the NeoX
// layout over whole heads.
#include "core/error.hpp"
#include "model/loader.hpp"

namespace ember {

void load_qwen3(Model& m) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  hp.arch = "qwen3";
  read_common_hparams(r, hp);
  hp.act = cpu::Activation::silu;
  hp.rope.layout = cpu::RopeLayout::neox;
  EMBER_CHECK(hp.rope.n_rot == hp.head_dim, "{}: qwen3 rotates whole heads, rope.dimension_count {} != head size {}",
              r.path(), hp.rope.n_rot, hp.head_dim);

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
    bind_gated_ffn(b, hp, il, L.ffn, FfnGating::par);
  }
  read_sparse_metadata(m);
  build_rope(m);
}

}  // namespace ember
