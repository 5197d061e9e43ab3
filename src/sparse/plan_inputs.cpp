// What a plan is made from: the model's shapes and byte counts, activation profiles, the
// number of sequences, byte sizes given on the command line (sparse/plan.hpp).
#include "sparse/plan.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "core/error.hpp"
#include "core/log.hpp"
#include "model/kv_cache.hpp"
#include "model/moe.hpp"
#include "synth/synth.hpp"
#include "ops/cpu/nm4/nm4.hpp"
#include "sparse/predictor.hpp"
#include "sparse/profile.hpp"

namespace ember {
// ---- inputs -------------------------------------------------------------------------------

std::vector<std::vector<float>> read_profile_probabilities(const std::string& path, int64_t n_layer, int64_t n_ff) {
  gguf::Reader r(path);
  EMBER_CHECK(r.opt_string("general.architecture").value_or("") == "ember-profile",
              "{} is not an activation profile (general.architecture is not 'ember-profile'); make one with "
              "`ember profile`",
              path);
  const int64_t nl = r.get_int("ember.profile.n_layer"), nf = r.get_int("ember.profile.n_ff");
  const int64_t nt = r.get_int("ember.profile.n_tokens");
  EMBER_CHECK(nl == n_layer && nf == n_ff, "profile {} is for {} layers x {} neurons, the model has {} x {}", path, nl,
              nf, n_layer, n_ff);
  EMBER_CHECK(nt > 0, "profile {} counts no tokens", path);
  std::vector<std::vector<float>> p(static_cast<size_t>(n_layer));
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string name = fmt::format("blk.{}.ffn_act_count", l);
    TensorView v = r.view(name);
    EMBER_CHECK(v.data && v.type == DType::F32 && v.ne[0] == n_ff && v.rows() == 1,
                "profile {}: tensor {} is missing or not F32 [{}]", path, name, n_ff);
    const float* c = reinterpret_cast<const float*>(v.data);
    auto& out = p[static_cast<size_t>(l)];
    out.resize(static_cast<size_t>(n_ff));
    for (int64_t j = 0; j < n_ff; ++j) {
      EMBER_CHECK(std::isfinite(c[j]) && c[j] >= 0 && c[j] <= static_cast<double>(nt),
                  "profile {}: {}[{}] = {} is not a count in [0, n_tokens = {}]", path, name, j, c[j], nt);
      out[static_cast<size_t>(j)] = static_cast<float>(c[j] / static_cast<double>(nt));
    }
  }
  return p;
}

std::vector<std::vector<float>> synth_profile_probabilities(const Model& model) {
  const gguf::Reader& r = *model.file;
  auto sp = r.opt_float("ember.synth.sparsity");
  if (!sp || *sp <= 0) return {};
  SynthOptions o;
  o.n_ff = model.hp.n_ff;
  o.act = FfnActivation::relu;  // synth writes a profile for ReLU models only
  o.sparsity = static_cast<float>(*sp);
  o.zipf = static_cast<float>(r.opt_float("ember.synth.zipf").value_or(1.1));
  o.seed = static_cast<uint64_t>(r.opt_int("ember.synth.seed").value_or(1));
  std::vector<std::vector<float>> p;
  for (int64_t l = 0; l < model.hp.n_layer; ++l) p.push_back(synth_firing_probabilities(o, l));
  return p;
}

int64_t plan_units(const Model& model, size_t layer) {
  const LayerWeights& L = model.layers[layer];
  return L.moe.valid() ? L.moe.n_expert() : model.hp.n_ff;
}

std::vector<std::vector<float>> plan_probabilities(const Model& model, const std::string& profile_path,
                                                   std::string* source) {
  const int64_t nl = model.hp.n_layer, nf = model.hp.n_ff;
  std::string src = profile_path;
  std::vector<std::vector<float>> p;
  if (model_has_moe(model)) {
    std::filesystem::path beside(model.file->path());
    beside.replace_extension(".profile.gguf");
    if (src.empty() && std::filesystem::exists(beside)) src = beside.string();
    if (!src.empty()) {
      p = profile_routing_shares(read_profile(src), model, src);
    } else {  // every expert as likely: the order of placement is the experts' order
      src = "uniform routing (no profile)";
      log_info("placement: no profile of {} ({}); every expert counted as equally likely: `ember profile` it to place "
               "the hot experts", model.file->path(), beside.string());
      for (size_t l = 0; l < model.layers.size(); ++l) {
        const MoeWeights& moe = model.layers[l].moe;
        p.emplace_back(static_cast<size_t>(plan_units(model, l)),
                       static_cast<float>(static_cast<double>(moe.n_used) / static_cast<double>(moe.n_expert())));
      }
    }
    if (source) *source = src;
    return p;
  }
  if (!profile_path.empty()) {
    p = read_profile_probabilities(profile_path, nl, nf);
  } else if (p = synth_profile_probabilities(model); !p.empty()) {
    src = "synth profile";
  } else {
    std::filesystem::path beside(model.file->path());
    beside.replace_extension(".profile.gguf");
    EMBER_CHECK(std::filesystem::exists(beside),
                "placement needs an activation profile of {}: pass --profile FILE, or make {} with `ember profile`",
                model.file->path(), beside.string());
    src = beside.string();
    p = read_profile_probabilities(src, nl, nf);
  }
  if (source) *source = src;
  return p;
}

namespace {

uint64_t padded(const TensorView& v) { return v.data ? gpu_pad(v.nbytes) : 0; }

// PlanLayer::cpu_down_row: the CPU's down bytes per firing neuron with the whole layer there (in
// bytes of the row-wise kernels' time: the cost model reads them at the CPU's bandwidth).
uint64_t cpu_down_row_bytes(const FfnWeights& w, int64_t n_embd, cpu::NeuronMajorType choice, const std::vector<float>& p) {
  std::vector<int32_t> all(p.size());
  std::iota(all.begin(), all.end(), 0);
  const DType t = hybrid_cpu_down_type(w, n_embd, choice, p, all);
  const double mass = std::accumulate(p.begin(), p.end(), 0.0);
  if (!cpu::is_nm4(t) || mass <= 0) return cpu::neuron_major_row_bytes(t, n_embd);
  return static_cast<uint64_t>(std::llround(neuron_major_expected_cost(t, n_embd, p, all) / mass));
}

PlanModel base_shape(const std::string& name, int64_t n_embd, int64_t n_ff, int64_t n_head, int64_t q_dim,
                     int64_t kv_dim, int64_t n_ctx, const std::vector<std::vector<float>>& p, size_t n_layer,
                     DType kv_type) {
  EMBER_CHECK(p.size() == n_layer, "plan: {} layers of firing probabilities for a model of {} layers", p.size(),
              n_layer);
  PlanModel m;
  m.name = name;
  m.n_embd = n_embd, m.n_ff = n_ff, m.n_head = n_head, m.q_dim = q_dim, m.kv_dim = kv_dim, m.n_ctx = n_ctx;
  m.layers.resize(n_layer);
  for (size_t l = 0; l < n_layer; ++l) {
    m.layers[l].p = p[l];
    m.layers[l].kv_bytes = KvCache::bytes_for(1, n_ctx, kv_dim, kv_type);  // what the cache allocates
  }
  return m;
}

}  // namespace

double neuron_major_expected_bytes(DType t, int64_t n_embd, const std::vector<float>& p,
                                   const std::vector<int32_t>& ids) {
  const bool nm4 = cpu::is_nm4(t);
  const double row = nm4 ? static_cast<double>(n_embd) / 2 : static_cast<double>(row_bytes(t, n_embd));
  const double table = nm4 ? static_cast<double>(cpu::nm4_table_bytes(t, cpu::kNm4Block, n_embd)) : 0.0;
  double bytes = 0, silent = 1;  // silent: the chance that no neuron of the current block fires
  int64_t block = -1;
  for (int32_t j : ids) {  // ascending
    const double pj = p[static_cast<size_t>(j)];
    bytes += pj * row;
    if (j / cpu::kNm4Block != block) bytes += (1 - silent) * table, silent = 1, block = j / cpu::kNm4Block;
    silent *= 1 - pj;
  }
  return bytes + (1 - silent) * table;
}

double neuron_major_expected_cost(DType t, int64_t n_embd, const std::vector<float>& p,
                                  const std::vector<int32_t>& ids) {
  return neuron_major_expected_bytes(t, n_embd, p, ids) / (cpu::is_nm4(t) ? kNm4AxpyRate : 1.0);
}

DType hybrid_cpu_down_type(const FfnWeights& w, int64_t n_embd, cpu::NeuronMajorType choice,
                           const std::vector<float>& p, const std::vector<int32_t>& ids) {
  if (w.down_t.data) return w.down_t.type;
  const DType shared = cpu::neuron_major_dtype(w.down.type, choice, n_embd, /*shared_scales=*/true);
  const DType rows = cpu::neuron_major_dtype(w.down.type, choice, n_embd);
  if (shared == rows) return rows;
  return neuron_major_expected_cost(shared, n_embd, p, ids) <= neuron_major_expected_cost(rows, n_embd, p, ids)
             ? shared
             : rows;
}

PlanModel plan_model_from(const Model& model, const std::vector<std::vector<float>>& p, int64_t n_ctx, DType kv_type,
                          bool predictors, cpu::NeuronMajorType cpu_down, int64_t n_seq) {
  const Hparams& hp = model.hp;
  const bool experts = model_has_moe(model);
  EMBER_CHECK(p.size() == model.layers.size(), "plan: {} layers of probabilities for a model of {} layers", p.size(),
              model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const MoeWeights& moe = model.layers[l].moe;
    EMBER_CHECK(moe.valid() == experts, "plan: layer {} is {} where layer 0 is {}: models that mix dense and expert "
                "layers are not placed yet", l, moe.valid() ? "a mixture" : "dense", experts ? "a mixture" : "dense");
    if (!moe.valid()) continue;
    EMBER_CHECK(!predictors, "plan: a mixture of experts runs no predictors");
    const std::string why = moe_split_refusal(moe);
    EMBER_CHECK(why.empty(), "plan: layer {}'s experts cannot be placed: {}", l, why);
    EMBER_CHECK(static_cast<int64_t>(p[l].size()) == moe.n_expert(), "plan: layer {} has {} routing probabilities for {} "
                "experts", l, p[l].size(), moe.n_expert());
  }
  EMBER_CHECK(n_ctx >= 1, "plan: context size must be positive, got {}", n_ctx);
  n_ctx = std::min(n_ctx, hp.n_ctx_train);
  PlanModel m = base_shape(std::filesystem::path(model.file->path()).filename().string(), hp.n_embd, hp.n_ff, hp.n_head,
                           hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, n_ctx, p, model.layers.size(), kv_type);
  m.output_bytes = model.output.nbytes;
  m.n_vocab = hp.n_vocab;
  m.output_weights_bytes = padded(model.output_norm) + padded(model.output_norm_b) + padded(model.output);
  EMBER_CHECK(!predictors || has_predictors(model), "plan: placement with predictors, but {} has none for some layer",
              model.file->path());
  m.predicted = predictors;
  set_plan_sequences(m, n_seq);
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerWeights& W = model.layers[l];
    PlanLayer& L = m.layers[l];
    // The tensors a device holding the layer's hidden state holds (LayerWeights' own list).
    L.attn_bytes = 0;
    for (const TensorView* t : W.attention_tensors()) L.attn_bytes += padded(*t);
    for (const TensorView* t : W.ffn_block_tensors()) L.attn_bytes += padded(*t);
    if (predictors) {
      L.predictor_bytes = padded(W.ffn.fc1) + padded(W.ffn.fc2);
      m.predictor_rank = std::max(m.predictor_rank, W.ffn.fc1.rows());
    }
    if (W.moe.valid()) {  // its experts, whole (moe_split_refusal: one shape and type, so one size)
      const FfnWeights& e = W.moe.experts.front();
      L.expert_p = std::move(L.p);
      L.p.clear();
      L.expert_bytes = padded(e.gate) + padded(e.up) + padded(e.down);
      L.expert_cpu_bytes = e.gate.nbytes + e.up.nbytes + e.down.nbytes;
      L.router_bytes = W.moe.router.nbytes;
      m.n_expert_used = std::max(m.n_expert_used, W.moe.n_used);
      m.n_ff_expert = std::max(m.n_ff_expert, e.n_ff());
      continue;
    }
    L.gate_row = W.ffn.gated() ? row_bytes(W.ffn.gate.type, hp.n_embd) : 0;  // OPT has no gate
    L.up_row = row_bytes(W.ffn.up.type, hp.n_embd);
    L.bias_row = W.ffn.up_b.valid() ? sizeof(float) : 0;
    L.down_row = row_bytes(hybrid_device_down_type(W.ffn, hp.n_embd), hp.n_embd);
    L.cpu_down_row = cpu_down_row_bytes(W.ffn, hp.n_embd, cpu_down, L.p);
  }
  return m;
}

void set_plan_sequences(PlanModel& m, int64_t n_seq) {
  EMBER_CHECK(n_seq >= 1 && n_seq <= 256, "plan: {} sequences (1 to 256)", n_seq);
  for (PlanLayer& L : m.layers) L.kv_bytes = L.kv_bytes / static_cast<uint64_t>(m.n_seq) * static_cast<uint64_t>(n_seq);
  m.n_seq = n_seq;
}

PlanModel plan_model_from_shapes(const std::string& name, int64_t n_embd, int64_t n_ff, int64_t n_layer,
                                 int64_t n_head, int64_t n_head_kv, int64_t n_vocab, DType type, int64_t n_ctx,
                                 const std::vector<std::vector<float>>& p, DType kv_type) {
  EMBER_CHECK(n_embd > 0 && n_ff > 0 && n_layer > 0 && n_head > 0 && n_head_kv > 0 && n_embd % n_head == 0,
              "plan: bad shape (n_embd {}, n_ff {}, n_layer {}, n_head {}, n_head_kv {})", n_embd, n_ff, n_layer, n_head,
              n_head_kv);
  const int64_t head_dim = n_embd / n_head;
  PlanModel m = base_shape(name, n_embd, n_ff, n_head, n_embd, n_head_kv * head_dim, n_ctx, p,
                           static_cast<size_t>(n_layer), kv_type);
  auto mat = [&](int64_t cols, int64_t rows) { return gpu_pad(row_bytes(type, cols) * static_cast<uint64_t>(rows)); };
  const uint64_t norm = gpu_pad(static_cast<uint64_t>(n_embd) * sizeof(float));  // attention's and the FFN's
  m.output_bytes = row_bytes(type, n_embd) * static_cast<uint64_t>(n_vocab);
  m.n_vocab = n_vocab;
  m.output_weights_bytes = norm + gpu_pad(m.output_bytes);
  for (auto& L : m.layers) {
    L.attn_bytes = 2 * norm + mat(n_embd, n_embd) + 2 * mat(n_embd, n_head_kv * head_dim) + mat(n_embd, n_embd);
    L.gate_row = L.up_row = row_bytes(type, n_embd);
    FfnWeights w;  // what a file of these shapes holds: down input-major, no down_t
    w.down.type = type;
    L.down_row = row_bytes(hybrid_device_down_type(w, n_embd), n_embd);
    L.cpu_down_row = cpu_down_row_bytes(w, n_embd, cpu::NeuronMajorType::exact, L.p);
  }
  return m;
}

uint64_t parse_byte_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string num = s.substr(0, i), unit = s.substr(i);
  double v = 0;
  try {
    size_t used = 0;
    v = num.empty() ? -1 : std::stod(num, &used);
    if (used != num.size()) v = -1;
  } catch (const std::exception&) {
    v = -1;
  }
  double mult = -1;
  static const std::pair<const char*, double> units[] = {
      {"", 1}, {"B", 1}, {"K", 1024.0}, {"KiB", 1024.0}, {"KB", 1e3}, {"M", 1048576.0}, {"MiB", 1048576.0},
      {"MB", 1e6}, {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9}, {"T", 1099511627776.0},
      {"TiB", 1099511627776.0}, {"TB", 1e12}};
  for (const auto& [u, f] : units)
    if (unit == u) mult = f;
  EMBER_CHECK(v >= 0 && mult > 0 && v * mult < 1.8e19,
              "cannot read '{}' as a size: use a number with an optional unit B, K/KiB, M/MiB, G/GiB, T/TiB (1024-based) or "
              "KB, MB, GB, TB (1000-based), e.g. 4GiB",
              s);
  return static_cast<uint64_t>(std::llround(v * mult));
}

}  // namespace ember
