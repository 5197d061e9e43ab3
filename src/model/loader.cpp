#include "model/loader.hpp"

#include <cmath>
#include <optional>
#include <vector>

#include "core/error.hpp"
#include "tensor/quant.hpp"

namespace ember {

double float_hparam(const gguf::Reader& r, const std::string& key, double fallback, double lo, double hi, bool lo_open) {
  const std::optional<double> v = r.opt_float(key);
  if (!v) return fallback;
  EMBER_CHECK(std::isfinite(*v) && (lo_open ? *v > lo : *v >= lo) && *v <= hi,
              "{}: {} is {}, which must be a finite number in {}{}, {}]; the file is corrupt or was edited", r.path(),
              key, *v, lo_open ? "(" : "[", lo, hi);
  return *v;
}

std::string LayerNames::operator()(std::string_view t, std::string_view kind) const {
  return fmt::format("blk.{}.{}.{}", il, t, kind);
}

void read_common_hparams(const gguf::Reader& r, Hparams& hp, std::string arch) {
  hp.arch = std::move(arch);
  const std::string a = hp.arch;
  auto key = [&](const char* k) { return a + "." + k; };
  hp.n_layer = r.get_int(key("block_count"));
  hp.n_embd = r.get_int(key("embedding_length"));
  hp.n_ff = r.get_int(key("feed_forward_length"));
  hp.n_head = r.get_int(key("attention.head_count"));
  hp.n_head_kv = r.opt_int(key("attention.head_count_kv")).value_or(hp.n_head);
  hp.n_ctx_train = r.opt_int(key("context_length")).value_or(2048);
  hp.norm_eps = static_cast<float>(float_hparam(r, key("attention.layer_norm_rms_epsilon"), 1e-5, 0.0, 1.0, true));
  EMBER_CHECK(hp.n_layer >= 1 && hp.n_layer <= 1024, "{}: block_count {} is out of range", r.path(), hp.n_layer);
  EMBER_CHECK(hp.n_embd >= 1 && hp.n_embd <= (1 << 20), "{}: embedding_length {} is out of range", r.path(), hp.n_embd);
  EMBER_CHECK(hp.n_ff >= 1 && hp.n_ff <= (1 << 22), "{}: feed_forward_length {} is out of range", r.path(), hp.n_ff);
  EMBER_CHECK(hp.n_head >= 1 && hp.n_head_kv >= 1 && hp.n_head % hp.n_head_kv == 0,
              "{}: head counts {} / {} (KV) are inconsistent", r.path(), hp.n_head, hp.n_head_kv);
  hp.head_dim = r.opt_int(key("attention.key_length")).value_or(hp.n_embd / hp.n_head);
  EMBER_CHECK(hp.head_dim >= 2 && hp.head_dim % 2 == 0, "{}: head size {} must be even", r.path(), hp.head_dim);
  EMBER_CHECK(hp.n_ctx_train >= 1, "{}: context_length must be positive", r.path());

  hp.rope.n_rot = static_cast<int>(r.opt_int(key("rope.dimension_count")).value_or(hp.head_dim));
  EMBER_CHECK(hp.rope.n_rot >= 2 && hp.rope.n_rot <= hp.head_dim && hp.rope.n_rot % 2 == 0,
              "{}: rope.dimension_count {} is invalid for head size {}", r.path(), hp.rope.n_rot, hp.head_dim);
  hp.rope.base = float_hparam(r, key("rope.freq_base"), 10000.0, 0.0, 1e12, true);
  std::string scaling = r.opt_string(key("rope.scaling.type")).value_or("none");
  double factor = float_hparam(r, key("rope.scaling.factor"), 0.0, 0.0, 1e6);
  if (r.opt_float(key("rope.scale_linear"))) {
    scaling = "linear";
    factor = float_hparam(r, key("rope.scale_linear"), 0.0, 0.0, 1e6);
  }
  if (scaling == "linear" && factor > 0) {
    hp.rope.linear_scale = factor;
  } else if (scaling != "none" && scaling != "linear") {
    fail("{}: rope scaling type '{}' is not supported (none, linear)", r.path(), scaling);
  }

  hp.rope.attn_factor = float_hparam(r, key("rope.scaling.attn_factor"), 1.0, 0.0, 1e3, true);

  hp.n_expert = r.opt_int(key("expert_count")).value_or(0);
  hp.n_expert_used = r.opt_int(key("expert_used_count")).value_or(0);
  EMBER_CHECK(hp.n_expert >= 0 && hp.n_expert <= 4096 && (hp.n_expert == 0 || (hp.n_expert_used >= 1 && hp.n_expert_used <= hp.n_expert)),
              "{}: expert_count {} / expert_used_count {} are inconsistent", r.path(), hp.n_expert, hp.n_expert_used);

  // The vocabulary size: explicit key, else the embedding's row count (bound later).
  hp.n_vocab = r.opt_int(key("vocab_size")).value_or(0);
}

TensorView TensorBinder::require(const std::string& name) const {
  TensorView t = r_.view(name);
  EMBER_CHECK(t.valid(), "{}: tensor '{}' is missing; the file is incomplete or not a {} model", r_.path(), name,
              hp_.arch);
  return t;
}

namespace {
// A cheap look at what a corrupt file holds: the first and last rows of t finite (all of it would
// read the whole file at load).
void check_end_rows_finite(const std::string& path, const TensorView& t) {
  std::vector<float> buf;
  for (int64_t row : {int64_t{0}, t.rows() - 1})
    EMBER_CHECK(row_finite(t.type, t.row(row), t.cols(), buf), "{}: tensor '{}' holds a value that is not finite (NaN or "
                "infinity) in row {} of {}; the file is corrupt", path, t.name, row, t.rows());
}
}  // namespace

TensorView TensorBinder::matrix(const std::string& name, int64_t in, int64_t out) const {
  TensorView t = require(name);
  EMBER_CHECK(t.ne[0] == in && t.rows() == out && t.ne[2] == 1 && t.ne[3] == 1,
              "{}: tensor '{}' has shape [{}, {}], expected [{}, {}]", r_.path(), name, t.ne[0], t.ne[1], in, out);
  EMBER_CHECK(dtype_supported(t.type), "{}: tensor '{}' has type {}, which Ember cannot compute with yet", r_.path(),
              name, dtype_name(t.type));
  check_end_rows_finite(r_.path(), t);
  return t;
}

TensorView TensorBinder::experts(const std::string& name, int64_t in, int64_t out, int64_t n_expert) const {
  TensorView t = require(name);
  EMBER_CHECK(t.ne[0] == in && t.ne[1] == out && t.ne[2] == n_expert && t.ne[3] == 1,
              "{}: tensor '{}' has shape [{}, {}, {}], expected [{}, {}, {}] (n_expert {})", r_.path(), name, t.ne[0],
              t.ne[1], t.ne[2], in, out, n_expert, n_expert);
  EMBER_CHECK(dtype_supported(t.type), "{}: tensor '{}' has type {}, which Ember cannot compute with yet", r_.path(),
              name, dtype_name(t.type));
  return t;
}

TensorView TensorBinder::norm(const std::string& name, int64_t n) const {
  TensorView t = require(name);
  EMBER_CHECK(t.n_elements() == n, "{}: tensor '{}' has {} elements, expected {}", r_.path(), name, t.n_elements(), n);
  EMBER_CHECK(t.type == DType::F32, "{}: tensor '{}' must be F32, is {}", r_.path(), name, dtype_name(t.type));
  const auto* v = reinterpret_cast<const float*>(t.data);
  for (int64_t i = 0; i < n; ++i)
    EMBER_CHECK(std::isfinite(v[i]), "{}: tensor '{}' holds a value that is not finite ({} at {}); the file is corrupt",
                r_.path(), name, v[i], i);
  return t;
}

TensorView row_range(const TensorView& t, int64_t r0, int64_t r1) {
  EMBER_CHECK(0 <= r0 && r0 <= r1 && r1 <= (t.n_dims == 1 ? t.ne[0] : t.rows()), "{}: rows [{}, {}) out of range",
              t.name, r0, r1);
  TensorView v = t;
  v.name = fmt::format("{}[{}:{}]", t.name, r0, r1);
  if (t.n_dims == 1) {  // a vector: elements
    v.ne[0] = r1 - r0;
    v.data = t.data + static_cast<size_t>(r0) * sizeof(float);
    v.nbytes = static_cast<size_t>(r1 - r0) * sizeof(float);
    return v;
  }
  v.n_dims = 2;
  v.ne[1] = r1 - r0;
  v.ne[2] = v.ne[3] = 1;
  v.data = t.data + static_cast<size_t>(r0) * t.row_stride();
  v.nbytes = static_cast<size_t>(r1 - r0) * t.row_size();
  return v;
}

void bind_attention(const TensorBinder& b, const Hparams& hp, const LayerNames& name, LayerWeights& L, AttnBiases biases) {
  const int64_t d = hp.n_embd, nq = hp.n_head * hp.head_dim, nkv = hp.n_head_kv * hp.head_dim;
  if (b.optional(name("attn_q")).valid() || !b.optional(name("attn_qkv")).valid()) {
    L.wq = b.matrix(name("attn_q"), d, nq);
    L.wk = b.matrix(name("attn_k"), d, nkv);
    L.wv = b.matrix(name("attn_v"), d, nkv);
    if (biases != AttnBiases::none) {
      L.bq = b.norm(name("attn_q", "bias"), nq);
      L.bk = b.norm(name("attn_k", "bias"), nkv);
      L.bv = b.norm(name("attn_v", "bias"), nkv);
    }
  } else {
    const TensorView qkv = b.matrix(name("attn_qkv"), d, nq + 2 * nkv);
    L.wq = row_range(qkv, 0, nq);
    L.wk = row_range(qkv, nq, nq + nkv);
    L.wv = row_range(qkv, nq + nkv, nq + 2 * nkv);
    if (biases != AttnBiases::none) {
      const TensorView bias = b.norm(name("attn_qkv", "bias"), nq + 2 * nkv);
      L.bq = row_range(bias, 0, nq);
      L.bk = row_range(bias, nq, nq + nkv);
      L.bv = row_range(bias, nq + nkv, nq + 2 * nkv);
    }
  }
  L.wo = b.matrix(name("attn_output"), nq, d);
  if (biases == AttnBiases::all) L.bo = b.norm(name("attn_output", "bias"), d);
}

namespace {

// A layer whose FFN rows are bundled by neuron (`ember prepare --bundle`): blk.il.ffn_bundle, a
// byte tensor (I8, ne = [stride, n_ff]) whose row j is neuron j's gate row, up row and
// neuron-major down row, each n_embd values of the file's kFfnBundleTypeKey, then padding.
void bind_ffn_bundle(const TensorBinder& b, const Hparams& hp, const LayerNames& name, FfnWeights& f) {
  const int64_t d = hp.n_embd;
  const std::string path = b.path(), bn = name("ffn_bundle");
  for (const char* part : {"ffn_gate", "ffn_up", "ffn_down", "ffn_down_t"})
    EMBER_CHECK(!b.optional(name(part)).valid(), "{}: layer {} has both {} and {}: a bundle holds the layer's gate, "
                "up and down rows, so no other may be given", path, name.il, bn, name(part));
  const std::optional<std::string> type_name = b.reader().opt_string(kFfnBundleTypeKey);
  const std::optional<DType> t = type_name ? dtype_from_name(*type_name) : std::nullopt;
  EMBER_CHECK(t && dtype_supported(*t) && d % info(*t).block_size == 0,
              "{}: {} needs {} to name a weight type whose blocks divide n_embd {} (it says '{}')", path, bn,
              kFfnBundleTypeKey, d, type_name.value_or(""));
  const TensorView raw = b.optional(bn);
  const size_t row = row_bytes(*t, d);
  EMBER_CHECK(raw.type == DType::I8 && raw.n_dims == 2 && raw.ne[1] == hp.n_ff &&
                  static_cast<size_t>(raw.ne[0]) >= kFfnBundleParts * row,
              "{}: {} is {} [{}, {}]; a bundle is I8 [stride >= {} (the three {} rows of n_embd {}), n_ff {}]", path,
              bn, dtype_name(raw.type), raw.ne[0], raw.ne[1], kFfnBundleParts * row, dtype_name(*t), d, hp.n_ff);
  const auto part = [&](int k, const char* what) {
    TensorView v;
    v.name = fmt::format("{}[{}]", bn, what);
    v.type = *t;
    v.n_dims = 2;
    v.ne[0] = d;
    v.ne[1] = hp.n_ff;
    v.data = raw.data + static_cast<size_t>(k) * row;
    v.stride = static_cast<size_t>(raw.ne[0]);
    v.nbytes = static_cast<size_t>(hp.n_ff) * row;
    check_end_rows_finite(path, v);
    return v;
  };
  f.gate = part(0, "gate");
  f.up = part(1, "up");
  f.down_t = part(2, "down_t");
}

}  // namespace

void bind_gated_ffn(const TensorBinder& b, const Hparams& hp, const LayerNames& name, FfnWeights& f, FfnGating gating) {
  f.norm = b.norm(name("ffn_norm"), hp.n_embd);
  f.gating = gating;
  if (b.optional(name("ffn_bundle")).valid()) {
    bind_ffn_bundle(b, hp, name, f);
    bind_ffn_predictor(b, hp, name, f);
    return;
  }
  f.gate = b.matrix(name("ffn_gate"), hp.n_embd, hp.n_ff);
  f.up = b.matrix(name("ffn_up"), hp.n_embd, hp.n_ff);
  bind_ffn_down_and_predictor(b, hp, name, f);
}

void bind_moe_ffn(const TensorBinder& b, const Hparams& hp, const LayerNames& name, LayerWeights& L, int64_t n_ff_exp) {
  const int64_t il = name.il;
  const int64_t d = hp.n_embd, ne = hp.n_expert;
  EMBER_CHECK(ne >= 1, "{}: layer {} has {} but the file declares no {}.expert_count", b.path(), il,
              name("ffn_gate_inp"), hp.arch);
  L.ffn.norm = b.norm(name("ffn_norm"), d);
  MoeWeights& moe = L.moe;
  moe.router = b.matrix(name("ffn_gate_inp"), d, ne);
  moe.n_used = hp.n_expert_used;
  moe.norm_weights = true;  // Mixtral and Qwen3-MoE renormalise the chosen experts' weights
  const TensorView gate = b.experts(name("ffn_gate_exps"), d, n_ff_exp, ne);
  const TensorView up = b.experts(name("ffn_up_exps"), d, n_ff_exp, ne);
  const TensorView down = b.experts(name("ffn_down_exps"), n_ff_exp, d, ne);
  moe.experts.resize(static_cast<size_t>(ne));
  for (int64_t e = 0; e < ne; ++e) {
    FfnWeights& f = moe.experts[static_cast<size_t>(e)];
    f.gating = FfnGating::par;
    f.gate = row_range(gate, e * n_ff_exp, (e + 1) * n_ff_exp);
    f.up = row_range(up, e * n_ff_exp, (e + 1) * n_ff_exp);
    f.down = row_range(down, e * d, (e + 1) * d);
  }
}

void bind_embeddings(const TensorBinder& b, Model& m) {
  Hparams& hp = m.hp;
  TensorView emb = b.optional("token_embd.weight");
  EMBER_CHECK(emb.valid(), "{}: tensor 'token_embd.weight' is missing", m.file->path());
  if (hp.n_vocab == 0) hp.n_vocab = emb.rows();
  m.tok_embd = b.matrix("token_embd.weight", hp.n_embd, hp.n_vocab);
  m.output_norm = b.norm("output_norm.weight", hp.n_embd);
  m.output = b.optional("output.weight").valid() ? b.matrix("output.weight", hp.n_embd, hp.n_vocab) : m.tok_embd;
}

void bind_ffn_down_and_predictor(const TensorBinder& b, const Hparams& hp, const LayerNames& name, FfnWeights& f) {
  const int64_t il = name.il;
  const std::string path = b.path();
  const bool has_down = b.optional(name("ffn_down")).valid();
  const bool has_down_t = b.optional(name("ffn_down_t")).valid();
  EMBER_CHECK(has_down || has_down_t, "{}: layer {} has neither {} nor {} (PowerInfer's neuron-major form); the file is incomplete",
              path, il, name("ffn_down"), name("ffn_down_t"));
  if (has_down) f.down = b.matrix(name("ffn_down"), hp.n_ff, hp.n_embd);
  if (has_down_t) f.down_t = b.matrix(name("ffn_down_t"), hp.n_embd, hp.n_ff);
  bind_ffn_predictor(b, hp, name, f);
}

void bind_ffn_predictor(const TensorBinder& b, const Hparams& hp, const LayerNames& name, FfnWeights& f) {
  const int64_t il = name.il;
  const std::string path = b.path();
  const TensorView fc1 = b.optional(name("fc1")), fc2 = b.optional(name("fc2"));
  EMBER_CHECK(fc1.valid() == fc2.valid(), "{}: layer {} has {} but not {}; a predictor needs both", path, il,
              fc1.valid() ? name("fc1") : name("fc2"), fc1.valid() ? name("fc2") : name("fc1"));
  if (fc1.valid()) {
    const int64_t rank = fc1.rows();
    EMBER_CHECK(fc1.ne[0] == hp.n_embd && rank >= 1 && fc1.ne[2] == 1 && fc1.ne[3] == 1,
                "{}: predictor tensor '{}' has shape [{}, {}], expected [{} (n_embd), rank]", path, name("fc1"),
                fc1.ne[0], fc1.ne[1], hp.n_embd);
    f.fc1 = b.matrix(name("fc1"), hp.n_embd, rank);
    f.fc2 = b.matrix(name("fc2"), rank, hp.n_ff);
  }
}

void read_sparse_metadata(Model& m) {
  const gguf::Reader& r = *m.file;
  // Only a file that carries its own predictor says how it reads (attach_predictors sets it for
  // a predictor file).
  m.predictor_on_residual = !m.layers.empty() && m.layers[0].ffn.fc1.valid() && predictor_reads_residual(r);
  if (auto t = r.opt_float("powerinfer.sparse_threshold")) {
    EMBER_CHECK(std::isfinite(*t), "{}: powerinfer.sparse_threshold is not a finite number", r.path());
    m.predictor_threshold = static_cast<float>(*t);
  }
  if (r.has("ember.sparse.thresholds")) {
    std::vector<float> t = r.get_float_array("ember.sparse.thresholds");
    EMBER_CHECK(static_cast<int64_t>(t.size()) == m.hp.n_layer,
                "{}: ember.sparse.thresholds has {} values, the model has {} layers", r.path(), t.size(), m.hp.n_layer);
    for (float v : t)
      EMBER_CHECK(std::isfinite(v) && v >= 0.0f, "{}: ember.sparse.thresholds holds {} (must be finite, >= 0)", r.path(), v);
    m.gate_thresholds = std::move(t);
  }
  if (r.has(kNeuronFreqKey)) {
    std::vector<float> f = r.get_float_array(kNeuronFreqKey);
    EMBER_CHECK(static_cast<int64_t>(f.size()) == m.hp.n_layer * m.hp.n_ff,
                "{}: {} has {} values, the model's {} layers of {} neurons need {}", r.path(), kNeuronFreqKey, f.size(),
                m.hp.n_layer, m.hp.n_ff, m.hp.n_layer * m.hp.n_ff);
    for (float v : f)
      EMBER_CHECK(std::isfinite(v) && v >= 0.0f, "{}: {} holds {} (must be finite, >= 0)", r.path(), kNeuronFreqKey, v);
    m.neuron_freq = std::move(f);
  }
  if (r.has("ember.input_sparsity.thresholds")) {
    const std::vector<float> t = r.get_float_array("ember.input_sparsity.thresholds");
    EMBER_CHECK(static_cast<int64_t>(t.size()) == 4 * m.hp.n_layer,
                "{}: ember.input_sparsity.thresholds has {} values, the model's {} layers need {} (4 per layer)",
                r.path(), t.size(), m.hp.n_layer, 4 * m.hp.n_layer);
    for (size_t i = 0; i < t.size(); i += 4) {
      for (size_t s = 0; s < 4; ++s)
        EMBER_CHECK(std::isfinite(t[i + s]), "{}: ember.input_sparsity.thresholds holds {} (must be finite)",
                    r.path(), t[i + s]);
      m.input_thresholds.push_back({t[i], t[i + 1], t[i + 2], t[i + 3]});
    }
  }
  if (r.has("ember.input_sparsity.sparsity")) {
    const std::vector<float> s = r.get_float_array("ember.input_sparsity.sparsity");
    EMBER_CHECK(static_cast<int64_t>(s.size()) == 4 * m.hp.n_layer && m.input_thresholds.size() * 4 == s.size(),
                "{}: ember.input_sparsity.sparsity has {} values, the model's {} layers need {} (4 per layer, beside "
                "ember.input_sparsity.thresholds)", r.path(), s.size(), m.hp.n_layer, 4 * m.hp.n_layer);
    for (size_t i = 0; i < s.size(); i += 4) {
      for (size_t k = 0; k < 4; ++k)
        EMBER_CHECK(s[i + k] >= 0.0f && s[i + k] <= 1.0f, "{}: ember.input_sparsity.sparsity holds {} (must be in "
                    "[0, 1])", r.path(), s[i + k]);
      m.input_sparsity.push_back({s[i], s[i + 1], s[i + 2], s[i + 3]});
    }
  }
}

void build_rope(Model& m) {
  TensorView f = m.file->view("rope_freqs.weight");
  if (f.valid()) {
    EMBER_CHECK(f.type == DType::F32 && f.n_elements() == m.hp.rope.n_rot / 2,
                "{}: rope_freqs.weight must be F32 with {} elements", m.file->path(), m.hp.rope.n_rot / 2);
    m.hp.rope.freq_factors.assign(as_floats(f), as_floats(f) + f.n_elements());
  }
  m.rope = std::make_unique<cpu::RopeTable>(m.hp.rope);
}

}  // namespace ember
