#include "sparse/prepare.hpp"

#include "gguf/copy.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/thread_pool.hpp"
#include "model/arch_synth.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"
#include "model/model.hpp"
#include "ops/cpu/sparse/sparse.hpp"
#include "sparse/profile.hpp"
#include "sparse/reorder.hpp"

namespace ember {
namespace {

// "blk.<il>.<rest>" -> il and rest; -1 for tensors outside the layers.
int64_t layer_of(const std::string& name, std::string& rest) {
  if (name.rfind("blk.", 0) != 0) return -1;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return -1;
  try {
    const int64_t il = std::stoll(name.substr(4, dot - 4));
    rest = name.substr(dot + 1);
    return il;
  } catch (...) {
    return -1;
  }
}

using gguf::copy_of;
using gguf::shape_of;

DType pick_down_t_type(const std::string& choice, DType down, int64_t n_embd, const std::string& path) {
  if (choice == "same") {
    if (n_embd % info(down).block_size == 0) return down;
    log_warn("prepare: n_embd {} is not a multiple of the {} block size; ffn_down_t is written as F16", n_embd,
             dtype_name(down));
    return DType::F16;
  }
  auto t = dtype_from_name(choice);
  EMBER_CHECK(t.has_value() && dtype_supported(*t), "prepare: unknown --down-type '{}' (same, f32, f16, q8_0, q4_0, ...)",
              choice);
  EMBER_CHECK(n_embd % info(*t).block_size == 0, "{}: ffn_down_t of type {} needs n_embd ({}) to be a multiple of {}",
              path, dtype_name(*t), n_embd, info(*t).block_size);
  return *t;
}

// Bytes from one neuron's bundle to the next, for rows of `row` bytes: whole pages where that
// wastes at most a quarter (each neuron's rows then begin a page, so its gate row is one page
// read and its up and down rows one or two more), else the rows back to back.
size_t bundle_stride(size_t row) {
  constexpr size_t kPage = 4096;
  const size_t bytes = static_cast<size_t>(kFfnBundleParts) * row;
  const size_t paged = (bytes + kPage - 1) / kPage * kPage;
  return (paged - bytes) * 4 <= bytes ? paged : bytes;
}

// Whether every layer's FFN can be bundled by neuron: gated, with separate gate and up of one type,
// and a neuron-major down of that type too (a bundle is one tensor of one type).
void check_bundle(const Model& m, DType down_t_type, const std::string& path) {
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const FfnWeights& f = m.layers[l].ffn;
    EMBER_CHECK(f.gated() && f.gate.valid() && f.gate.contiguous() && f.up.contiguous() && f.gate.rows() == f.up.rows(),
                "prepare --bundle: {} layer {} has no separate ffn_gate and ffn_up (a bundle holds a gated FFN's gate, "
                "up and down rows)", path, l);
    EMBER_CHECK(f.gate.type == f.up.type && f.gate.type == down_t_type && !f.up_b.valid() && !f.down_b.valid(),
                "prepare --bundle: {} layer {} has ffn_gate {}, ffn_up {} and a neuron-major down of {}{}: a bundle is "
                "one tensor of one type; pass --down-type {} if down may take the gate's type, or prepare without "
                "--bundle", path, l, dtype_name(f.gate.type), dtype_name(f.up.type), dtype_name(down_t_type),
                f.up_b.valid() || f.down_b.valid() ? " and biases" : "", dtype_name(f.gate.type));
  }
}

}  // namespace

float threshold_from_quantiles(const float* q, float s) {
  EMBER_CHECK(std::isfinite(s) && s >= 0.0f && s <= 1.0f, "target sparsity must be between 0 and 1, got {}", s);
  const double pos = static_cast<double>(s) * (kQuantiles - 1);
  const int64_t lo = std::min<int64_t>(static_cast<int64_t>(pos), kQuantiles - 2);
  const double frac = pos - static_cast<double>(lo);
  return static_cast<float>(q[lo] + frac * (q[lo + 1] - q[lo]));
}

namespace {

// The profile's order of each layer's neurons, hot first (perms; its clustered order where it has
// one and o.cluster), its mean hot share and, with
// --sparsity, each layer's threshold from its gate quantiles (into sum).
std::vector<std::vector<int32_t>> profile_order(const PrepareOptions& o, int64_t L, int64_t n_ff, PrepareSummary& sum,
                                                std::vector<float>& freq) {
  gguf::Reader prof(o.profile);
  const std::string parch = prof.opt_string("general.architecture").value_or("");
  EMBER_CHECK(parch == "ember-profile", "{}: not a profile (general.architecture '{}', expected 'ember-profile'); make one "
              "with `ember profile`", o.profile, parch);
  const int64_t p_layers = prof.opt_int("ember.profile.n_layer").value_or(-1);
  const int64_t p_ff = prof.opt_int("ember.profile.n_ff").value_or(-1);
  EMBER_CHECK(p_layers == L && p_ff == n_ff,
              "{}: the profile is of a model with {} layers and n_ff {}, but {} has {} layers and n_ff {}: a profile of "
              "another model? Profile this model with `ember profile`", o.profile, p_layers, p_ff, o.model, L, n_ff);
  const double n_tokens = static_cast<double>(std::max<int64_t>(prof.opt_int("ember.profile.n_tokens").value_or(1), 1));
  std::vector<std::vector<int32_t>> perms(static_cast<size_t>(L));
  freq.clear();
  freq.reserve(static_cast<size_t>(L * n_ff));
  std::vector<float> thresholds;
  double hot_share = 0.0;
  sum.clustered = o.cluster && prof.find_tensor("blk.0.ffn_cluster_order");
  for (int64_t il = 0; il < L; ++il) {
    const std::string cn = fmt::format("blk.{}.ffn_act_count", il);
    const TensorView c = prof.view(cn);
    EMBER_CHECK(c.valid() && c.type == DType::F32 && c.n_elements() == n_ff,
                "{}: tensor '{}' is missing or not F32 [{}]", o.profile, cn, n_ff);
    const float* counts = reinterpret_cast<const float*>(c.data);
    for (int64_t j = 0; j < n_ff; ++j)
      EMBER_CHECK(std::isfinite(counts[j]) && counts[j] >= 0, "{}: '{}' holds {} (counts must be finite, >= 0)",
                  o.profile, cn, counts[j]);
    perms[il] = sum.clustered ? read_cluster_order(prof, o.profile, il, n_ff) : hot_first_permutation(counts, n_ff);
    for (int64_t i = 0; i < n_ff; ++i) freq.push_back(static_cast<float>(counts[perms[il][i]] / n_tokens));
    double total = 0, top = 0;
    for (int64_t i = 0; i < n_ff; ++i) {
      total += counts[perms[il][i]];
      if (i < std::max<int64_t>(1, n_ff / 10)) top += counts[perms[il][i]];
    }
    hot_share += total > 0 ? top / total : 0.0;
    if (o.sparsity >= 0.0f) {
      const std::string qn = fmt::format("blk.{}.ffn_gate_quantiles", il);
      const TensorView q = prof.view(qn);
      EMBER_CHECK(q.valid() && q.type == DType::F32 && q.n_elements() == kQuantiles,
                  "{}: --sparsity needs the gate quantiles '{}' (F32 [{}]), which this profile does not have", o.profile,
                  qn, kQuantiles);
      thresholds.push_back(threshold_from_quantiles(reinterpret_cast<const float*>(q.data), o.sparsity));
    }
  }
  sum.hot_share = hot_share / static_cast<double>(L);
  sum.thresholds = thresholds;
  return perms;

}

// The predictor to embed: the --predictor file (checked against the model's shape; null: the
// model's own, if any), its threshold in *threshold and its rank in sum.
std::unique_ptr<gguf::Reader> open_predictor(const PrepareOptions& o, const Model& m, PrepareSummary& sum,
                                             float* threshold) {
  const int64_t L = m.hp.n_layer, n_ff = m.hp.n_ff, d = m.hp.n_embd;
  std::unique_ptr<gguf::Reader> pred;
  *threshold = m.predictor_threshold;
  if (!o.predictor.empty()) {
    pred = std::make_unique<gguf::Reader>(o.predictor);
    const std::string a = pred->opt_string("general.architecture").value_or("");
    EMBER_CHECK(a == "ember-predictor", "{}: not a predictor file (general.architecture '{}', expected "
                "'ember-predictor')", o.predictor, a);
    for (int64_t il = 0; il < L; ++il) {
      const TensorView f1 = pred->view(fmt::format("blk.{}.fc1.weight", il));
      const TensorView f2 = pred->view(fmt::format("blk.{}.fc2.weight", il));
      EMBER_CHECK(f1.valid() && f2.valid(), "{}: layer {} has no fc1/fc2 (the model has {} layers)", o.predictor, il, L);
      EMBER_CHECK(f1.ne[0] == d && f2.ne[0] == f1.ne[1] && f2.ne[1] == n_ff,
                  "{}: layer {} predictor shapes fc1 [{}, {}], fc2 [{}, {}] do not fit the model (expected [{}, r], "
                  "[r, {}]): a predictor of another model?", o.predictor, il, f1.ne[0], f1.ne[1], f2.ne[0], f2.ne[1], d,
                  n_ff);
      EMBER_CHECK(dtype_supported(f1.type) && dtype_supported(f2.type), "{}: layer {} predictor has an unsupported type",
                  o.predictor, il);
    }
    *threshold = static_cast<float>(pred->opt_float("powerinfer.sparse_threshold").value_or(0.0));
    sum.predictor_rank = pred->view("blk.0.fc1.weight").ne[1];
  } else if (m.layers[0].ffn.fc1.valid()) {
    sum.predictor_rank = m.layers[0].ffn.fc1.rows();
  } else {
    log_warn("prepare: no predictor (--predictor, or fc1/fc2 in the model): PowerInfer cannot load the result; Ember "
             "runs it dense or in oracle mode");
  }

  return pred;
}

// The output's metadata: the model's, PowerInfer's threshold, the activation where the
// architecture has a key for it, the predictor's input, the thresholds and the permutation.
void write_metadata(gguf::Writer& w, const Model& m, const PrepareOptions& o, const gguf::Reader* pred,
                    float pred_threshold, const std::vector<std::vector<int32_t>>& perms,
                    const std::vector<float>& thresholds, const std::vector<float>& freq,
                    std::optional<DType> bundle_type) {
  const gguf::Reader& mr = *m.file;
  const Hparams& hp = m.hp;
  const int64_t L = hp.n_layer, n_ff = hp.n_ff;
  for (const std::string& k : mr.keys()) {
    if (k.rfind("ember.sparse.", 0) == 0 || k == "powerinfer.sparse_threshold") continue;  // written below
    w.set(k, mr.metadata().at(k));
  }
  w.set("powerinfer.sparse_threshold", gguf::Value::f32(pred_threshold));
  // A PWRI file of an architecture with several activations is ReLU without its activation key
  // (PowerInfer's reading; ArchSynth::activation_key); a plain GGUF one is not. Say which the
  // model is, or a SwiGLU model (SmolLM2) comes back as ReLU.
  if (const Architecture* a = find_architecture(hp.arch); a && a->synth->activation_key)
    w.set(hp.arch + ".ffn_activation", gguf::Value::str(ffn_activation_name(ffn_activation_of(hp.act))));
  // The embedded predictor keeps the input convention it was trained for.
  w.set(kPredictorInputKey,
        gguf::Value::str((pred ? predictor_reads_residual(*pred) : m.predictor_on_residual) ? "residual" : "ffn_input"));
  if (!thresholds.empty()) {
    w.set("ember.sparse.thresholds", gguf::Value::floats(thresholds));
    w.set("ember.sparse.target", gguf::Value::f32(o.sparsity));
  }
  std::vector<int32_t> flat;
  flat.reserve(static_cast<size_t>(L * n_ff));
  for (const auto& p : perms) flat.insert(flat.end(), p.begin(), p.end());
  w.set("ember.sparse.permutation", gguf::Value::ints(flat));
  w.set(kNeuronFreqKey, gguf::Value::floats(freq));
  if (bundle_type) w.set(kFfnBundleTypeKey, gguf::Value::str(std::string(dtype_name(*bundle_type))));
  w.set("ember.sparse.profile", gguf::Value::str(std::filesystem::path(o.profile).filename().string()));

}

// Every tensor of the model into w (lazily, written by w.write): the layers' FFN rows permuted hot
// first, down as the neuron-major down_t of sum.down_t_type, the --predictor file's fc1/fc2 in
// place of the model's; progress after each layer's last tensor.
void add_tensors(gguf::Writer& w, const Model& m, const gguf::Reader* pred, const std::vector<std::vector<int32_t>>& perms,
                 const PrepareSummary& sum, ThreadPool& pool, const PrepareProgress& progress) {
  const gguf::Reader& mr = *m.file;
  const int64_t L = m.hp.n_layer, n_ff = m.hp.n_ff, d = m.hp.n_embd;
  const bool from_down = sum.down_t_from_down;
  const DType down_t_type = sum.down_t_type;
  auto last_of_layer = std::make_shared<std::vector<std::string>>(static_cast<size_t>(L));
  for (const gguf::TensorInfo& t : mr.tensors()) {
    const TensorView v = mr.view(t);
    std::string rest;
    const int64_t il = layer_of(t.name, rest);
    if (il < 0 || il >= L) {
      gguf::add_tensor_copy(w, mr, t);
      continue;
    }
    const std::vector<int32_t>* perm = &perms[il];
    std::string name = t.name;
    std::vector<int64_t> ne = shape_of(t);
    DType type = t.type;
    gguf::Writer::Producer make;
    const bool bundled_part = rest == "ffn_gate.weight" || rest == "ffn_up.weight" || rest == "ffn_down.weight" ||
                              rest == "ffn_down_t.weight";
    if (sum.bundle && bundled_part) {
      if (rest != "ffn_gate.weight") continue;  // in the bundle, written where the gate was
      name = fmt::format("blk.{}.ffn_bundle.weight", il);
      const size_t stride = bundle_stride(row_bytes(down_t_type, d));
      ne = {static_cast<int64_t>(stride), n_ff};
      type = DType::I8;
      const TensorView gate = v, up = mr.view(fmt::format("blk.{}.ffn_up.weight", il));
      const TensorView down = mr.view(fmt::format("blk.{}.{}.weight", il, from_down ? "ffn_down" : "ffn_down_t"));
      make = [&pool, gate, up, down, perm, from_down, down_t_type, stride] {
        cpu::NeuronMajorMatrix nm;
        if (from_down) nm = cpu::make_neuron_major(pool, down, down_t_type);
        return permute_bundle({gate, up, from_down ? nm.view : down}, *perm, stride);
      };
    } else if (rest == "ffn_gate.weight" || rest == "ffn_up.weight" || rest == "ffn_up.bias" ||
               rest == "ffn_gate.bias" || rest == "ffn_down_t.weight" || rest == "ffn_bundle.weight") {
      make = [v, perm] { return permute_rows(v, *perm); };
    } else if (rest == "ffn_down.weight") {
      if (!from_down) continue;  // the model's own down_t (permuted) replaces it
      name = fmt::format("blk.{}.ffn_down_t.weight", il);
      ne = {d, n_ff};
      type = down_t_type;
      make = [&pool, v, perm, down_t_type] { return neuron_major_permuted(pool, v, down_t_type, *perm); };
    } else if (rest == "ffn_down.bias") {
      name = fmt::format("blk.{}.ffn_down_t.bias", il);  // PowerInfer's converter renames it too
      make = [v] { return copy_of(v); };
    } else if (rest == "fc1.weight" || rest == "fc2.weight") {
      if (pred) continue;  // replaced by the --predictor file's
      if (rest == "fc2.weight") make = [v, perm] { return permute_rows(v, *perm); };
      else make = [v] { return copy_of(v); };
    } else {
      make = [v] { return copy_of(v); };
    }
    (*last_of_layer)[il] = name;
    // Progress after each layer's last tensor.
    w.add_tensor_lazy(name, type, ne, [make, name, il, L, last_of_layer, &progress] {
                        auto b = make();
                        if (progress && (*last_of_layer)[il] == name) progress(il + 1, L);
                        return b;
                      });
  }
  if (pred) {
    for (int64_t il = 0; il < L; ++il) {
      const TensorView f1 = pred->view(fmt::format("blk.{}.fc1.weight", il));
      const TensorView f2 = pred->view(fmt::format("blk.{}.fc2.weight", il));
      const std::vector<int32_t>* perm = &perms[il];
      w.add_tensor_lazy(fmt::format("blk.{}.fc1.weight", il), f1.type, {f1.ne[0], f1.ne[1]}, [f1] { return copy_of(f1); });
      w.add_tensor_lazy(fmt::format("blk.{}.fc2.weight", il), f2.type, {f2.ne[0], f2.ne[1]},
                        [f2, perm] { return permute_rows(f2, *perm); });
    }
  }
}

}  // namespace

PrepareSummary prepare_sparse_model(const PrepareOptions& o, const PrepareProgress& progress) {
  EMBER_CHECK(!o.model.empty() && !o.profile.empty() && !o.output.empty(), "prepare: -m, --profile and -o are required");
  EMBER_CHECK(std::filesystem::absolute(o.output) != std::filesystem::absolute(o.model),
              "prepare: the output '{}' would overwrite the model", o.output);
  auto model = load_model(o.model);
  const std::string moe = model_moe_refusal(*model, "ember prepare");
  EMBER_CHECK(moe.empty(), "{}: {}", o.model, moe);
  const Hparams& hp = model->hp;
  const int64_t L = hp.n_layer, n_ff = hp.n_ff, d = hp.n_embd;
  PrepareSummary sum;
  sum.n_layer = L;
  sum.n_ff = n_ff;
  std::vector<float> freq;
  const std::vector<std::vector<int32_t>> perms = profile_order(o, L, n_ff, sum, freq);
  float pred_threshold = 0.0f;
  const std::unique_ptr<gguf::Reader> pred = open_predictor(o, *model, sum, &pred_threshold);
  const bool from_down = !model->layers[0].ffn.down_t.valid();
  sum.down_t_from_down = from_down;
  sum.down_t_type = from_down ? pick_down_t_type(o.down_type, model->layers[0].ffn.down.type, d, o.model)
                              : model->layers[0].ffn.down_t.type;
  // A bundled input stays bundled (its ffn_bundle rows are permuted as one tensor).
  const bool in_bundled = !model->layers[0].ffn.up.contiguous();
  if (o.bundle && !in_bundled) check_bundle(*model, sum.down_t_type, o.model);
  sum.bundle = o.bundle || in_bundled;
  if (!sum.bundle && sum.down_t_type != DType::F16 && sum.down_t_type != DType::Q4_0)
    log_warn("prepare: ffn_down_t is {}; PowerInfer's CPU kernels read it only as F16 or Q4_0 (Ember runs any)",
             dtype_name(sum.down_t_type));

  // Bundles that begin pages need tensors that begin pages.
  gguf::Writer w(sum.bundle ? std::max<size_t>(model->file->alignment(), 4096) : model->file->alignment());
  w.set_powerinfer_magic(true);
  write_metadata(w, *model, o, pred.get(), pred_threshold, perms, sum.thresholds, freq,
                 sum.bundle ? std::optional<DType>(sum.down_t_type) : std::nullopt);
  const int n_threads = o.n_threads > 0 ? o.n_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(n_threads);  // the lazy producers' (they run in w.write)
  add_tensors(w, *model, pred.get(), perms, sum, pool, progress);
  w.write(o.output);
  sum.bytes = std::filesystem::file_size(o.output);
  return sum;
}

}  // namespace ember
