#include "sparse/predictor_train.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>

#include "core/aligned_buffer.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "gguf/writer.hpp"
#include "model/ffn.hpp"
#include "model/forward.hpp"
#include "model/kv_cache.hpp"
#include "ops/cpu/activation.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/r16/r16.hpp"
#include "ops/cpu/vec.hpp"
#include "tensor/quant.hpp"

namespace ember {

// ---- sample collection -------------------------------------------------------------------------

namespace {

// The dense FFN with the firing values below the threshold zeroed (the threshold applies in the
// forward too), recording the kept tokens on the way.
class RecordingFfn final : public FfnExecutor {
 public:
  RecordingFfn(FfnSampleRecorder& rec, const SampleOptions& o) : rec_(rec), opts_(o) {}

  void run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
           float* out, Workspace& ws) override {
    // The dense FFN in its steps (model/ffn.hpp): the firing values, the silent ones zeroed, the
    // values, recorded, then down.
    const int64_t n_ff = w.n_ff();
    float* a = ffn_firing_all(pool, w, act, x, n, ws);
    const float threshold = opts_.layer_thresholds.empty() ? opts_.threshold : opts_.layer_thresholds[layer];
    for (int64_t i = 0; i < n * n_ff; ++i)
      if (!ffn_fires(a[i], threshold)) a[i] = 0.0f;
    const float* h = ffn_values_all(pool, w, act, x, n, ws);
    rec_.record(layer, x, a, h, n, threshold);
    ffn_down_all(pool, w, h, n, out, ws);
  }
  std::string refusal(const Model&) const override { return {}; }  // every gating

 private:
  FfnSampleRecorder& rec_;
  const SampleOptions& opts_;
};

}  // namespace

std::vector<LayerSamples> collect_ffn_samples(const Model& model, ThreadPool& pool, const std::vector<int32_t>& tokens,
                                              const SampleOptions& o, const TrainProgress& progress) {
  const Hparams& hp = model.hp;
  const std::string moe = model_moe_refusal(model, "train-predictor");
  EMBER_CHECK(moe.empty(), "{}", moe);
  const int64_t total = static_cast<int64_t>(tokens.size());
  EMBER_CHECK(total >= 20, "train-predictor: {} tokens are too few to train on (give at least 20, better thousands)",
              total);
  EMBER_CHECK(o.max_tokens >= 20, "train-predictor: keep at least 20 sample tokens, got {}", o.max_tokens);
  const int64_t n_ctx = std::min(o.n_ctx, hp.n_ctx_train);
  const int64_t batch = std::max<int64_t>(1, std::min(o.batch, n_ctx));
  FfnSampleRecorder rec(hp.n_layer, hp.n_embd, hp.n_ff, total, o.max_tokens);

  KvCache kv;
  kv.init(hp.n_layer, n_ctx, hp.n_head_kv * hp.head_dim);
  Workspace ws;
  ws.init(model, batch, n_ctx, pool.size());
  EMBER_CHECK(o.layer_thresholds.empty() || static_cast<int64_t>(o.layer_thresholds.size()) == hp.n_layer,
              "sample collection: {} per-layer thresholds for a model of {} layers", o.layer_thresholds.size(),
              hp.n_layer);
  RecordingFfn ffn(rec, o);
  ws.ffn = &ffn;
  std::vector<float> logits(static_cast<size_t>(hp.n_vocab));
  int64_t done = 0, last_report = 0;
  while (done < total) {
    const int64_t seq = std::min(n_ctx, total - done);
    for (int64_t p = 0; p < seq;) {
      const int64_t nb = std::min(batch, seq - p);
      forward(model, pool, kv, ws, tokens.data() + done + p, nb, p, logits.data(), false);
      p += nb;
    }
    done += seq;
    if (progress && (done - last_report >= total / 10 || done == total)) {
      progress(fmt::format("ran {}/{} tokens, {} kept", done, total, rec.kept()));
      last_report = done;
    }
  }
  return rec.take();
}

// ---- training ----------------------------------------------------------------------------------

namespace {

// The sample tokens held out of training: the last ones, a share o.holdout of them (at least 2).
int64_t holdout_tokens(const LayerSamples& s, const PredictorTrainOptions& o) {
  return std::max<int64_t>(2, static_cast<int64_t>(std::llround(o.holdout * s.n)));
}

// Sample tokens the gate initialization looks at (bounds its memory: two [tokens x n_ff] floats).
constexpr int64_t kInitTokens = 2048;

// Y[t][r] = sum_i W[r][i] X[t][i] with float W [rows x k], X [n x k].
void gemm(ThreadPool& pool, const float* W, int64_t rows, int64_t k, const float* X, int64_t n, float* Y) {
  cpu::matmul(pool, matrix_view(DType::F32, W, rows, k), X, n, Y, nullptr);
}

// dst[c][r] = src[r][c] for src [rows x cols], the rows split among the threads.
void transpose(ThreadPool& pool, const float* src, int64_t rows, int64_t cols, float* dst) {
  pool.parallel_for(rows, 64, [&](int64_t r0, int64_t r1, int) { cpu::transpose_f32(src, rows, cols, r0, r1, dst); });
}

// Adam, over restrict pointers so that its step vectorizes.
struct Adam {
  std::vector<float> m, v;
  int64_t step = 0;
  explicit Adam(size_t n) : m(n, 0.0f), v(n, 0.0f) {}
  void update(ThreadPool& pool, float* w, const float* g, size_t n, float lr) {
    ++step;
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1.0f / (1.0f - std::pow(b1, static_cast<float>(step)));
    const float c2 = 1.0f / (1.0f - std::pow(b2, static_cast<float>(step)));
    pool.parallel_for(static_cast<int64_t>(n), 4096, [&](int64_t i0, int64_t i1, int) {
      float* __restrict wp = w;
      const float* __restrict gp = g;
      float* __restrict mp = m.data();
      float* __restrict vp = v.data();
      for (int64_t i = i0; i < i1; ++i) {
        mp[i] = b1 * mp[i] + (1 - b1) * gp[i];
        vp[i] = b2 * vp[i] + (1 - b2) * gp[i] * gp[i];
        wp[i] -= lr * (mp[i] * c1) / (std::sqrt(vp[i] * c2) + eps);
      }
    });
  }
};

// w [rows x cols] rounded in place to what `t` stores (quantized and dequantized row by row).
void round_rows(DType t, std::vector<float>& w, int64_t rows, int64_t cols) {
  if (t == DType::F32) return;
  std::vector<uint8_t> buf(row_bytes(t, cols));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(t, &w[static_cast<size_t>(r * cols)], buf.data(), cols);
    dequantize_row(t, buf.data(), &w[static_cast<size_t>(r * cols)], cols);
  }
}

// A float matrix [rows x cols] (times `scale`) encoded in type t, with its view.
struct Encoded {
  std::vector<uint8_t> bytes;
  TensorView view;
  Encoded(DType t, const std::vector<float>& w, int64_t rows, int64_t cols, float scale = 1.0f)
      : bytes(row_bytes(t, cols) * static_cast<size_t>(rows)), view(matrix_view(t, bytes.data(), rows, cols)) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) row[c] = w[static_cast<size_t>(r * cols + c)] * scale;
      quantize_row(t, row.data(), bytes.data() + row_bytes(t, cols) * static_cast<size_t>(r), cols);
    }
  }
};

// Scores of tokens [t0, t1) into S [(t1 - t0) x n_ff] as the engine computes them: the weights
// stored in type t, multiplied by the same kernels (which may round the activations too, as
// Q8_0's do). H is scratch [(t1 - t0) x rank].
void forward_scores(ThreadPool& pool, const LayerPredictor& p, DType t, const LayerSamples& s, int64_t t0, int64_t t1,
                    float* H, float* S) {
  const int64_t n = t1 - t0;
  const Encoded fc1(t, p.fc1, p.rank, p.n_embd), fc2(t, p.fc2, p.n_ff, p.rank);
  AlignedBuffer<uint8_t> mm(std::max(cpu::matmul_scratch_bytes(t, p.n_embd, n), cpu::matmul_scratch_bytes(t, p.rank, n)));
  cpu::matmul(pool, fc1.view, s.x.data() + t0 * s.n_embd, n, H, mm.data());
  for (int64_t i = 0; i < n * p.rank; ++i) H[i] = std::max(H[i], 0.0f);
  cpu::matmul(pool, fc2.view, H, n, S, mm.data());
}

// Orthonormalizes the rows of Q [r x d] in place (modified Gram-Schmidt, in double); a row that
// falls (numerically) into the span of the previous ones is replaced by a unit vector.
void orthonormalize_rows(float* Q, int64_t r, int64_t d) {
  for (int64_t a = 0; a < r; ++a) {
    float* qa = Q + a * d;
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t b = 0; b < a; ++b) {
        const float* qb = Q + b * d;
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(qa[i]) * qb[i];
        for (int64_t i = 0; i < d; ++i) qa[i] -= static_cast<float>(dot) * qb[i];
      }
    double nrm = 0;
    for (int64_t i = 0; i < d; ++i) nrm += static_cast<double>(qa[i]) * qa[i];
    if (nrm < 1e-20) {
      std::fill(qa, qa + d, 0.0f);
      qa[a % d] = 1.0f;
      --a;  // re-orthogonalize the replacement
      continue;
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(nrm));
    for (int64_t i = 0; i < d; ++i) qa[i] *= inv;
  }
}

// The threshold reaching `recall` of the firing mass of tokens [tok0, tok0 + n) of `s`, from their
// scores SS [n x n_ff], and the fraction of (token, neuron) pairs it predicts.
struct Calibration {
  float threshold = 0;
  double predicted = 1;
};
Calibration calibrate(const float* SS, const LayerSamples& s, int64_t tok0, int64_t n, double recall) {
  const int64_t nf = s.n_ff;
  std::vector<std::pair<float, float>> pos;  // (score, mass)
  double mass = 0;
  for (int64_t t = 0; t < n; ++t)
    for (uint32_t e = s.offsets[tok0 + t]; e < s.offsets[tok0 + t + 1]; ++e) {
      pos.push_back({SS[t * nf + s.idx[e]], s.mass[e]});
      mass += s.mass[e];
    }
  std::sort(pos.begin(), pos.end(), [](auto& a, auto& b) { return a.first > b.first; });
  Calibration c;
  c.threshold = pos.empty() ? 0.0f : pos.back().first;
  double acc = 0;
  for (const auto& [score, m] : pos) {
    acc += m;
    if (acc >= recall * mass) {
      c.threshold = score;
      break;
    }
  }
  uint64_t n_pred = 0;
  for (int64_t i = 0; i < n * nf; ++i) n_pred += SS[i] >= c.threshold;
  c.predicted = n > 0 ? static_cast<double>(n_pred) / static_cast<double>(n * nf) : 1.0;
  return c;
}

}  // namespace

void check_predictor_type(DType t, int64_t n_embd, int64_t rank) {
  EMBER_CHECK(t == DType::F32 || t == DType::F16 || t == DType::Q8_0,
              "predictor weights must be F32, F16 or Q8_0, got {}", dtype_name(t));
  EMBER_CHECK(t != DType::Q8_0 || (n_embd % 32 == 0 && rank % 32 == 0),
              "Q8_0 predictor weights need n_embd ({}) and the rank ({}) to be multiples of 32; use F16", n_embd, rank);
}

GateProducts gate_products(ThreadPool& pool, const TensorView& gate, const LayerSamples& s, int64_t n_tokens) {
  GateProducts gp;
  gp.d = gate.cols(), gp.nf = gate.rows();
  const int64_t d = gp.d, nf = gp.nf;
  EMBER_CHECK(d == s.n_embd && nf == s.n_ff, "gate initialization: the gate is {} x {}, the samples {} x {}", nf, d,
              s.n_ff, s.n_embd);
  const int64_t N = gp.n = std::min<int64_t>({n_tokens, s.n, kInitTokens});
  EMBER_CHECK(N >= 1, "gate initialization needs sample tokens");
  // G^T as floats: the rows dequantized (cpu::get_rows: a repacked gate's rows too, from their
  // group unpacked) and transposed; a repacked K-quant gate, which has no unpacking, as its
  // product with the identity (G^T = (G I)^T, exact up to the activations' rounding of 1).
  gp.GT.resize(static_cast<size_t>(nf * d));
  const DType base = cpu::r16_base(gate.type);
  if (base != gate.type && !cpu::r16_unpackable(base)) {
    std::vector<float> I(static_cast<size_t>(d * d), 0.0f);
    for (int64_t i = 0; i < d; ++i) I[i * d + i] = 1.0f;
    AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(gate.type, d, d) + 1);
    cpu::matmul(pool, gate, I.data(), d, gp.GT.data(), scratch.data());  // [d x nf]: row i is G e_i
  } else {
    std::vector<float> G(static_cast<size_t>(nf * d));
    std::vector<int32_t> ids(static_cast<size_t>(nf));
    for (int64_t r = 0; r < nf; ++r) ids[r] = static_cast<int32_t>(r);
    pool.parallel_for(nf, 64, [&](int64_t r0, int64_t r1, int) { cpu::get_rows(gate, &ids[r0], r1 - r0, &G[r0 * d]); });
    transpose(pool, G.data(), nf, d, gp.GT.data());
  }
  // The pre-activations of the sample tokens, P [N x nf] (the engine's product with the gate as
  // stored), and P^T.
  gp.P.resize(static_cast<size_t>(N * nf));
  gp.PT.resize(gp.P.size());
  AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(gate.type, d, N) + 1);
  cpu::matmul(pool, gate, s.x.data(), N, gp.P.data(), scratch.data());
  transpose(pool, gp.P.data(), N, nf, gp.PT.data());
  return gp;
}

void gate_subspace_init(ThreadPool& pool, const GateProducts& gp, int64_t rank, uint64_t seed, std::vector<float>& fc1,
                        std::vector<float>& fc2) {
  const int64_t d = gp.d, nf = gp.nf, N = gp.n, h = std::max<int64_t>(1, rank / 2);
  EMBER_CHECK(rank >= 2 && rank % 2 == 0 && h <= d, "gate initialization needs an even rank <= 2 n_embd, got {}", rank);
  const std::vector<float>&P = gp.P, &PT = gp.PT, &GT = gp.GT;
  // V [h x nf]: the top right-singular vectors of P (subspace iteration, V <- orth(P^T P V)).
  std::vector<float> V(static_cast<size_t>(h * nf)), A(static_cast<size_t>(N * h)), AT(static_cast<size_t>(N * h));
  std::mt19937_64 rng(seed ^ 0x5eedULL);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : V) v = nd(rng);
  orthonormalize_rows(V.data(), h, nf);
  for (int it = 0; it < 6; ++it) {
    gemm(pool, V.data(), h, nf, P.data(), N, A.data());     // A = P V^T   [N x h]
    transpose(pool, A.data(), N, h, AT.data());
    gemm(pool, PT.data(), nf, N, AT.data(), h, V.data());   // V = A^T P   [h x nf]
    orthonormalize_rows(V.data(), h, nf);
  }
  // fc1 = [V G; -V G], fc2 = [V^T, -V^T]: score = V^T V G x, as relu(a) - relu(-a) = a.
  std::vector<float> VG(static_cast<size_t>(h * d));
  gemm(pool, GT.data(), d, nf, V.data(), h, VG.data());     // VG [h x d]
  fc1.assign(static_cast<size_t>(rank * d), 0.0f);
  fc2.assign(static_cast<size_t>(nf * rank), 0.0f);
  for (int64_t q = 0; q < h; ++q)
    for (int64_t i = 0; i < d; ++i) fc1[q * d + i] = VG[q * d + i], fc1[(q + h) * d + i] = -VG[q * d + i];
  for (int64_t j = 0; j < nf; ++j)
    for (int64_t q = 0; q < h; ++q) fc2[j * rank + q] = V[q * nf + j], fc2[j * rank + q + h] = -V[q * nf + j];
}

LayerPredictor fit_predictor(ThreadPool& pool, const LayerSamples& s, int64_t rank, const PredictorTrainOptions& o,
                             const GateProducts* gate) {
  EMBER_CHECK(rank >= 1, "predictor rank must be positive, got {}", rank);
  const int64_t d = s.n_embd, nf = s.n_ff;
  check_predictor_type(o.type, d, rank);
  const int64_t n_hold = holdout_tokens(s, o);
  const int64_t n_train = s.n - n_hold;
  EMBER_CHECK(n_train >= 8, "train-predictor: {} sample tokens leave too few for training", s.n);
  const int64_t n_cal = n_hold / 2;  // tokens [n_train, n_train + n_cal) calibrate the threshold
  LayerPredictor p;
  p.rank = rank, p.n_embd = d, p.n_ff = nf;
  p.fc1.resize(static_cast<size_t>(rank * d));
  p.fc2.resize(static_cast<size_t>(nf * rank));
  std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(rank));
  if (o.init_gate.valid() && rank % 2 == 0 && rank / 2 <= d) {
    gate_subspace_init(pool, gate ? *gate : gate_products(pool, o.init_gate, s, n_train), rank, o.seed, p.fc1, p.fc2);
  } else {
    std::normal_distribution<float> n1(0.0f, 1.0f / std::sqrt(static_cast<float>(d)));
    for (float& w : p.fc1) w = n1(rng);
    std::normal_distribution<float> n2(0.0f, 1.0f / std::sqrt(static_cast<float>(rank)));
    for (float& w : p.fc2) w = n2(rng);
  }
  // Mean mass of the training positives normalizes the weights.
  double mass_sum = 0;
  const size_t pos_end = s.offsets[static_cast<size_t>(n_train)];
  for (size_t i = 0; i < pos_end; ++i) mass_sum += s.mass[i];
  const float inv_mean = pos_end > 0 && mass_sum > 0 ? static_cast<float>(pos_end / mass_sum) : 1.0f;

  const int64_t B = std::min(o.batch, n_train);
  AlignedBuffer<float> X(static_cast<size_t>(B * d)), Z(static_cast<size_t>(B * rank)), H(static_cast<size_t>(B * rank)),
      S(static_cast<size_t>(B * nf)), ST(static_cast<size_t>(B * nf)), HT(static_cast<size_t>(B * rank)),
      XT(static_cast<size_t>(B * d)), W2T(static_cast<size_t>(nf * rank)), dH(static_cast<size_t>(B * rank)),
      dZT(static_cast<size_t>(B * rank)), g1(static_cast<size_t>(rank * d)), g2(static_cast<size_t>(nf * rank));
  Adam adam1(p.fc1.size()), adam2(p.fc2.size());
  std::vector<int64_t> order(static_cast<size_t>(n_train));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::vector<double> loss_part(static_cast<size_t>(pool.size()));
  std::vector<float> firing(static_cast<size_t>(pool.size() * nf), 0.0f);
  // The weights kept: those (the start, or after an epoch) whose threshold for the recall target
  // predicts the fewest neurons on the calibration tokens. The cross-entropy is only a proxy for
  // that, and training can move a good start away from it.
  std::vector<float> best1, best2;
  double best_predicted = 2.0;
  AlignedBuffer<float> HC(static_cast<size_t>(n_cal * rank)), SC(static_cast<size_t>(n_cal * nf));  // n_cal >= 1
  auto checkpoint = [&](int epoch) {
    forward_scores(pool, p, o.type, s, n_train, n_train + n_cal, HC.data(), SC.data());
    const double predicted = calibrate(SC.data(), s, n_train, n_cal, o.recall).predicted;
    if (predicted < best_predicted) best_predicted = predicted, best1 = p.fc1, best2 = p.fc2, p.best_epoch = epoch;
  };
  checkpoint(0);
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    double loss = 0;
    for (int64_t b0 = 0; b0 + B <= n_train; b0 += B) {  // whole batches (the tail is next epoch's)
      for (int64_t t = 0; t < B; ++t)
        std::memcpy(&X[t * d], s.x.data() + order[b0 + t] * d, sizeof(float) * static_cast<size_t>(d));
      gemm(pool, p.fc1.data(), rank, d, X.data(), B, Z.data());
      for (int64_t i = 0; i < B * rank; ++i) H[i] = std::max(Z[i], 0.0f);
      gemm(pool, p.fc2.data(), nf, rank, H.data(), B, S.data());
      // dL/dS: silent (t, j): sigmoid(s); firing: w (sigmoid(s) - 1), w = pos_weight * mass / mean
      // (cpu::logistic_loss, with the firing neurons' weights as its positive labels). Loss and
      // gradient are means over the batch's tokens.
      const float inv_b = 1.0f / static_cast<float>(B);
      std::fill(loss_part.begin(), loss_part.end(), 0.0);
      pool.parallel_for(B, 1, [&](int64_t t0, int64_t t1, int ith) {
        double l = 0;
        float* labels = &firing[static_cast<size_t>(ith) * nf];  // the firing weights, 0 elsewhere
        for (int64_t t = t0; t < t1; ++t) {
          float* st = &S[t * nf];
          const int64_t tok = order[b0 + t];
          for (uint32_t e = s.offsets[tok]; e < s.offsets[tok + 1]; ++e)
            labels[s.idx[e]] = std::max(o.pos_weight * s.mass[e] * inv_mean, std::numeric_limits<float>::min());
          l += cpu::logistic_loss(st, labels, inv_b, st, nf);
          for (uint32_t e = s.offsets[tok]; e < s.offsets[tok + 1]; ++e) labels[s.idx[e]] = 0.0f;
        }
        loss_part[ith] += l;
      });
      for (double l : loss_part) loss += l;
      // fc2 gradient: g2[j][q] = sum_t dS[t][j] H[t][q]; fc1's through dH = dS fc2.
      transpose(pool, S.data(), B, nf, ST.data());
      transpose(pool, H.data(), B, rank, HT.data());
      gemm(pool, HT.data(), rank, B, ST.data(), nf, g2.data());
      transpose(pool, p.fc2.data(), nf, rank, W2T.data());
      gemm(pool, W2T.data(), rank, nf, S.data(), B, dH.data());
      for (int64_t i = 0; i < B * rank; ++i) dH[i] = Z[i] > 0.0f ? dH[i] : 0.0f;
      transpose(pool, dH.data(), B, rank, dZT.data());
      transpose(pool, X.data(), B, d, XT.data());
      gemm(pool, XT.data(), d, B, dZT.data(), rank, g1.data());
      adam1.update(pool, p.fc1.data(), g1.data(), p.fc1.size(), o.lr);
      adam2.update(pool, p.fc2.data(), g2.data(), p.fc2.size(), o.lr);
    }
    p.train_loss = loss / static_cast<double>(std::max<int64_t>(1, n_train / B * B));
    checkpoint(epoch + 1);
    p.epochs_run = epoch + 1;
    if (o.patience > 0 && p.epochs_run - p.best_epoch >= o.patience) break;  // no better for `patience` epochs
  }
  p.fc1 = std::move(best1), p.fc2 = std::move(best2);
  round_rows(o.type, p.fc1, rank, d);
  round_rows(o.type, p.fc2, nf, rank);
  p.bytes = row_bytes(o.type, d) * static_cast<size_t>(rank) + row_bytes(o.type, rank) * static_cast<size_t>(nf);

  // Held-out scores (calibration half, then evaluation half).
  const int64_t n_eval = n_hold - n_cal;
  AlignedBuffer<float> HS(static_cast<size_t>(n_hold * rank)), SS(static_cast<size_t>(n_hold * nf));
  forward_scores(pool, p, o.type, s, n_train, s.n, HS.data(), SS.data());
  // Threshold: the largest score at which the calibration tokens' firing neurons keep >= recall
  // of their mass.
  p.threshold = calibrate(SS.data(), s, n_train, n_cal, o.recall).threshold;
  // Evaluation half.
  double m_tot = 0, m_hit = 0;
  uint64_t n_pos = 0, n_hit = 0, n_pred = 0;
  for (int64_t t = n_cal; t < n_hold; ++t) {
    const float* st = &SS[t * nf];
    for (int64_t j = 0; j < nf; ++j) n_pred += st[j] >= p.threshold;
    const int64_t tok = n_train + t;
    for (uint32_t e = s.offsets[tok]; e < s.offsets[tok + 1]; ++e) {
      const bool hit = st[s.idx[e]] >= p.threshold;
      m_tot += s.mass[e], n_pos += 1;
      if (hit) m_hit += s.mass[e], n_hit += 1;
    }
  }
  const double pairs = static_cast<double>(n_eval) * static_cast<double>(nf);
  p.recall_mass = m_tot > 0 ? m_hit / m_tot : 1.0;
  p.recall_count = n_pos ? static_cast<double>(n_hit) / static_cast<double>(n_pos) : 1.0;
  p.precision = n_pred ? static_cast<double>(n_hit) / static_cast<double>(n_pred) : 1.0;
  p.predicted_sparsity = 1.0 - static_cast<double>(n_pred) / pairs;
  p.true_sparsity = 1.0 - static_cast<double>(n_pos) / pairs;
  p.cost = static_cast<double>(p.bytes) + o.ffn_bytes * ((1.0 - p.predicted_sparsity) + 2.0 * (1.0 - p.true_sparsity)) / 3.0;
  return p;
}

LayerPredictor train_layer_predictor(ThreadPool& pool, const LayerSamples& s, const PredictorTrainOptions& o,
                                     const TrainProgress& progress) {
  EMBER_CHECK(o.min_rank >= 1 && o.max_rank >= o.min_rank, "predictor ranks: need 1 <= min ({}) <= max ({})",
              o.min_rank, o.max_rank);
  EMBER_CHECK(o.recall > 0.0 && o.recall <= 1.0, "recall target must be in (0, 1], got {}", o.recall);
  std::vector<LayerPredictor> tried;
  // The gate's products with the samples, once for every rank tried (the training tokens are the
  // same for all).
  std::unique_ptr<GateProducts> gate;
  if (o.init_gate.valid() && s.n - holdout_tokens(s, o) >= 1)
    gate = std::make_unique<GateProducts>(gate_products(pool, o.init_gate, s, s.n - holdout_tokens(s, o)));
  auto fit = [&](int64_t r) {
    tried.push_back(fit_predictor(pool, s, r, o, gate.get()));
    const LayerPredictor& p = tried.back();
    if (progress)
      progress(fmt::format("rank {:5}: recall {:.4f} (mass) {:.4f} (count), precision {:.3f}, predicted sparsity "
                           "{:.3f} (true {:.3f}), {:.2f} MiB, cost {:.2f} MiB/token, weights of epoch {} of {}",
                           r, p.recall_mass, p.recall_count, p.precision, p.predicted_sparsity, p.true_sparsity,
                           p.bytes / 1048576.0, p.cost / 1048576.0, p.best_epoch, p.epochs_run));
    return tried.size() - 1;
  };
  auto better = [&](size_t a, size_t b) { return tried[a].cost < tried[b].cost; };
  // Q8_0 rows are whole blocks of 32: its ranks are multiples of 32.
  const int64_t unit = o.type == DType::Q8_0 ? 32 : 1;
  const int64_t min_rank = (o.min_rank + unit - 1) / unit * unit;
  EMBER_CHECK(min_rank <= o.max_rank, "predictor ranks: {} weights need a rank that is a multiple of {}, and the "
              "largest allowed is {}", dtype_name(o.type), unit, o.max_rank);
  size_t best = fit(min_rank);
  // Without a cost model the smallest rank that reaches the recall on held-out data wins.
  const bool by_size = o.ffn_bytes <= 0;
  for (int64_t r = min_rank * 2; r <= o.max_rank; r *= 2) {
    if (by_size && tried[best].recall_mass >= o.recall) break;
    const size_t i = fit(r);
    if (by_size ? tried[i].recall_mass > tried[best].recall_mass : better(i, best)) best = i;
    else break;  // the cost rose: larger ranks will not pay for themselves
  }
  if (!by_size) {
    // One bisection step towards the better neighbour of the best rank.
    const int64_t r = tried[best].rank;
    int64_t lo = r / 2 >= min_rank ? r / 2 : 0, hi = r * 2 <= o.max_rank ? r * 2 : 0;
    int64_t nb_rank = 0;
    double nb_cost = 1e300;
    for (const auto& t : tried)
      if ((t.rank == lo || t.rank == hi) && t.cost < nb_cost) nb_cost = t.cost, nb_rank = t.rank;
    if (nb_rank > 0) {
      const int64_t mid = (r + nb_rank) / 2 / unit * unit;
      if (mid != r && mid != nb_rank) {
        const size_t i = fit(mid);
        if (better(i, best)) best = i;
      }
    }
  }
  return std::move(tried[best]);
}

void predictor_scores_reference(const LayerPredictor& p, const float* x, int64_t n, double* scores) {
  std::vector<double> h(static_cast<size_t>(p.rank));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t q = 0; q < p.rank; ++q) {
      double a = 0;
      for (int64_t i = 0; i < p.n_embd; ++i) a += static_cast<double>(p.fc1[q * p.n_embd + i]) * x[t * p.n_embd + i];
      h[q] = std::max(a, 0.0);
    }
    for (int64_t j = 0; j < p.n_ff; ++j) {
      double a = 0;
      for (int64_t q = 0; q < p.rank; ++q) a += static_cast<double>(p.fc2[j * p.rank + q]) * h[q];
      scores[t * p.n_ff + j] = a;
    }
  }
}

void write_predictor_file(const std::string& path, const std::string& model_name,
                          const std::vector<LayerPredictor>& layers, DType type) {
  EMBER_CHECK(!layers.empty(), "no predictors to write");
  for (const auto& l : layers) check_predictor_type(type, l.n_embd, l.rank);
  bool all_neg = true, all_pos = true;
  for (const auto& l : layers) all_neg &= l.threshold < 0, all_pos &= l.threshold > 0;
  const float global = all_neg ? -1.0f : all_pos ? 1.0f : 0.0f;
  gguf::Writer w;
  using gguf::Value;
  w.set("general.architecture", Value::str("ember-predictor"));
  w.set("general.name", Value::str(model_name + " predictor"));
  w.set("ember.predictor.n_layer", Value::u64(layers.size()));
  w.set(kPredictorInputKey, Value::str("ffn_input"));  // trained on the FFN input (after ffn_norm)
  w.set("powerinfer.sparse_threshold", Value::f32(global));
  std::vector<float> thresholds;
  for (size_t il = 0; il < layers.size(); ++il) {
    const LayerPredictor& l = layers[il];
    // Folding: score >= t  <=>  score / |t| >= sign(t), for thresholds of one sign.
    const float scale = global != 0.0f ? 1.0f / std::fabs(l.threshold) : 1.0f;
    thresholds.push_back(global != 0.0f ? global : l.threshold);
    const std::string p = "blk." + std::to_string(il) + ".";
    w.add_tensor(p + "fc1.weight", type, {l.n_embd, l.rank}, Encoded(type, l.fc1, l.rank, l.n_embd).bytes);
    w.add_tensor(p + "fc2.weight", type, {l.rank, l.n_ff}, Encoded(type, l.fc2, l.n_ff, l.rank, scale).bytes);
  }
  w.set("ember.predictor.thresholds", Value::floats(thresholds));
  w.write(path);
}

DType auto_predictor_type(const Hparams& hp, int64_t max_rank) {
  return hp.n_embd % 32 == 0 && std::min(max_rank, std::min(hp.n_embd, hp.n_ff)) >= 32 ? DType::Q8_0 : DType::F16;
}

std::vector<LayerPredictor> train_predictors(ThreadPool& pool, const Model& model, std::vector<LayerSamples>& samples,
                                             PredictorTrainOptions o, bool from_gate,
                                             const std::function<void(int64_t, const std::string&)>& progress) {
  const int64_t n_layer = model.hp.n_layer;
  EMBER_CHECK(static_cast<int64_t>(samples.size()) == n_layer, "train_predictors: samples of {} layers for {}",
              samples.size(), n_layer);
  o.max_rank = std::min(o.max_rank, std::min(model.hp.n_embd, model.hp.n_ff));  // a rank beyond both buys nothing
  o.min_rank = std::min(o.min_rank, o.max_rank);
  std::vector<LayerPredictor> layers;
  for (int64_t il = 0; il < n_layer; ++il) {
    const FfnWeights& w = model.layers[static_cast<size_t>(il)].ffn;
    o.ffn_bytes = static_cast<double>(w.gate.nbytes + w.up.nbytes + w.down.nbytes);
    o.init_gate = from_gate ? w.gate : TensorView{};
    layers.push_back(train_layer_predictor(pool, samples[static_cast<size_t>(il)], o, [&](const std::string& m) {
      if (progress) progress(il, m);
    }));
    if (progress) progress(il, fmt::format("chose rank {}", layers.back().rank));
    samples[static_cast<size_t>(il)] = LayerSamples{};
  }
  return layers;
}

}  // namespace ember
