// An independent, plain double-precision forward pass of the llama architecture, written
// straight from the math (no Ember ops), used to check the engine's logits. Also Qwen2 (Q/K/V
// biases, NeoX RoPE) and the parallel residual.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "model/model.hpp"
#include "tensor/quant.hpp"

namespace ember::test_support {

inline std::vector<double> dequant_matrix(const TensorView& t) {
  std::vector<float> row(t.cols());
  std::vector<double> out(static_cast<size_t>(t.n_elements()));
  for (int64_t r = 0; r < t.rows(); ++r) {
    dequantize_row(t.type, t.row(r), row.data(), t.cols());
    for (int64_t i = 0; i < t.cols(); ++i) out[r * t.cols() + i] = row[i];
  }
  return out;
}

// The activation type a quantized weight type multiplies with (8-bit, as llama.cpp).
inline std::optional<DType> activation_type(DType w) {
  switch (w) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: return DType::Q8_0;
    case DType::Q4_1: case DType::Q5_1: return DType::Q8_1;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return DType::Q8_K;
    default: return std::nullopt;
  }
}

// x rounded through the 8-bit format a weight of type w multiplies with (unchanged for float
// weights), via the scalar quantize_row / dequantize_row.
inline std::vector<double> round_through_activation_format(DType w, const std::vector<double>& x) {
  auto at = activation_type(w);
  if (!at) return x;
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> f(x.begin(), x.end()), back(x.size());
  std::vector<uint8_t> q(row_bytes(*at, n));
  quantize_row(*at, f.data(), q.data(), n);
  dequantize_row(*at, q.data(), back.data(), n);
  return std::vector<double>(back.begin(), back.end());
}

// Returns logits for every token of `tokens` (processed from position 0). With
// `emulate_int8_activations`, the input of every product with a quantized weight is first
// rounded through the 8-bit activation format (scalar quantize_row / dequantize_row), which
// isolates the engine's arithmetic from that format's rounding.
inline std::vector<std::vector<double>> reference_llama_logits(const Model& m, const std::vector<int32_t>& tokens,
                                                               bool emulate_int8_activations = false) {
  const Hparams& hp = m.hp;
  const int64_t d = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, nff = hp.n_ff;
  const int64_t T = static_cast<int64_t>(tokens.size());
  auto round_input = [&](const TensorView& w, const std::vector<double>& x) {
    return emulate_int8_activations ? round_through_activation_format(w.type, x) : x;
  };
  auto matvec_raw = [](const std::vector<double>& W, int64_t rows, int64_t cols, const std::vector<double>& x) {
    std::vector<double> y(rows, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t i = 0; i < cols; ++i) s += W[r * cols + i] * x[i];
      y[r] = s;
    }
    return y;
  };
  auto matvec = [&](const std::vector<double>& W, const TensorView& w, const std::vector<double>& x) {
    return matvec_raw(W, w.rows(), w.cols(), round_input(w, x));
  };
  auto rmsnorm = [&](const std::vector<double>& x, const TensorView& w) {
    double ss = 0;
    for (double v : x) ss += v * v;
    double scale = 1.0 / std::sqrt(ss / x.size() + hp.norm_eps);
    const float* wf = reinterpret_cast<const float*>(w.data);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * wf[i];
    return y;
  };
  auto rope = [&](std::vector<double>& v, int64_t heads, int64_t pos) {
    const int n_rot = hp.rope.n_rot;
    for (int64_t h = 0; h < heads; ++h) {
      for (int i = 0; i < n_rot / 2; ++i) {
        double freq = std::pow(hp.rope.base, -2.0 * i / n_rot) / hp.rope.linear_scale;
        double th = pos * freq, c = std::cos(th), s = std::sin(th);
        int64_t a = h * hd + 2 * i, b = a + 1;
        if (hp.rope.layout == cpu::RopeLayout::neox) {
          a = h * hd + i;
          b = a + n_rot / 2;
        }
        double x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  };
  auto act = [&](double g) {
    if (hp.act == cpu::Activation::relu) return g > 0 ? g : 0.0;
    return g / (1.0 + std::exp(-g));
  };

  std::vector<double> emb = dequant_matrix(m.tok_embd);
  std::vector<std::vector<double>> x(T, std::vector<double>(d));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) x[t][i] = emb[tokens[t] * d + i];

  for (size_t il = 0; il < m.layers.size(); ++il) {
    const LayerWeights& L = m.layers[il];
    auto wq = dequant_matrix(L.wq), wk = dequant_matrix(L.wk), wv = dequant_matrix(L.wv), wo = dequant_matrix(L.wo);
    auto wg = dequant_matrix(L.ffn.gate), wu = dequant_matrix(L.ffn.up);
    // PowerInfer's files hold only the neuron-major down_t: transpose it back.
    const bool down_t_only = !L.ffn.down.valid();
    const TensorView& down = down_t_only ? L.ffn.down_t : L.ffn.down;
    std::vector<double> wd = dequant_matrix(down);
    if (down_t_only) {
      std::vector<double> tr(wd.size());
      for (int64_t j = 0; j < nff; ++j)
        for (int64_t i = 0; i < d; ++i) tr[i * nff + j] = wd[j * d + i];
      wd = std::move(tr);
    }
    std::vector<std::vector<double>> K(T), V(T);
    std::vector<std::vector<double>> attn_out(T);
    for (int64_t t = 0; t < T; ++t) {
      auto xn = rmsnorm(x[t], L.attn_norm);
      auto q = matvec(wq, L.wq, xn);
      K[t] = matvec(wk, L.wk, xn);
      V[t] = matvec(wv, L.wv, xn);
      // Qwen2: biases on Q, K and V.
      auto add_bias = [](std::vector<double>& y, const TensorView& b) {
        if (!b.valid()) return;
        const float* bf = reinterpret_cast<const float*>(b.data);
        for (size_t i = 0; i < y.size(); ++i) y[i] += bf[i];
      };
      add_bias(q, L.bq);
      add_bias(K[t], L.bk);
      add_bias(V[t], L.bv);
      rope(q, nh, t);
      rope(K[t], nkv, t);
      std::vector<double> o(nh * hd, 0.0);
      // Sliding-window layers see the keys of the last `sliding_window` positions only.
      const bool swa = hp.sliding_window > 0 && !hp.swa_layers.empty() && hp.swa_layers[il];
      const int64_t j0 = swa ? std::max<int64_t>(0, t - hp.sliding_window + 1) : 0;
      for (int64_t h = 0; h < nh; ++h) {
        int64_t kh = h / (nh / nkv);
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (int64_t j = j0; j <= t; ++j) {
          double s = 0;
          for (int64_t i = 0; i < hd; ++i) s += q[h * hd + i] * K[j][kh * hd + i];
          sc[j] = s / std::sqrt(double(hd));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int64_t j = j0; j <= t; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
        for (int64_t j = j0; j <= t; ++j)
          for (int64_t i = 0; i < hd; ++i) o[h * hd + i] += sc[j] / sum * V[j][kh * hd + i];
      }
      attn_out[t] = o;
    }
    for (int64_t t = 0; t < T; ++t) {
      auto o = matvec(wo, L.wo, attn_out[t]);
      const std::vector<double> layer_in = x[t];
      for (int64_t i = 0; i < d; ++i) x[t][i] += o[i];
      // Parallel residual (Falcon, Phi-2): the FFN reads the layer's input, through attn_norm when
      // the layer has no ffn_norm.
      auto xn = !hp.parallel_residual    ? rmsnorm(x[t], L.ffn.norm)
                : L.ffn.norm.valid()     ? rmsnorm(layer_in, L.ffn.norm)
                                         : rmsnorm(layer_in, L.attn_norm);
      auto g = matvec(wg, L.ffn.gate, xn), u = matvec(wu, L.ffn.up, xn);
      const bool sym = L.ffn.gating == FfnGating::sym;  // Bamboo: act on up too
      for (int64_t j = 0; j < nff; ++j) g[j] = act(g[j]) * (sym ? act(u[j]) : u[j]);
      auto dn = down_t_only ? matvec_raw(wd, d, nff, g) : matvec(wd, L.ffn.down, g);
      for (int64_t i = 0; i < d; ++i) x[t][i] += dn[i];
    }
  }
  auto wout = dequant_matrix(m.output);
  std::vector<std::vector<double>> logits(T);
  for (int64_t t = 0; t < T; ++t) logits[t] = matvec(wout, m.output, rmsnorm(x[t], m.output_norm));
  return logits;
}

}  // namespace ember::test_support
