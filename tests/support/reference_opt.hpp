// An independent, plain double-precision forward pass of OPT (model/opt.cpp), written straight
// from the math (no Ember ops), used to check the engine's logits.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/model.hpp"
#include "reference_llama.hpp"

namespace ember::test_support {

inline std::vector<std::vector<double>> reference_opt_logits(const Model& m, const std::vector<int32_t>& tokens) {
  const Hparams& hp = m.hp;
  const int64_t d = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nff = hp.n_ff;
  const int64_t T = static_cast<int64_t>(tokens.size());
  auto f = [](const TensorView& t, int64_t i) { return static_cast<double>(reinterpret_cast<const float*>(t.data)[i]); };
  auto affine = [&](const std::vector<double>& W, int64_t rows, int64_t cols, const std::vector<double>& x,
                    const TensorView& bias) {
    std::vector<double> y(rows, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double s = bias.valid() ? f(bias, r) : 0.0;
      for (int64_t i = 0; i < cols; ++i) s += W[r * cols + i] * x[i];
      y[r] = s;
    }
    return y;
  };
  auto layernorm = [&](const std::vector<double>& x, const TensorView& w, const TensorView& b) {
    double mean = 0, var = 0;
    for (double v : x) mean += v;
    mean /= static_cast<double>(x.size());
    for (double v : x) var += (v - mean) * (v - mean);
    var /= static_cast<double>(x.size());
    const double inv = 1.0 / std::sqrt(var + hp.norm_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) * inv * f(w, i) + f(b, i);
    return y;
  };

  const std::vector<double> emb = dequant_matrix(m.tok_embd), pos = dequant_matrix(m.pos_embd);
  std::vector<std::vector<double>> x(T, std::vector<double>(d));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) x[t][i] = emb[tokens[t] * d + i] + pos[(t + 2) * d + i]  /* HF OPT: learned positions start at row 2 */;

  for (const LayerWeights& L : m.layers) {
    const auto wq = dequant_matrix(L.wq), wk = dequant_matrix(L.wk), wv = dequant_matrix(L.wv), wo = dequant_matrix(L.wo);
    const auto wu = dequant_matrix(L.ffn.up);
    std::vector<double> wd;  // [d][nff], from down or the transposed down_t
    if (L.ffn.down.valid()) {
      wd = dequant_matrix(L.ffn.down);
    } else {
      const auto dt = dequant_matrix(L.ffn.down_t);
      wd.resize(dt.size());
      for (int64_t j = 0; j < nff; ++j)
        for (int64_t i = 0; i < d; ++i) wd[i * nff + j] = dt[j * d + i];
    }
    std::vector<std::vector<double>> K(T), V(T), attn(T);
    for (int64_t t = 0; t < T; ++t) {
      const auto xn = layernorm(x[t], L.attn_norm, L.attn_norm_b);
      const auto q = affine(wq, d, d, xn, L.bq);
      K[t] = affine(wk, d, d, xn, L.bk);
      V[t] = affine(wv, d, d, xn, L.bv);
      std::vector<double> o(d, 0.0);
      for (int64_t h = 0; h < nh; ++h) {
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t i = 0; i < hd; ++i) s += q[h * hd + i] * K[j][h * hd + i];
          sc[j] = s / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (auto& s : sc) sum += (s = std::exp(s - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < hd; ++i) o[h * hd + i] += sc[j] / sum * V[j][h * hd + i];
      }
      attn[t] = o;
    }
    for (int64_t t = 0; t < T; ++t) {
      const auto o = affine(wo, d, d, attn[t], L.bo);
      for (int64_t i = 0; i < d; ++i) x[t][i] += o[i];
      const auto xn = layernorm(x[t], L.ffn.norm, L.ffn.norm_b);
      auto u = affine(wu, nff, d, xn, L.ffn.up_b);
      for (double& v : u) v = v > 0 ? v : 0.0;
      const auto dn = affine(wd, d, nff, u, L.ffn.down_b);
      for (int64_t i = 0; i < d; ++i) x[t][i] += dn[i];
    }
  }
  const auto wout = dequant_matrix(m.output);
  const TensorView none;
  std::vector<std::vector<double>> logits(T);
  for (int64_t t = 0; t < T; ++t)
    logits[t] = affine(wout, hp.n_vocab, d, layernorm(x[t], m.output_norm, m.output_norm_b), none);
  return logits;
}

}  // namespace ember::test_support
