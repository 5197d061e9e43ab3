// Plan files: writing and reading a plan in GGUF (sparse/plan.hpp).
#include "sparse/plan.hpp"

#include <cstring>

#include "core/error.hpp"
#include "gguf/writer.hpp"
#include "model/kv_cache.hpp"
#include "synth/synth.hpp"

namespace ember {
// ---- plan files ---------------------------------------------------------------------------

void write_plan(const Plan& plan, const PlanModel& m, const PlanOptions& opts, const std::string& path) {
  using gguf::Value;
  gguf::Writer w;
  w.set("general.architecture", Value::str("ember-plan"));
  w.set("ember.plan.model", Value::str(m.name));
  w.set("ember.plan.key", Value::str(plan.key));
  w.set("ember.plan.method", Value::str(plan_method_name(plan.method)));
  w.set("ember.plan.status", Value::str(plan.status));
  w.set("ember.plan.gap", Value::f64(plan.gap));
  w.set("ember.plan.solve_seconds", Value::f64(plan.solve_seconds));
  w.set("ember.plan.objective", Value::f64(plan.objective));
  w.set("ember.plan.seconds_per_token", Value::f64(plan.seconds_per_token));
  w.set("ember.plan.vram_budget", Value::u64(plan.vram_budget));
  w.set("ember.plan.gpu_bytes", Value::u64(plan.gpu_bytes));
  w.set("ember.plan.n_layer", Value::u64(plan.layers.size()));
  w.set("ember.plan.n_ff", Value::u64(static_cast<uint64_t>(m.n_ff)));
  w.set("ember.plan.n_ctx", Value::u64(static_cast<uint64_t>(m.n_ctx)));
  w.set("ember.plan.n_seq", Value::u64(static_cast<uint64_t>(m.n_seq)));
  w.set("ember.plan.group_size", Value::u64(static_cast<uint64_t>(opts.group_size)));
  w.set("ember.plan.min_gpu_neurons", Value::u64(static_cast<uint64_t>(opts.min_gpu_neurons)));
  w.set("ember.plan.max_batch", Value::u64(static_cast<uint64_t>(opts.max_batch)));
  w.set("ember.plan.scratch", Value::str(opts.scratch_name()));
  w.set("ember.plan.predicted", Value::u64(m.predicted ? 1 : 0));
  w.set("ember.plan.output_gpu", Value::u64(plan.output_gpu ? 1 : 0));
  std::vector<int32_t> attn, counts, expert_counts;
  std::vector<Value> layer_bytes;
  // GGUF has no empty tensors: no tensor means no neurons (no experts).
  auto ids_tensor = [&](const std::string& name, const std::vector<int32_t>& ids) {
    if (ids.empty()) return;
    std::vector<uint8_t> data(ids.size() * sizeof(int32_t));
    std::memcpy(data.data(), ids.data(), data.size());
    w.add_tensor(name, DType::I32, {static_cast<int64_t>(ids.size())}, std::move(data));
  };
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    const auto& P = plan.layers[l];
    attn.push_back(P.attn_gpu ? 1 : 0);
    layer_bytes.push_back(Value::u64(gpu_layer_bytes(m.layers[l], P.attn_gpu, static_cast<int64_t>(P.gpu_neurons.size()),
                                                     static_cast<int64_t>(P.gpu_experts.size()))));
    counts.push_back(static_cast<int32_t>(P.gpu_neurons.size()));
    expert_counts.push_back(static_cast<int32_t>(P.gpu_experts.size()));
    ids_tensor(fmt::format("blk.{}.gpu_neurons", l), P.gpu_neurons);
    ids_tensor(fmt::format("blk.{}.gpu_experts", l), P.gpu_experts);
  }
  w.set("ember.plan.gpu_neuron_counts", Value::ints(counts));
  w.set("ember.plan.gpu_expert_counts", Value::ints(expert_counts));
  w.set("ember.plan.attn_gpu", Value::ints(attn));
  w.set("ember.plan.layer_gpu_bytes", Value::array(gguf::ValueType::U64, std::move(layer_bytes)));
  w.write(path);
}

Plan read_plan(const std::string& path, const PlanModel& m, PlanOptions* opts_out) {
  gguf::Reader r(path);
  EMBER_CHECK(r.opt_string("general.architecture").value_or("") == "ember-plan",
              "{} is not a plan file (general.architecture is not 'ember-plan'); make one with `ember plan`", path);
  Plan plan;
  plan.method = parse_plan_method(r.get_string("ember.plan.method"));
  plan.key = r.opt_string("ember.plan.key").value_or("");
  plan.status = r.opt_string("ember.plan.status").value_or("");
  plan.gap = r.opt_float("ember.plan.gap").value_or(0);
  plan.solve_seconds = r.opt_float("ember.plan.solve_seconds").value_or(0);
  plan.vram_budget = static_cast<uint64_t>(r.get_int("ember.plan.vram_budget"));
  const int64_t nl = r.get_int("ember.plan.n_layer"), nf = r.get_int("ember.plan.n_ff");
  EMBER_CHECK(nl == static_cast<int64_t>(m.layers.size()) && nf == m.n_ff,
              "plan {} is for {} layers x {} neurons, the model has {} x {}; make a plan for this model", path, nl, nf,
              m.layers.size(), m.n_ff);
  const int64_t n_ctx = r.get_int("ember.plan.n_ctx");
  EMBER_CHECK(n_ctx == m.n_ctx, "plan {} was made for a context of {} tokens, the session uses {}; make a plan with -c {}",
              path, n_ctx, m.n_ctx, m.n_ctx);
  const int64_t n_seq = r.opt_int("ember.plan.n_seq").value_or(1);
  EMBER_CHECK(n_seq == m.n_seq, "plan {} was made for {} sequence(s) at once, the session runs {} (their KV caches are "
              "on the device); make a plan with --parallel {}", path, n_seq, m.n_seq, m.n_seq);
  const bool predicted = r.opt_int("ember.plan.predicted").value_or(0) != 0;
  EMBER_CHECK(predicted == m.predicted, "plan {} was made for an executor {} predictors, this session runs {} them; make "
              "a plan for this session (its memory and costs differ)", path, predicted ? "with" : "without",
              m.predicted ? "with" : "without");
  // The session's options (what its device holds and keeps), the plan's own sizes.
  PlanOptions opts = opts_out ? *opts_out : PlanOptions{};
  const std::string scratch = r.opt_string("ember.plan.scratch").value_or("cuda");
  EMBER_CHECK(scratch == opts.scratch_name(), "plan {} was made for the {} device, this session runs the {} device "
              "(their scratch memory differs); make a plan with `ember plan --hybrid-device {}`", path, scratch,
              opts.scratch_name(), opts.scratch_name());
  opts.group_size = r.get_int("ember.plan.group_size");
  opts.min_gpu_neurons = r.get_int("ember.plan.min_gpu_neurons");
  opts.max_batch = r.get_int("ember.plan.max_batch");
  EMBER_CHECK(opts.group_size >= 1 && opts.min_gpu_neurons >= 0 && opts.max_batch >= 1 && opts.max_batch <= 4096,
              "plan {}: bad options (group size {}, min neurons {}, batch {})", path, opts.group_size,
              opts.min_gpu_neurons, opts.max_batch);
  const auto attn = r.get_int_array("ember.plan.attn_gpu");
  const auto counts = r.get_int_array("ember.plan.gpu_neuron_counts");
  EMBER_CHECK(static_cast<int64_t>(attn.size()) == nl && static_cast<int64_t>(counts.size()) == nl,
              "plan {}: ember.plan.attn_gpu / gpu_neuron_counts have {} / {} entries, expected {}", path, attn.size(),
              counts.size(), nl);
  // Plans of dense models may lack the experts' counts.
  const auto expert_counts = r.has("ember.plan.gpu_expert_counts") ? r.get_int_array("ember.plan.gpu_expert_counts")
                                                                   : std::vector<int64_t>(static_cast<size_t>(nl), 0);
  EMBER_CHECK(static_cast<int64_t>(expert_counts.size()) == nl, "plan {}: ember.plan.gpu_expert_counts has {} entries, "
              "expected {}", path, expert_counts.size(), nl);
  plan.layers.resize(static_cast<size_t>(nl));
  plan.output_gpu = r.opt_int("ember.plan.output_gpu").value_or(0) != 0;
  // A layer's id list `what` (neurons, experts) of `count` ids below `limit`.
  auto read_ids = [&](int64_t l, const char* what, int64_t count, int64_t limit, std::vector<int32_t>& ids) {
    const std::string name = fmt::format("blk.{}.gpu_{}", l, what);
    const gguf::TensorInfo* t = r.find_tensor(name);
    if (count == 0) {
      EMBER_CHECK(!t, "plan {}: layer {} has a list of {} but a count of 0", path, l, what);
      return;
    }
    EMBER_CHECK(count > 0 && count <= limit, "plan {}: layer {} has {} GPU {} (it has {})", path, l, count, what, limit);
    EMBER_CHECK(t && t->type == DType::I32 && t->n_dims == 1 && t->ne[0] == count,
                "plan {}: tensor {} is missing or not a list of {} I32 ids", path, name, count);
    ids.resize(static_cast<size_t>(count));
    std::memcpy(ids.data(), r.view(*t).data, ids.size() * sizeof(int32_t));
  };
  for (int64_t l = 0; l < nl; ++l) {
    auto& P = plan.layers[static_cast<size_t>(l)];
    const PlanLayer& L = m.layers[static_cast<size_t>(l)];
    P.attn_gpu = attn[static_cast<size_t>(l)] != 0;
    read_ids(l, "neurons", counts[static_cast<size_t>(l)], static_cast<int64_t>(L.p.size()), P.gpu_neurons);
    read_ids(l, "experts", expert_counts[static_cast<size_t>(l)], static_cast<int64_t>(L.expert_p.size()), P.gpu_experts);
  }
  validate_plan(m, opts, plan, plan.vram_budget);
  plan.gpu_bytes = gpu_bytes(m, opts, plan);
  const uint64_t stored = static_cast<uint64_t>(r.get_int("ember.plan.gpu_bytes"));
  EMBER_CHECK(stored == plan.gpu_bytes,
              "plan {} says it needs {} bytes of GPU memory, but this model's weights give {}; it was made for other "
              "weights: make a new plan",
              path, stored, plan.gpu_bytes);
  plan.objective = r.opt_float("ember.plan.objective").value_or(0);
  plan.seconds_per_token = r.opt_float("ember.plan.seconds_per_token").value_or(0);
  if (opts_out) *opts_out = opts;
  return plan;
}

}  // namespace ember
