#include "sparse/predictor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"
#include "ops/cpu/matmul.hpp"
#include "tensor/quant.hpp"

namespace ember {

size_t predictor_scratch_floats(int64_t rank, int64_t n_ff, int64_t n_tokens) {
  // Scores first, then the hidden rows, each rounded up to 16 floats (64 bytes).
  auto up16 = [](int64_t v) { return static_cast<size_t>((v + 15) / 16 * 16); };
  return up16(n_ff * n_tokens) + up16(rank * n_tokens);
}

size_t predictor_mm_scratch_bytes(const TensorView& fc1, const TensorView& fc2, int64_t n_tokens) {
  return std::max(cpu::matmul_scratch_bytes(fc1.type, fc1.cols(), n_tokens),
                  cpu::matmul_scratch_bytes(fc2.type, fc2.cols(), n_tokens));
}

int64_t mirrored_half(const TensorView& fc1, const TensorView& fc2) {
  const int64_t rank = fc1.rows(), d = fc1.cols(), n_ff = fc2.rows(), h = rank / 2;
  if (rank < 2 || rank % 2 != 0 || fc2.cols() != rank || h % info(fc2.type).block_size != 0) return 0;
  std::vector<float> a(static_cast<size_t>(std::max(d, rank))), b(static_cast<size_t>(d));
  for (int64_t q = 0; q < h; ++q) {
    dequantize_row(fc1.type, fc1.row(q), a.data(), d);
    dequantize_row(fc1.type, fc1.row(q + h), b.data(), d);
    for (int64_t i = 0; i < d; ++i)
      if (b[i] != -a[i]) return 0;
  }
  for (int64_t j = 0; j < n_ff; ++j) {
    dequantize_row(fc2.type, fc2.row(j), a.data(), rank);
    for (int64_t q = 0; q < h; ++q)
      if (a[q + h] != -a[q]) return 0;
  }
  return h;
}

size_t half_columns_bytes(const TensorView& fc2, int64_t h) {
  return row_bytes(fc2.type, h) * static_cast<size_t>(fc2.rows());
}

TensorView copy_half_columns(const TensorView& fc2, int64_t h, uint8_t* dst) {
  const size_t rb = row_bytes(fc2.type, h);
  for (int64_t j = 0; j < fc2.rows(); ++j) std::memcpy(dst + rb * static_cast<size_t>(j), fc2.row(j), rb);
  TensorView v = matrix_view(fc2.type, dst, fc2.rows(), h);
  v.name = fc2.name;
  return v;
}

TensorView first_rows(const TensorView& m, int64_t rows) {
  TensorView v = matrix_view(m.type, m.data, rows, m.cols());
  v.name = m.name;
  return v;
}

int64_t predict_active(ThreadPool& pool, const TensorView& fc1, const TensorView& fc2, float threshold,
                       const float* x, int64_t n, float* scratch, void* mm_scratch, int32_t* active, bool linear) {
  const int64_t rank = fc1.rows(), n_ff = fc2.rows();
  float* score = scratch;
  float* hidden = scratch + (n_ff * n + 15) / 16 * 16;
  cpu::matmul(pool, fc1, x, n, hidden, mm_scratch);
  if (!linear)
    for (int64_t i = 0; i < rank * n; ++i) hidden[i] = std::max(hidden[i], 0.0f);
  cpu::matmul(pool, fc2, hidden, n, score, mm_scratch);
  int64_t na = 0;
  if (n == 1) {
    for (int64_t j = 0; j < n_ff; ++j)
      if (score[j] >= threshold) active[na++] = static_cast<int32_t>(j);
    return na;
  }
  for (int64_t j = 0; j < n_ff; ++j) {
    bool any = false;
    for (int64_t t = 0; t < n && !any; ++t) any = score[t * n_ff + j] >= threshold;
    if (any) active[na++] = static_cast<int32_t>(j);
  }
  return na;
}

void attach_predictors(Model& model, const std::string& path) {
  auto file = std::make_unique<gguf::Reader>(path);
  const Hparams& hp = model.hp;
  const std::string arch = file->opt_string("general.architecture").value_or("");
  EMBER_CHECK(arch == "ember-predictor",
              "{}: not a predictor file (general.architecture is '{}', expected 'ember-predictor'); "
              "make one with `ember train-predictor`",
              path, arch);
  const int64_t n_layer = file->opt_int("ember.predictor.n_layer").value_or(-1);
  EMBER_CHECK(n_layer == hp.n_layer, "{}: predictor has {} layers, the model {}; was it trained for another model?",
              path, n_layer, hp.n_layer);
  std::vector<TensorView> fc1(hp.n_layer), fc2(hp.n_layer);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    fc1[il] = file->view(p + "fc1.weight");
    fc2[il] = file->view(p + "fc2.weight");
    EMBER_CHECK(fc1[il].valid() && fc2[il].valid(), "{}: layer {} has no {}fc1.weight / {}fc2.weight", path, il, p, p);
    for (const TensorView* t : {&fc1[il], &fc2[il]})
      EMBER_CHECK(t->type == DType::F32 || t->type == DType::F16 || t->type == DType::Q8_0,
                  "{}: {} has type {}; predictors must be F32, F16 or Q8_0", path, t->name, dtype_name(t->type));
    const int64_t rank = fc1[il].rows();
    EMBER_CHECK(fc1[il].cols() == hp.n_embd && fc1[il].ne[2] == 1 && fc1[il].ne[3] == 1 && rank >= 1,
                "{}: {} has shape [{}, {}], expected [n_embd = {}, rank]", path, fc1[il].name, fc1[il].ne[0],
                fc1[il].ne[1], hp.n_embd);
    EMBER_CHECK(fc2[il].cols() == rank && fc2[il].rows() == hp.n_ff && fc2[il].ne[2] == 1 && fc2[il].ne[3] == 1,
                "{}: {} has shape [{}, {}], expected [rank = {}, n_ff = {}]", path, fc2[il].name, fc2[il].ne[0],
                fc2[il].ne[1], rank, hp.n_ff);
  }
  const double thr = file->opt_float("powerinfer.sparse_threshold").value_or(0.0);
  EMBER_CHECK(std::isfinite(thr), "{}: powerinfer.sparse_threshold is not finite", path);
  std::vector<float> per_layer;
  if (file->has("ember.predictor.thresholds")) {
    per_layer = file->get_float_array("ember.predictor.thresholds");
    EMBER_CHECK(static_cast<int64_t>(per_layer.size()) == hp.n_layer,
                "{}: ember.predictor.thresholds has {} entries, expected one per layer ({})", path, per_layer.size(),
                hp.n_layer);
    for (float v : per_layer) EMBER_CHECK(std::isfinite(v), "{}: ember.predictor.thresholds has a non-finite entry", path);
  }
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    model.layers[il].ffn.fc1 = fc1[il];
    model.layers[il].ffn.fc2 = fc2[il];
  }
  model.predictor_threshold = static_cast<float>(thr);
  model.predictor_thresholds = std::move(per_layer);
  model.predictor_on_residual = predictor_reads_residual(*file);
  model.side_files.push_back(std::move(file));
  log_info("predictors: {} ({} layers, {:.1f} MiB)", path, hp.n_layer, predictor_bytes(model) / 1048576.0);
}

float predictor_threshold(const Model& model, int64_t layer) {
  return model.predictor_thresholds.empty() ? model.predictor_threshold
                                            : model.predictor_thresholds[static_cast<size_t>(layer)];
}

bool has_predictors(const Model& model) {
  if (model.layers.empty()) return false;
  for (const auto& L : model.layers)
    if (!L.ffn.fc1.valid() || !L.ffn.fc2.valid()) return false;
  return true;
}

size_t predictor_bytes(const Model& model) {
  size_t b = 0;
  for (const auto& L : model.layers) b += L.ffn.fc1.nbytes + L.ffn.fc2.nbytes;
  return b;
}

}  // namespace ember
