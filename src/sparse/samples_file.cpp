#include "sparse/samples_file.hpp"

#include <cstring>

#include "core/error.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"

namespace ember {
namespace {

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

void write_samples_file(const std::string& path, const std::string& model_name, const std::vector<LayerSamples>& layers) {
  EMBER_CHECK(!layers.empty(), "write_samples_file: no layers");
  gguf::Writer w;
  using gguf::Value;
  w.set("general.architecture", Value::str("ember-samples"));
  w.set("ember.samples.model", Value::str(model_name));
  w.set("ember.samples.n_layer", Value::u64(layers.size()));
  w.set("ember.samples.n_embd", Value::u64(static_cast<uint64_t>(layers[0].n_embd)));
  w.set("ember.samples.n_ff", Value::u64(static_cast<uint64_t>(layers[0].n_ff)));
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerSamples& s = layers[l];
    EMBER_CHECK(s.n > 0 && s.offsets.size() == static_cast<size_t>(s.n + 1) &&
                    s.x.size() == static_cast<size_t>(s.n * s.n_embd) && s.idx.size() == s.offsets.back() &&
                    s.mass.size() == s.idx.size(),
                "write_samples_file: layer {} holds inconsistent samples", l);
    // I32 for the offsets and ids (GGUF has no unsigned tensor type; counts stay far below 2^31).
    std::vector<int32_t> offsets(s.offsets.begin(), s.offsets.end());
    w.add_tensor(fmt::format("blk.{}.samples_x", l), DType::F32, {s.n_embd, s.n}, bytes_of(s.x));
    w.add_tensor(fmt::format("blk.{}.samples_offsets", l), DType::I32, {s.n + 1}, bytes_of(offsets));
    if (!s.idx.empty()) {
      w.add_tensor(fmt::format("blk.{}.samples_ids", l), DType::I32, {static_cast<int64_t>(s.idx.size())},
                   bytes_of(s.idx));
      w.add_tensor(fmt::format("blk.{}.samples_mass", l), DType::F32, {static_cast<int64_t>(s.mass.size())},
                   bytes_of(s.mass));
    }
  }
  w.write(path);
}

std::vector<LayerSamples> read_samples_file(const std::string& path, const Hparams& hp) {
  gguf::Reader r(path);
  EMBER_CHECK(r.opt_string("general.architecture").value_or("") == "ember-samples",
              "'{}' is not a samples file (write one with `ember profile --samples`)", path);
  const int64_t n_layer = r.get_int("ember.samples.n_layer"), n_embd = r.get_int("ember.samples.n_embd"),
                n_ff = r.get_int("ember.samples.n_ff");
  EMBER_CHECK(n_layer == hp.n_layer && n_embd == hp.n_embd && n_ff == hp.n_ff,
              "'{}' holds samples of a model with {} layers, n_embd {}, n_ff {}; this one has {}, {}, {} (model {})",
              path, n_layer, n_embd, n_ff, hp.n_layer, hp.n_embd, hp.n_ff,
              r.opt_string("ember.samples.model").value_or("?"));
  std::vector<LayerSamples> out(static_cast<size_t>(n_layer));
  for (int64_t l = 0; l < n_layer; ++l) {
    LayerSamples& s = out[l];
    s.n_embd = n_embd, s.n_ff = n_ff;
    const TensorView x = r.view(fmt::format("blk.{}.samples_x", l));
    EMBER_CHECK(x.type == DType::F32 && x.cols() == n_embd && x.rows() >= 1,
                "'{}': blk.{}.samples_x must be F32 with {} columns", path, l, n_embd);
    s.n = x.rows();
    const float* xf = reinterpret_cast<const float*>(x.data);
    s.x.assign(xf, xf + s.n * n_embd);
    const TensorView off = r.view(fmt::format("blk.{}.samples_offsets", l));
    EMBER_CHECK(off.type == DType::I32 && off.n_elements() == s.n + 1,
                "'{}': blk.{}.samples_offsets must be I32 with {} entries", path, l, s.n + 1);
    const auto* o = reinterpret_cast<const int32_t*>(off.data);
    for (int64_t t = 0; t <= s.n; ++t) {
      EMBER_CHECK(o[t] >= 0 && (t == 0 ? o[t] == 0 : o[t] >= o[t - 1]) && o[t] - (t ? o[t - 1] : 0) <= n_ff,
                  "'{}': blk.{}.samples_offsets is not a valid offset list (entry {})", path, l, t);
      s.offsets.push_back(static_cast<uint32_t>(o[t]));
    }
    const int64_t nnz = o[s.n];
    if (nnz == 0) continue;
    const TensorView ids = r.view(fmt::format("blk.{}.samples_ids", l));
    const TensorView mass = r.view(fmt::format("blk.{}.samples_mass", l));
    EMBER_CHECK(ids.type == DType::I32 && ids.n_elements() == nnz && mass.type == DType::F32 && mass.n_elements() == nnz,
                "'{}': blk.{}.samples_ids / samples_mass must be I32 / F32 with {} entries", path, l, nnz);
    const auto* id = reinterpret_cast<const int32_t*>(ids.data);
    for (int64_t e = 0; e < nnz; ++e)
      EMBER_CHECK(id[e] >= 0 && id[e] < n_ff, "'{}': blk.{}.samples_ids holds neuron {} (n_ff {})", path, l, id[e], n_ff);
    s.idx.assign(id, id + nnz);
    const float* m = reinterpret_cast<const float*>(mass.data);
    s.mass.assign(m, m + nnz);
  }
  return out;
}

}  // namespace ember
