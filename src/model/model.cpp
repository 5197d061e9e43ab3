#include "model/model.hpp"

#include <cmath>

#include "core/error.hpp"
#include "model/gemma3.hpp"
#include "model/llama.hpp"
#include "model/opt.hpp"

namespace ember {

size_t Model::weight_bytes_per_token() const {
  size_t total = output.nbytes;
  for (const auto& l : layers) {
    for (const TensorView* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn.norm, &l.ffn.gate, &l.ffn.up,
                                &l.q_norm, &l.k_norm, &l.attn_post_norm, &l.ffn_post_norm, &l.attn_norm_b, &l.bq,
                                &l.bk, &l.bv, &l.bo, &l.ffn.norm_b, &l.ffn.up_b, &l.ffn.down_b})
      total += t->nbytes;
    total += l.ffn.down.valid() ? l.ffn.down.nbytes : l.ffn.down_t.nbytes;  // the one the dense path reads
  }
  return total;
}

bool predictor_reads_residual(const gguf::Reader& r) {
  const auto v = r.opt_string(kPredictorInputKey);
  if (!v) return r.opt_string("general.architecture").value_or("") != "ember-predictor";
  EMBER_CHECK(*v == "residual" || *v == "ffn_input", "{}: {} is '{}' (expected 'residual' or 'ffn_input')", r.path(),
              kPredictorInputKey, *v);
  return *v == "residual";
}

std::unique_ptr<Model> load_model(const std::string& path) {
  auto model = std::make_unique<Model>();
  model->file = std::make_unique<gguf::Reader>(path);
  std::string arch = model->file->opt_string("general.architecture").value_or("");
  if (arch == "llama" || arch == "bamboo") {
    load_llama(*model);
  } else if (arch == "opt") {
    load_opt(*model);
  } else if (arch == "gemma3") {
    load_gemma3(*model);
  } else {
    fail("{}: architecture '{}' is not supported (Ember runs: llama, bamboo, opt, gemma3)", path, arch.empty() ? "<none>" : arch);
  }
  // Calibrated per-layer gate thresholds of sparse-ready files (docs/sparse_formats.md).
  if (model->file->has("ember.sparse.thresholds")) {
    model->gate_thresholds = model->file->get_float_array("ember.sparse.thresholds");
    EMBER_CHECK(static_cast<int64_t>(model->gate_thresholds.size()) == model->hp.n_layer,
                "{}: ember.sparse.thresholds has {} entries for {} layers", path, model->gate_thresholds.size(),
                model->hp.n_layer);
    for (float t : model->gate_thresholds)
      EMBER_CHECK(std::isfinite(t) && t >= 0.0f, "{}: ember.sparse.thresholds holds {}, not a finite value >= 0", path,
                  t);
  }
  return model;
}

}  // namespace ember
