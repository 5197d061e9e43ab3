// An independent, plain double-precision forward pass of Gemma 3, written from the math (Gemma's
// reference implementation, with the norm weights as the GGUF stores them, i.e. already 1 + w),
// used to check the engine's gemma3 logits. No Ember ops; reads the hyperparameters Ember loaded
// (their reading from the file is checked separately against the metadata).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/model.hpp"
#include "reference_llama.hpp"
#include "tensor/quant.hpp"

namespace ember::test_support {

inline std::vector<std::vector<double>> reference_gemma3_logits(const Model& m, const std::vector<int32_t>& tokens,
                                                                bool emulate_int8_activations = false) {
  const Hparams& hp = m.hp;
  const int64_t d = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, nff = hp.n_ff;
  const int64_t T = static_cast<int64_t>(tokens.size());
  auto round_input = [&](const TensorView& w, const std::vector<double>& x) {
    return emulate_int8_activations ? round_through_activation_format(w.type, x) : x;
  };
  auto matvec = [&](const std::vector<double>& W, const TensorView& w, const std::vector<double>& xin) {
    const auto x = round_input(w, xin);
    std::vector<double> y(w.rows(), 0.0);
    for (int64_t r = 0; r < w.rows(); ++r) {
      double s = 0;
      for (int64_t i = 0; i < w.cols(); ++i) s += W[r * w.cols() + i] * x[i];
      y[r] = s;
    }
    return y;
  };
  // RMSNorm of x[off .. off+n) with weight w (n floats).
  auto rmsnorm = [&](std::vector<double>& x, int64_t off, int64_t n, const TensorView& w) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
    const double scale = 1.0 / std::sqrt(ss / n + hp.norm_eps);
    const float* wf = reinterpret_cast<const float*>(w.data);
    for (int64_t i = 0; i < n; ++i) x[off + i] = x[off + i] * scale * wf[i];
  };
  // NeoX RoPE: pairs (i, i + hd/2), theta_i = pos * base^(-2i/hd) / scale.
  auto rope = [&](std::vector<double>& v, int64_t heads, int64_t pos, double base, double scale) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double th = pos * std::pow(base, -2.0 * i / hd) / scale;
        const double c = std::cos(th), s = std::sin(th);
        const int64_t a = h * hd + i, b = a + hd / 2;
        const double x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
  };
  auto gelu = [](double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); };

  const std::vector<double> emb = dequant_matrix(m.tok_embd);
  std::vector<std::vector<double>> x(T, std::vector<double>(d));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) x[t][i] = emb[tokens[t] * d + i] * std::sqrt(double(d));

  for (size_t il = 0; il < m.layers.size(); ++il) {
    const LayerWeights& L = m.layers[il];
    const bool local = hp.swa_layers[il];
    const double base = local ? hp.rope_local.base : hp.rope.base;
    const double scale = local ? 1.0 : hp.rope.linear_scale;
    const auto wq = dequant_matrix(L.wq), wk = dequant_matrix(L.wk), wv = dequant_matrix(L.wv),
               wo = dequant_matrix(L.wo);
    const auto wg = dequant_matrix(L.ffn.gate), wu = dequant_matrix(L.ffn.up), wd = dequant_matrix(L.ffn.down);
    std::vector<std::vector<double>> K(T), V(T), attn_out(T);
    for (int64_t t = 0; t < T; ++t) {
      auto xn = x[t];
      rmsnorm(xn, 0, d, L.attn_norm);
      auto q = matvec(wq, L.wq, xn);
      K[t] = matvec(wk, L.wk, xn);
      V[t] = matvec(wv, L.wv, xn);
      for (int64_t h = 0; h < nh; ++h) rmsnorm(q, h * hd, hd, L.q_norm);
      for (int64_t h = 0; h < nkv; ++h) rmsnorm(K[t], h * hd, hd, L.k_norm);
      rope(q, nh, t, base, scale);
      rope(K[t], nkv, t, base, scale);
      const int64_t first = local && hp.sliding_window > 0 ? std::max<int64_t>(0, t - hp.sliding_window + 1) : 0;
      std::vector<double> o(nh * hd, 0.0);
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t kh = h / (nh / nkv);
        std::vector<double> sc;
        double mx = -1e300;
        for (int64_t j = first; j <= t; ++j) {
          double s = 0;
          for (int64_t i = 0; i < hd; ++i) s += q[h * hd + i] * K[j][kh * hd + i];
          sc.push_back(s / std::sqrt(double(hd)));
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (auto& s : sc) sum += (s = std::exp(s - mx));
        for (int64_t j = first; j <= t; ++j)
          for (int64_t i = 0; i < hd; ++i) o[h * hd + i] += sc[j - first] / sum * V[j][kh * hd + i];
      }
      attn_out[t] = o;
    }
    for (int64_t t = 0; t < T; ++t) {
      auto o = matvec(wo, L.wo, attn_out[t]);
      rmsnorm(o, 0, d, L.attn_post_norm);
      for (int64_t i = 0; i < d; ++i) x[t][i] += o[i];
      auto xn = x[t];
      rmsnorm(xn, 0, d, L.ffn.norm);
      auto g = matvec(wg, L.ffn.gate, xn), u = matvec(wu, L.ffn.up, xn);
      for (int64_t j = 0; j < nff; ++j) g[j] = gelu(g[j]) * u[j];
      auto dn = matvec(wd, L.ffn.down, g);
      rmsnorm(dn, 0, d, L.ffn_post_norm);
      for (int64_t i = 0; i < d; ++i) x[t][i] += dn[i];
    }
  }
  const auto wout = dequant_matrix(m.output);
  std::vector<std::vector<double>> logits(T);
  for (int64_t t = 0; t < T; ++t) {
    auto xn = x[t];
    rmsnorm(xn, 0, d, m.output_norm);
    logits[t] = matvec(wout, m.output, xn);
    if (hp.final_softcap > 0)
      for (double& l : logits[t]) l = hp.final_softcap * std::tanh(l / hp.final_softcap);
  }
  return logits;
}

}  // namespace ember::test_support
