#include "sparse/sparsify.hpp"

#include <filesystem>

#include "core/error.hpp"
#include "gguf/copy.hpp"
#include "model/model.hpp"

namespace ember {

SparsifySummary sparsify_model(const SparsifyOptions& o) { return sparsify_model(o, read_profile(o.profile)); }

namespace {

// The model file as it is, plus the plan's thresholds and shares.
SparsifySummary write_sparsified(const SparsifyOptions& o, const Model& model, InputSparsityPlan plan) {
  EMBER_CHECK(static_cast<int64_t>(plan.thresholds.size()) == model.hp.n_layer &&
                  plan.sparsity.size() == plan.thresholds.size(),
              "sparsify: an allocation of {} layers for a model of {}", plan.thresholds.size(), model.hp.n_layer);
  SparsifySummary sum;
  sum.plan = std::move(plan);
  const gguf::Reader& r = *model.file;
  gguf::Writer w(r.alignment());
  w.set_powerinfer_magic(r.is_powerinfer());
  for (const std::string& k : r.keys())
    if (k.rfind("ember.input_sparsity.", 0) != 0) w.set(k, r.metadata().at(k));
  std::vector<float> flat;
  for (const auto& t : sum.plan.thresholds) flat.insert(flat.end(), t.begin(), t.end());
  w.set("ember.input_sparsity.thresholds", gguf::Value::floats(flat));
  std::vector<float> dropped;
  for (const auto& s : sum.plan.sparsity) dropped.insert(dropped.end(), s.begin(), s.end());
  w.set("ember.input_sparsity.sparsity", gguf::Value::floats(dropped));
  w.set("ember.input_sparsity.target", gguf::Value::f32(static_cast<float>(o.sparsity)));
  w.set("ember.input_sparsity.allocation", gguf::Value::str(input_allocation_name(o.allocation)));
  w.set("ember.input_sparsity.profile", gguf::Value::str(std::filesystem::path(o.profile).filename().string()));
  for (const gguf::TensorInfo& t : r.tensors()) gguf::add_tensor_copy(w, r, t);
  w.write(o.output);
  sum.bytes = std::filesystem::file_size(o.output);
  return sum;
}

}  // namespace

SparsifySummary sparsify_model(const SparsifyOptions& o, const Profile& profile) {
  EMBER_CHECK(o.output != o.model, "sparsify: the output must be another file than the model ('{}')", o.model);
  auto model = load_model(o.model);
  return write_sparsified(o, *model, allocate_input_sparsity(profile, *model, o.sparsity, o.allocation));
}

SparsifySummary sparsify_model(const SparsifyOptions& o, InputSparsityPlan plan) {
  EMBER_CHECK(o.output != o.model, "sparsify: the output must be another file than the model ('{}')", o.model);
  auto model = load_model(o.model);
  return write_sparsified(o, *model, std::move(plan));
}

}  // namespace ember
