#include "model/model.hpp"

#include <cmath>

#include "core/enum_names.hpp"
#include "core/error.hpp"

namespace ember {

size_t Model::expert_bytes_per_token() const {
  size_t total = 0;
  for (const auto& l : layers)
    if (l.moe.valid()) {  // n_used experts (of equal size)
      const FfnWeights& e = l.moe.experts[0];
      total += static_cast<size_t>(l.moe.n_used) * (e.gate.nbytes + e.up.nbytes + e.down.nbytes);
    }
  return total;
}

size_t Model::weight_bytes_per_token() const {
  size_t total = output.nbytes + expert_bytes_per_token();
  for (const auto& l : layers) {
    for (const TensorView* t : l.attention_tensors()) total += t->nbytes;
    for (const TensorView* t : l.ffn_block_tensors()) total += t->nbytes;
    if (l.moe.valid()) {  // the router (the chosen experts counted above)
      total += l.moe.router.nbytes;
      continue;
    }
    total += l.ffn.gate.nbytes + l.ffn.up.nbytes + l.ffn.up_b.nbytes;
    total += l.ffn.down.valid() ? l.ffn.down.nbytes : l.ffn.down_t.nbytes;  // the one the dense path reads
  }
  return total;
}

bool model_has_moe(const Model& model) {
  for (const auto& l : model.layers)
    if (l.moe.valid()) return true;
  return false;
}

std::string model_moe_refusal(const Model& model, const std::string& what) {
  if (!model_has_moe(model)) return {};
  return fmt::format("{} works on dense FFNs; this {} model's FFNs are mixtures of experts, which it does not "
                     "place or predict yet (run it dense: no --sparse-mode, no --vram-budget)",
                     what, model.hp.arch);
}

const char* ffn_gating_name(FfnGating g) {
  static constexpr EnumName<FfnGating> kNames[] = {{FfnGating::par, "gated (act(gate) * up)"},
                                                   {FfnGating::sym, "symmetric (act(gate) * act(up), Bamboo)"},
                                                   {FfnGating::none, "ungated (act(up + bias), OPT)"}};
  return enum_name(kNames, g);
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
  const std::string arch = model->file->opt_string("general.architecture").value_or("");
  const Architecture* a = find_architecture(arch);
  EMBER_CHECK(a, "{}: architecture '{}' is not supported (Ember runs: {})", path, arch.empty() ? "<none>" : arch,
              architecture_names());
  a->load(*model);
  return model;
}

}  // namespace ember
