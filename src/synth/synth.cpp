#include "synth/synth.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <numeric>
#include <thread>

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/utf8.hpp"
#include "core/log.hpp"
#include "core/thread_pool.hpp"
#include "model/model.hpp"
#include "tensor/quant.hpp"

namespace ember {
namespace {

// ---- random numbers ------------------------------------------------------------------------
// splitmix64 (Steele, Lea, Flood 2014): tiny state, good enough for weights, identical output
// on every platform. Normals are approximated by the sum of four 16-bit uniforms (Irwin-Hall,
// n = 4), scaled to unit variance: plain integer and float arithmetic, so no libm function can
// make the bytes differ between machines, and one 64-bit draw per weight keeps it fast.

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return mix64(state += 0x9e3779b97f4a7c15ULL); }
  // Roughly standard normal, bounded to +-2*sqrt(3).
  float normal() {
    uint64_t r = next();
    uint32_t sum = static_cast<uint32_t>(r & 0xffff) + static_cast<uint32_t>((r >> 16) & 0xffff) +
                   static_cast<uint32_t>((r >> 32) & 0xffff) + static_cast<uint32_t>(r >> 48);
    // mean 4 * 65535/2, variance 4 * (65536^2 - 1) / 12
    constexpr float kMean = 131070.0f;
    constexpr float kInvStd = 1.0f / 37837.2f;
    return (static_cast<float>(sum) - kMean) * kInvStd;
  }
};


// ---- tensors ---------------------------------------------------------------------------------

// What the activation profile changes in a tensor (see "Activation profile" below).
enum class Edit { none, set_col, zero_col, zero_row, gate_bias, probit_all, fc1_unit, fc2_unit };

// A tensor to generate: as the architecture describes it (model/arch_synth.hpp), and the edits
// synth's options make to its values.
struct TensorSpec : SynthTensor {
  TensorSpec(SynthTensor t) : SynthTensor(std::move(t)) {}  // NOLINT: a description is a spec without edits
  Edit edit = Edit::none;
  int64_t col = -1;   // the bias channel
  float value = 0;    // set_col: the value; gate_bias: s0 / A; probit_all, fc2_unit: the scale
  // gate_bias, fc2_unit: per-row (probit_all: per-element) probit of the firing probability
  std::shared_ptr<const std::vector<float>> z = nullptr;
  // Predictable gate (SynthOptions::gate_rank): rows are basis_rank x ne0 shared directions;
  // each row is a random combination of them plus `noise` (fraction of variance) of its own.
  std::shared_ptr<const std::vector<float>> basis = nullptr;
  int64_t basis_rank = 0;
  float noise = 0.0f;
};

std::vector<TensorSpec> specs_of(const std::vector<SynthTensor>& tensors) { return {tensors.begin(), tensors.end()}; }

// ---- activation profile ------------------------------------------------------------------------
// Llama has no bias tensors, so the per-neuron gate offsets travel through a constant input
// direction, the "bias channel" c = n_embd - 1:
//   * every token's embedding has x_c = A (its other elements have standard deviation s0);
//   * no layer writes to it (row c of attn_output and ffn_down is zero), so x_c = A in every
//     layer; no projection but the gate reads it (column c of q, k, v, up and output is zero);
//   * gate row j gets w_jc = z_j * |w_j,rest| * s0 / A, with z_j = Phi^-1(p_j).
// The ReLU neuron fires when w_j,rest . (x_rest * n) + w_jc * A * n_c > 0 (RMS norm divides both
// terms by the same positive number, so it does not matter), where n is the ffn_norm weight
// (n_c = 1). For inputs whose elements have standard deviation s0 the first term is about
// N(0, |w_j,rest|^2 s0^2), so the neuron fires with probability Phi(z_j) = p_j.
// To keep the residual stream's spread near s0 in every layer, the embedding is drawn with
// s0 = 1 and the attention and FFN output projections are scaled down by kProfileOutScale: the
// layers perturb the stream rather than dominate it (the measured sparsity per layer stays
// within a few points of the target; `ember bench -v --sparse-mode oracle` prints it).
constexpr float kProfileOutScale = 0.25f;

// exp(x) for x <= 0 with only +, *, / (no libm: the same bytes on every machine): Taylor series of
// x / 1024, then squared ten times.
double det_exp(double x) {
  const double y = x / 1024.0;
  double term = 1.0, sum = 1.0;
  for (int k = 1; k < 12; ++k) sum += (term *= y / k);
  for (int k = 0; k < 10; ++k) sum *= sum;
  return sum;
}

// Standard normal CDF (Zelen & Severo, Abramowitz-Stegun 26.2.17, |error| < 7.5e-8).
double normal_cdf(double z) {
  const double t = 1.0 / (1.0 + 0.2316419 * (z < 0 ? -z : z));
  const double poly = t * (0.319381530 + t * (-0.356563782 + t * (1.781477937 + t * (-1.821255978 + t * 1.330274429))));
  const double tail = 0.3989422804014327 * det_exp(-0.5 * z * z) * poly;
  return z < 0 ? tail : 1.0 - tail;
}

double normal_quantile(double p) {  // by bisection on normal_cdf, z in [-6, 6]
  double lo = -6.0, hi = 6.0;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (normal_cdf(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// x^-s for x >= 1 without libm: exp(-s ln x), ln by bisection on det_exp is too slow for n_ff
// calls, so ln uses the series of atanh: ln x = 2 atanh((x-1)/(x+1)) after halving into [1, 2).
double det_log(double x) {
  double r = 0.0;
  while (x >= 2.0) x *= 0.5, r += 0.6931471805599453;
  const double u = (x - 1.0) / (x + 1.0), u2 = u * u;
  double term = u, sum = 0.0;
  for (int k = 1; k < 40; k += 2) sum += term / k, term *= u2;
  return r + 2.0 * sum;
}

// The types `--type` takes, by their rows in the type table: "f32, f16, q4_0, ...".
std::string writable_types() {
  std::string s;
  for (uint32_t id = 0; id < 64; ++id)
    if (dtype_info(id) && dtype_writable(static_cast<DType>(id))) {
      std::string name(dtype_name(static_cast<DType>(id)));
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      s += (s.empty() ? "" : ", ") + name;
    }
  return s;
}

std::vector<uint8_t> generate(const TensorSpec& t, uint64_t seed, ThreadPool& pool) {
  const int64_t rows = t.ne1 > 0 ? t.ne1 : 1;
  const size_t stride = row_bytes(t.type, t.ne0);
  std::vector<uint8_t> data(stride * static_cast<size_t>(rows));
  const uint64_t tensor_seed = mix64(seed) ^ fnv1a64(t.name);
  std::vector<std::vector<float>> scratch(pool.size());
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / t.ne0);
  pool.parallel_for(rows, grain, [&](int64_t begin, int64_t end, int ith) {
    std::vector<float>& buf = scratch[ith];
    buf.resize(t.ne0);
    for (int64_t r = begin; r < end; ++r) {
      SplitMix64 rng{mix64(tensor_seed + static_cast<uint64_t>(r) * 0xd1b54a32d192ed03ULL)};
      if (t.basis) {
        // Unit-variance elements: sqrt(1 - noise) sum_r c_r b_r / sqrt(R) + sqrt(noise) e.
        const float a = std::sqrt((1.0f - t.noise) / static_cast<float>(t.basis_rank)), e = std::sqrt(t.noise);
        std::fill(buf.begin(), buf.end(), 0.0f);
        for (int64_t q = 0; q < t.basis_rank; ++q) {
          const float c = a * rng.normal();
          const float* b = t.basis->data() + q * t.ne0;
          for (int64_t k = 0; k < t.ne0; ++k) buf[k] += c * b[k];
        }
        for (int64_t k = 0; k < t.ne0; ++k) buf[k] = t.mean + t.std * (buf[k] + e * rng.normal());
      } else {
        for (int64_t k = 0; k < t.ne0; ++k) buf[k] = t.mean + t.std * rng.normal();
      }
      switch (t.edit) {
        case Edit::none: break;
        case Edit::set_col: buf[t.col] = t.value; break;
        case Edit::zero_col: buf[t.col] = 0.0f; break;
        case Edit::zero_row: if (r == t.col) std::fill(buf.begin(), buf.end(), 0.0f); break;
        case Edit::probit_all:  // a 1-D bias: element k = z_k * value
          for (int64_t k = 0; k < t.ne0; ++k) buf[k] = (*t.z)[k] * t.value;
          break;
        case Edit::fc1_unit:  // unit 0 reads only the bias channel; no other unit reads it
          if (r == 0) std::fill(buf.begin(), buf.end(), 0.0f);
          buf[t.col] = r == 0 ? t.value : 0.0f;
          break;
        case Edit::fc2_unit: buf[0] = (*t.z)[r] * t.value; break;
        case Edit::gate_bias: {
          double rest = 0;
          for (int64_t k = 0; k < t.ne0; ++k) rest += k == t.col ? 0.0 : static_cast<double>(buf[k]) * buf[k];
          buf[t.col] = static_cast<float>((*t.z)[r] * std::sqrt(rest) * t.value);
          break;
        }
      }
      quantize_row(t.type, buf.data(), data.data() + static_cast<size_t>(r) * stride, t.ne0);
    }
  });
  return data;
}

// The values `generate` draws for t (as F32), transposed (row j = column j) and encoded in
// t.type: PowerInfer's ffn_down_t holds the same matrix as ffn_down, neuron-major.
std::vector<uint8_t> synth_transposed(const TensorSpec& t, uint64_t seed, ThreadPool& pool) {
  TensorSpec f = t;
  f.type = DType::F32;
  const std::vector<uint8_t> src = generate(f, seed, pool);
  const float* m = reinterpret_cast<const float*>(src.data());
  const int64_t rows = t.ne1, cols = t.ne0;  // out: cols rows of `rows` values
  const size_t stride = row_bytes(t.type, rows);
  std::vector<uint8_t> out(stride * static_cast<size_t>(cols));
  std::vector<std::vector<float>> scratch(pool.size());
  pool.parallel_for(cols, 16, [&](int64_t begin, int64_t end, int ith) {
    std::vector<float>& buf = scratch[ith];
    buf.resize(static_cast<size_t>(rows));
    for (int64_t j = begin; j < end; ++j) {
      for (int64_t i = 0; i < rows; ++i) buf[i] = m[i * cols + j];
      quantize_row(t.type, buf.data(), out.data() + static_cast<size_t>(j) * stride, rows);
    }
  });
  return out;
}

// The architectures whose synth description passes `keep` (all without), in the table's order,
// as "a, b or c" (conj "or"; `last`, when given, goes before the last one instead).
std::string architecture_list(const char* conj, bool (*keep)(const ArchSynth&) = nullptr, const char* last = nullptr) {
  std::vector<std::string> names;
  for (const Architecture& a : architectures())
    if (!keep || keep(*a.synth)) names.push_back(a.name);
  return name_list(names, last ? std::string(last) : fmt::format(" {} ", conj));
}

// The architecture's row (validate checked that there is one).
const ArchSynth& arch_of(const SynthOptions& o) {
  const Architecture* a = find_architecture(o.arch);
  EMBER_CHECK(a != nullptr, "synth: --arch must be {}, got '{}'", architecture_list("or"), o.arch);
  return *a->synth;
}
bool profile_on(const SynthOptions& o) { return o.act == FfnActivation::relu && o.sparsity > 0.0f; }
// The embedding's spread s0 and the bias channel's value A (= s0 sqrt(n_embd): x_c as large as
// the rest of the vector together, which keeps w_jc at the scale of the other gate weights).
constexpr float kProfileEmbdStd = 1.0f;
float profile_bias_value(const SynthOptions& o) {
  return kProfileEmbdStd * std::sqrt(static_cast<float>(o.n_embd));
}

std::shared_ptr<std::vector<float>> profile_probits(const SynthOptions& o, int64_t il) {
  auto probs = synth_firing_probabilities(o, il);
  auto z = std::make_shared<std::vector<float>>(probs.size());
  for (size_t j = 0; j < probs.size(); ++j) (*z)[j] = static_cast<float>(normal_quantile(probs[j]));
  return z;
}

DType predictor_type(DType t) {  // PowerInfer's quantizer: Q4_0 in Q4_0 files, else Q5_0; F16 unquantized
  if (t == DType::Q4_0) return DType::Q4_0;
  return info(t).block_size > 1 ? DType::Q5_0 : DType::F16;
}

// blk.N.fc1 / fc2 of PowerInfer's layout (see SynthOptions::powerinfer).
std::vector<TensorSpec> predictor_specs(const SynthOptions& o, int64_t il) {
  const int64_t rank = synth_predictor_rank(o);
  const DType t = predictor_type(o.type);
  const std::string p = "blk." + std::to_string(il) + ".";
  std::vector<TensorSpec> v = specs_of({
      {p + "fc1.weight", t, o.n_embd, rank, 0.0f, 1.0f / std::sqrt(static_cast<float>(o.n_embd))},
      {p + "fc2.weight", t, rank, o.n_ff, 0.0f, 1.0f / std::sqrt(static_cast<float>(rank))},
  });
  if (profile_on(o) && arch_of(o).profile == SynthProfile::bias_channel) {
    // PowerInfer feeds the predictor the FFN's input before ffn_norm, where the bias channel
    // holds A: unit 0 = relu(x_c / A) = 1. The other units' sum has variance about
    // (rank - 1) / rank * E[relu(N(0,1))^2] = 0.5 (rank - 1) / rank.
    v[0].edit = Edit::fc1_unit, v[0].col = o.n_embd - 1, v[0].value = 1.0f / profile_bias_value(o);
    v[1].edit = Edit::fc2_unit, v[1].z = profile_probits(o, il);
    v[1].value = static_cast<float>(std::sqrt(0.5 * static_cast<double>(rank - 1) / static_cast<double>(rank)));
  }
  return v;
}

// The architecture's layer (its row, model/arch_synth.hpp), with the edits of the options that are
// the same for every architecture, each tensor found by its role: the predictable gate, the
// activation profile (the bias channel above, or OPT's up bias), PowerInfer's predictor.
std::vector<TensorSpec> layer_specs(const SynthOptions& o, int64_t il) {
  const ArchSynth& arch = arch_of(o);
  const std::vector<SynthTensor> tensors = arch.layer(o, il);
  std::vector<TensorSpec> v = specs_of(tensors);
  auto role = [&](SynthRole r) -> TensorSpec& {
    for (size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].role == r) return v[i];
    fail("synth: the {} layer has no tensor of role {} (model/arch_synth.hpp)", o.arch, static_cast<int>(r));
  };
  if (o.gate_rank > 0) {  // the gate from shared directions
    auto basis = std::make_shared<std::vector<float>>(static_cast<size_t>(o.gate_rank * o.n_embd));
    SplitMix64 rng{mix64(o.seed) ^ fnv1a64("ember.synth.gate_basis") ^ mix64(static_cast<uint64_t>(il) + 1)};
    for (float& b : *basis) b = rng.normal();
    TensorSpec& gate = role(SynthRole::gate);
    gate.basis = basis, gate.basis_rank = o.gate_rank, gate.noise = o.gate_noise;
  }
  if (profile_on(o) && arch.profile == SynthProfile::up_bias) {
    TensorSpec& b = role(SynthRole::up_bias);
    b.edit = Edit::probit_all, b.value = 1.0f, b.z = profile_probits(o, il);
  } else if (profile_on(o)) {  // the bias channel
    const int64_t c = o.n_embd - 1;
    for (SynthRole r : {SynthRole::q, SynthRole::k, SynthRole::v, SynthRole::up})  // do not read it
      role(r).edit = Edit::zero_col, role(r).col = c;
    for (SynthRole r : {SynthRole::o, SynthRole::down}) {  // nor write it
      TensorSpec& t = role(r);
      t.edit = Edit::zero_row, t.col = c, t.std *= kProfileOutScale;
    }
    TensorSpec& norm = role(SynthRole::ffn_norm);
    norm.edit = Edit::set_col, norm.col = c, norm.value = 1.0f;
    TensorSpec& gate = role(SynthRole::gate);
    gate.edit = Edit::gate_bias, gate.col = c, gate.value = kProfileEmbdStd / profile_bias_value(o);
    gate.z = profile_probits(o, il);
  }
  if (o.powerinfer)
    for (auto& t : predictor_specs(o, il)) v.push_back(t);
  return v;
}

std::vector<TensorSpec> global_specs(const SynthOptions& o) {
  const ArchSynth& arch = arch_of(o);
  const float s_embd = 1.0f / std::sqrt(static_cast<float>(o.n_embd));
  std::vector<TensorSpec> v = specs_of({
      {"token_embd.weight", o.type, o.n_embd, o.n_vocab, 0.0f, s_embd},
      {"output_norm.weight", DType::F32, o.n_embd, 0, 1.0f, 0.02f},
  });
  if (!o.tied) v.push_back(SynthTensor{"output.weight", o.type, o.n_embd, o.n_vocab, 0.0f, s_embd});
  if (arch.globals)
    for (const SynthTensor& t : arch.globals(o)) v.push_back(t);
  if (profile_on(o) && arch.profile == SynthProfile::bias_channel) {
    const int64_t c = o.n_embd - 1;
    v[0].std = kProfileEmbdStd, v[0].edit = Edit::set_col, v[0].col = c, v[0].value = profile_bias_value(o);
    if (!o.tied) v[2].edit = Edit::zero_col, v[2].col = c;  // (tied: a constant logit shift)
  }
  return v;
}

size_t spec_bytes(const TensorSpec& t) { return row_bytes(t.type, t.ne0) * static_cast<size_t>(t.ne1 > 0 ? t.ne1 : 1); }

// ---- vocabulary ----------------------------------------------------------------------------

// GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the others
// (controls, space, 0x7F-0xA0, 0xAD) map to U+0100 upwards in byte order.
std::vector<std::string> gpt2_byte_symbols() {
  std::vector<std::string> out(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    append_utf8(out[b], printable ? b : next++);
  }
  return out;
}

constexpr const char* kChatTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

}  // namespace

// ---- activation profile ------------------------------------------------------------------------

std::vector<float> synth_firing_probabilities(const SynthOptions& o, int64_t il) {
  if (!profile_on(o)) return {};
  const int64_t n = o.n_ff;
  const double target = 1.0 - o.sparsity, p_max = 0.999;
  std::vector<double> power(n);  // rank^-zipf for ranks 1..n
  for (int64_t r = 0; r < n; ++r) power[r] = det_exp(-static_cast<double>(o.zipf) * det_log(static_cast<double>(r + 1)));
  auto mean_for = [&](double c) {
    double s = 0;
    for (double x : power) s += std::min(p_max, c * x);
    return s / static_cast<double>(n);
  };
  double lo = 0.0, hi = 1.0;
  while (mean_for(hi) < target && hi < 1e30) hi *= 2.0;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (mean_for(mid) < target ? lo : hi) = mid;
  }
  const double c = 0.5 * (lo + hi);
  // Which neuron gets which rank: a random permutation per layer (hot neurons are scattered,
  // as in a real model before PowerInfer-style reordering).
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  SplitMix64 rng{mix64(o.seed) ^ fnv1a64("ember.synth.profile") ^ mix64(static_cast<uint64_t>(il) + 1)};
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % static_cast<uint64_t>(i + 1)]);
  std::vector<float> p(n);
  for (int64_t r = 0; r < n; ++r) p[perm[r]] = static_cast<float>(std::min(p_max, c * power[r]));
  return p;
}

// ---- presets, validation -------------------------------------------------------------------

const std::vector<std::string>& synth_preset_names() {
  static const std::vector<std::string> names = {"tiny", "smollm2-135m", "1.1b", "7b", "mistral-7b"};
  return names;
}

SynthOptions synth_preset(const std::string& name) {
  SynthOptions o;
  if (name == "tiny") {
    o.n_embd = 64, o.n_ff = 160, o.n_layer = 2, o.n_head = 4, o.n_head_kv = 2, o.n_vocab = 300, o.n_ctx = 2048;
  } else if (name == "smollm2-135m") {
    o.n_embd = 576, o.n_ff = 1536, o.n_layer = 30, o.n_head = 9, o.n_head_kv = 3, o.n_vocab = 49152;
    o.n_ctx = 8192, o.rope_base = 100000.0f, o.tied = true;
  } else if (name == "1.1b") {
    o.n_embd = 2048, o.n_ff = 5632, o.n_layer = 22, o.n_head = 32, o.n_head_kv = 4, o.n_vocab = 32000;
    o.n_ctx = 2048;
  } else if (name == "7b") {
    o.n_embd = 4096, o.n_ff = 11008, o.n_layer = 32, o.n_head = 32, o.n_head_kv = 32, o.n_vocab = 32000;
    o.n_ctx = 4096;
  } else if (name == "mistral-7b") {  // Mistral-7B, and PowerInfer's ReLU TurboSparse-Mistral-7B
    o.n_embd = 4096, o.n_ff = 14336, o.n_layer = 32, o.n_head = 32, o.n_head_kv = 8, o.n_vocab = 32000;
    o.n_ctx = 32768, o.rope_base = 1000000.0f;
  } else {
    std::string known;
    for (const auto& n : synth_preset_names()) known += (known.empty() ? "" : ", ") + n;
    fail("unknown synth preset '{}' (known: {})", name, known);
  }
  o.name = "ember-synth-" + name;
  return o;
}

FfnActivation synth_default_activation(const std::string& arch) {
  const Architecture* a = find_architecture(arch);
  return a ? a->synth->acts.front() : FfnActivation::silu;  // (validate names the architectures)
}

SynthOptions synth_options_for(SynthOptions o, const std::string& arch) {
  o.arch = arch;
  const ArchSynth& a = arch_of(o);
  o.act = a.acts.front();
  if (a.tied) o.tied = true;
  if (!a.grouped_kv) o.n_head_kv = o.n_head;
  if (a.experts == SynthExperts::required && o.n_expert == 0) o.n_expert = 4, o.n_expert_used = 2;
  return o;
}


void validate(const SynthOptions& o) {
  auto positive = [](const char* what, int64_t v, int64_t max) {
    EMBER_CHECK(v >= 1 && v <= max, "synth: {} must be between 1 and {}, got {}", what, max, v);
  };
  positive("n_embd", o.n_embd, int64_t{1} << 20);
  positive("n_ff", o.n_ff, int64_t{1} << 20);
  positive("n_layer", o.n_layer, 1024);
  positive("n_head", o.n_head, 4096);
  positive("n_head_kv", o.n_head_kv, 4096);
  positive("n_ctx", o.n_ctx, int64_t{1} << 24);
  EMBER_CHECK(o.n_vocab >= 260 && o.n_vocab <= (int64_t{1} << 21),
              "synth: n_vocab must be between 260 (256 bytes + 4 control tokens) and {}, got {}",
              int64_t{1} << 21, o.n_vocab);
  const std::string& a = o.arch;
  const ArchSynth& arch = arch_of(o);
  const auto takes = [&](FfnActivation act) { return std::find(arch.acts.begin(), arch.acts.end(), act) != arch.acts.end(); };
  EMBER_CHECK(o.act != FfnActivation::gelu || takes(o.act), "synth: --act gelu is for {} (gemma3 is GeGLU by itself)",
              architecture_list("or", [](const ArchSynth& s) {
                return std::find(s.acts.begin(), s.acts.end(), FfnActivation::gelu) != s.acts.end();
              }));
  EMBER_CHECK(!o.powerinfer || arch.powerinfer, "synth: PowerInfer's layout has no {} ({})", a,
              architecture_list("and", [](const ArchSynth& s) { return s.powerinfer; }, ", "));
  if (!takes(o.act)) {
    if (arch.acts.size() == 1) {
      const FfnActivation only = arch.acts.front();
      fail("synth: --arch {} is a {} architecture; use --act {}", a,
           only == FfnActivation::relu ? "ReLU" : only == FfnActivation::gelu ? "GELU" : "gated (SwiGLU or GeGLU)",
           ffn_activation_name(only));
    }
    std::vector<std::string> names;
    for (FfnActivation act : arch.acts) names.push_back(ffn_activation_name(act));
    const std::string acts = name_list(names);
    fail("synth: {}'s FFN is {}; use --act {}", a, acts, acts);
  }
  EMBER_CHECK(o.sparsity == 0.0f || arch.profile != SynthProfile::none,
              "synth: an activation profile (--sparsity) is built for {}, not {}",
              architecture_list("and", [](const ArchSynth& s) { return s.profile != SynthProfile::none; }), a);
  EMBER_CHECK(o.gate_rank == 0 || arch.gate_rank, "synth: a predictable gate (--gate-rank) needs {}",
              architecture_list("or", [](const ArchSynth& s) { return s.gate_rank; }));
  EMBER_CHECK(!o.rope_freqs || arch.rope_freqs, "synth: --rope-freqs (Llama-3's RoPE scaling) is for {}",
              architecture_list("or", [](const ArchSynth& s) { return s.rope_freqs; }));
  EMBER_CHECK(o.n_expert >= 0 && o.n_expert <= 256 && o.n_expert_used >= 0 && o.n_expert_used <= o.n_expert,
              "synth: experts: {} used of {} (0 to 256, used at most all)", o.n_expert_used, o.n_expert);
  EMBER_CHECK((o.n_expert > 0) == (o.n_expert_used > 0), "synth: a mixture of experts needs both --n-expert and --n-expert-used");
  EMBER_CHECK(o.n_expert == 0 || arch.experts != SynthExperts::none, "synth: experts are for {}, not {}",
              architecture_list("and", [](const ArchSynth& s) { return s.experts != SynthExperts::none; }), a);
  EMBER_CHECK(arch.experts != SynthExperts::required || o.n_expert > 0, "synth: {} needs --n-expert and --n-expert-used", a);
  EMBER_CHECK(o.n_expert == 0 || (o.act == FfnActivation::silu && !o.powerinfer && o.gate_rank == 0),
              "synth: experts are SwiGLU, in the plain layout, with a random gate");
  EMBER_CHECK(arch.grouped_kv || o.n_head_kv == o.n_head, "synth: {} has no grouped-query attention (n_head_kv {} != n_head {})",
              a, o.n_head_kv, o.n_head);
  EMBER_CHECK(o.predictor_rank >= 0 && o.predictor_rank <= o.n_ff, "synth: predictor rank must be 0 (default) to n_ff, got {}",
              o.predictor_rank);
  EMBER_CHECK(std::isfinite(o.predictor_threshold), "synth: predictor threshold must be finite");
  if (o.powerinfer) {
    const int64_t pbs = info(predictor_type(o.type)).block_size;
    EMBER_CHECK(synth_predictor_rank(o) % pbs == 0, "synth: predictor rank {} must be a multiple of {} ({} predictor)",
                synth_predictor_rank(o), pbs, dtype_name(predictor_type(o.type)));
  }
  EMBER_CHECK(o.head_dim == 0 || arch.head_dim, "synth: an explicit head size needs --arch {}",
              architecture_list("or", [](const ArchSynth& s) { return s.head_dim; }));
  EMBER_CHECK(o.head_dim > 0 || o.n_embd % o.n_head == 0, "synth: n_head ({}) must divide n_embd ({})", o.n_head, o.n_embd);
  EMBER_CHECK(o.head_dim >= 0 && o.head_dim <= 4096 && synth_head_dim(o) % 2 == 0, "synth: head size {} must be even",
              synth_head_dim(o));
  EMBER_CHECK(o.sliding_window >= 1 && o.swa_period >= 1, "synth: sliding window and its period must be positive");
  EMBER_CHECK(o.n_head % o.n_head_kv == 0, "synth: n_head_kv ({}) must divide n_head ({})", o.n_head_kv, o.n_head);

  EMBER_CHECK(dtype_writable(o.type), "synth: --type {} is not supported ({})", dtype_name(o.type), writable_types());
  const int64_t bs = info(o.type).block_size;
  EMBER_CHECK(o.n_embd % bs == 0, "synth: type {} needs n_embd to be a multiple of its block size {}, got {}",
              dtype_name(o.type), bs, o.n_embd);
  EMBER_CHECK(o.n_ff % bs == 0, "synth: type {} needs n_ff to be a multiple of its block size {}, got {}",
              dtype_name(o.type), bs, o.n_ff);
  EMBER_CHECK(o.n_head * synth_head_dim(o) % bs == 0, "synth: type {} needs n_head * head size to be a multiple of {}",
              dtype_name(o.type), bs);
  EMBER_CHECK(std::isfinite(o.rope_base) && o.rope_base > 0, "synth: rope base must be positive, got {}", o.rope_base);
  EMBER_CHECK(std::isfinite(o.rms_eps) && o.rms_eps > 0, "synth: rms epsilon must be positive, got {}", o.rms_eps);
  EMBER_CHECK(o.sparsity == 0.0f || (o.sparsity >= 0.01f && o.sparsity <= 0.999f),
              "synth: sparsity must be 0 (off) or between 0.01 and 0.999, got {}", o.sparsity);
  EMBER_CHECK(o.sparsity == 0.0f || o.act == FfnActivation::relu,
              "synth: an activation profile (sparsity {}) needs --act relu", o.sparsity);
  EMBER_CHECK(std::isfinite(o.zipf) && o.zipf >= 0.0f && o.zipf <= 4.0f, "synth: zipf exponent must be 0 to 4, got {}",
              o.zipf);
  EMBER_CHECK(o.gate_rank >= 0 && o.gate_rank <= o.n_embd, "synth: gate rank must be 0 (off) to n_embd ({}), got {}",
              o.n_embd, o.gate_rank);
  EMBER_CHECK(std::isfinite(o.gate_noise) && o.gate_noise >= 0.0f && o.gate_noise <= 1.0f,
              "synth: gate noise must be between 0 and 1, got {}", o.gate_noise);
  EMBER_CHECK(o.n_threads >= 0 && o.n_threads <= 1024, "synth: thread count must be 0 to 1024, got {}", o.n_threads);
}

int64_t synth_predictor_rank(const SynthOptions& o) {
  if (o.predictor_rank > 0) return o.predictor_rank;
  return std::max<int64_t>(32, (o.n_embd / 8 + 31) / 32 * 32);
}

// ---- vocabulary ----------------------------------------------------------------------------

SynthVocab synth_vocab(int64_t n_vocab, bool symbol_merges) {
  EMBER_CHECK(n_vocab >= 260, "synth: n_vocab must be at least 260, got {}", n_vocab);
  SynthVocab v;
  v.tokens = gpt2_byte_symbols();
  v.token_types.assign(256, 1);
  v.bos_id = 256;
  v.eos_id = 257;
  for (const char* s : {"<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(s);
    v.token_types.push_back(3);
  }
  if (symbol_merges) {
    std::vector<std::string> sym;
    const std::vector<std::string> bytes = gpt2_byte_symbols();
    for (unsigned char c : std::string("0123456789 \n\t.,!?'`$()-_:;\"")) sym.push_back(bytes[c]);
    for (const std::string& a : sym)
      for (const std::string& b : sym) {
        if (static_cast<int64_t>(v.tokens.size()) >= n_vocab) break;
        v.tokens.push_back(a + b);
        v.token_types.push_back(1);
        v.merges.push_back(a + " " + b);
      }
  }
  // Merged tokens, level by level: level 2 pairs a word-start marker (GPT-2's 'Ġ', the space
  // byte) or a letter with a letter; each further level appends a letter to a token of the
  // previous level. Within a level, pairs are taken along anti-diagonals of (rank of left,
  // rank of right) with letters in English frequency order, so frequent combinations ("Ġt",
  // "th", "he", "Ġth", ...) come first and get the lowest merge ranks.
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
  std::vector<std::string> right;
  for (char c : letters) right.push_back(std::string(1, c));
  std::vector<std::string> left = {v.tokens[' ']};
  left.insert(left.end(), right.begin(), right.end());
  auto full = [&] { return static_cast<int64_t>(v.tokens.size()) >= n_vocab; };
  while (!full()) {
    std::vector<std::string> made;
    const int64_t A = static_cast<int64_t>(left.size()), B = static_cast<int64_t>(right.size());
    for (int64_t s = 0; s <= A + B - 2 && !full(); ++s) {
      for (int64_t i = std::max<int64_t>(0, s - B + 1); i <= std::min(s, A - 1) && !full(); ++i) {
        const std::string& a = left[i];
        const std::string& b = right[s - i];
        v.tokens.push_back(a + b);
        v.token_types.push_back(1);
        v.merges.push_back(a + " " + b);
        made.push_back(a + b);
      }
    }
    left = std::move(made);
  }
  return v;
}

// ---- the model -----------------------------------------------------------------------------

uint64_t synth_file_size(const SynthOptions& o) {
  uint64_t n = 0;
  auto add = [&](const TensorSpec& t) { n += (spec_bytes(t) + 31) / 32 * 32; };
  for (const auto& t : global_specs(o)) add(t);
  for (int64_t il = 0; il < o.n_layer; ++il)
    for (const auto& t : layer_specs(o, il)) add(t);
  return n + 64 * static_cast<uint64_t>(o.n_vocab) + 4096;  // plus roughly the header
}

gguf::Writer synth_model(const SynthOptions& o, const SynthProgress& progress) {
  validate(o);
  gguf::Writer w;
  w.set_powerinfer_magic(o.powerinfer);
  using gguf::Value;
  auto u32 = [](int64_t x) { return Value::u32(static_cast<uint32_t>(x)); };
  const std::string a = o.arch;
  const ArchSynth& arch = arch_of(o);
  w.set("general.architecture", Value::str(a));
  w.set("general.name", Value::str(o.name));
  w.set("general.file_type", Value::u32(static_cast<uint32_t>(info(o.type).file_type)));
  w.set("general.quantization_version", Value::u32(2));
  w.set(a + ".block_count", u32(o.n_layer));
  w.set(a + ".context_length", u32(arch.context_length ? arch.context_length(o) : o.n_ctx));
  w.set(a + ".embedding_length", u32(o.n_embd));
  w.set(a + ".feed_forward_length", u32(o.n_ff));
  w.set(a + ".attention.head_count", u32(o.n_head));
  (arch.attention_keys ? arch.attention_keys : rms_norm_keys)(w, o);
  if (o.powerinfer) w.set("powerinfer.sparse_threshold", Value::f32(o.predictor_threshold));
  if (arch.keys) arch.keys(w, o);
  if (arch.activation_key) w.set(a + ".ffn_activation", Value::str(ffn_activation_name(o.act)));
  if (o.n_expert > 0) {
    w.set(a + ".expert_count", u32(o.n_expert));
    w.set(a + ".expert_used_count", u32(o.n_expert_used));
  }
  w.set("ember.synth.seed", Value::u64(o.seed));
  if (profile_on(o)) {
    w.set("ember.synth.sparsity", Value::f32(o.sparsity));
    w.set("ember.synth.zipf", Value::f32(o.zipf));
    if (arch.profile == SynthProfile::bias_channel) w.set("ember.synth.bias_channel", Value::u32(static_cast<uint32_t>(o.n_embd - 1)));
  }
  if (o.gate_rank > 0) {
    w.set("ember.synth.gate_rank", Value::u32(static_cast<uint32_t>(o.gate_rank)));
    w.set("ember.synth.gate_noise", Value::f32(o.gate_noise));
  }

  SynthVocab vocab = synth_vocab(o.n_vocab, o.symbol_merges);
  w.set("tokenizer.ggml.model", Value::str("gpt2"));
  w.set("tokenizer.ggml.pre", Value::str(o.pre));
  w.set("tokenizer.ggml.tokens", Value::strings(vocab.tokens));
  w.set("tokenizer.ggml.token_type", Value::ints(vocab.token_types));
  w.set("tokenizer.ggml.merges", Value::strings(vocab.merges));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(static_cast<uint32_t>(vocab.bos_id)));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(vocab.eos_id)));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(false));
  w.set("tokenizer.chat_template", Value::str(kChatTemplate));

  int n_threads = o.n_threads > 0 ? o.n_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(n_threads);
  auto emit = [&](const TensorSpec& t) {
    const std::string down = "ffn_down.";
    const size_t at = t.name.find(down);
    if (o.powerinfer && at != std::string::npos) {  // PowerInfer's converter: ffn_down -> ffn_down_t
      std::string name = t.name;
      name.replace(at, down.size(), "ffn_down_t.");
      if (t.ne1 == 0) {  // the bias (OPT) keeps its values
        w.add_tensor(name, t.type, {t.ne0}, generate(t, o.seed, pool));
        return;
      }
      w.add_tensor(name, t.type, {t.ne1, t.ne0}, synth_transposed(t, o.seed, pool));
      return;
    }
    std::vector<int64_t> ne = {t.ne0};
    if (t.ne2 > 0) ne = {t.ne0, t.ne1 / t.ne2, t.ne2};
    else if (t.ne1 > 0) ne.push_back(t.ne1);
    w.add_tensor(t.name, t.type, ne, generate(t, o.seed, pool));
  };
  for (const auto& t : global_specs(o)) emit(t);
  for (int64_t il = 0; il < o.n_layer; ++il) {
    for (const auto& t : layer_specs(o, il)) emit(t);
    if (progress) progress(il + 1, o.n_layer);
  }
  return w;
}

void synth_write(const SynthOptions& o, const std::string& path, const SynthProgress& progress) {
  synth_model(o, progress).write(path);
}

}  // namespace ember
