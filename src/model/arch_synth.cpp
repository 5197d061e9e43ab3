#include "model/arch_synth.hpp"

#include <cmath>

#include "core/enum_names.hpp"

namespace ember {

int64_t synth_head_dim(const SynthOptions& o) { return o.head_dim > 0 ? o.head_dim : o.n_embd / o.n_head; }

SynthLayerShape::SynthLayerShape(const SynthOptions& o, int64_t il)
    : prefix("blk." + std::to_string(il) + "."),
      s_embd(1.0f / std::sqrt(static_cast<float>(o.n_embd))),
      s_ff(1.0f / std::sqrt(static_cast<float>(o.n_ff))),
      nkv(o.n_head_kv * synth_head_dim(o)) {}

void rms_norm_keys(gguf::Writer& w, const SynthOptions& o) {
  const std::string& a = o.arch;
  w.set(a + ".attention.head_count_kv", gguf::Value::u32(static_cast<uint32_t>(o.n_head_kv)));
  w.set(a + ".rope.freq_base", gguf::Value::f32(o.rope_base));
  w.set(a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32(o.rms_eps));
}

namespace {
constexpr EnumName<FfnActivation> kFfnActivations[] = {
    {FfnActivation::silu, "silu"}, {FfnActivation::relu, "relu"}, {FfnActivation::gelu, "gelu"}};
}  // namespace

const char* ffn_activation_name(FfnActivation a) { return enum_name(kFfnActivations, a); }
FfnActivation ffn_activation_of(cpu::Activation a) {
  switch (a) {
    case cpu::Activation::relu: return FfnActivation::relu;
    case cpu::Activation::silu: return FfnActivation::silu;
    default: return FfnActivation::gelu;
  }
}
FfnActivation parse_ffn_activation(const std::string& s) { return parse_enum(kFfnActivations, s, "FFN activation"); }

}  // namespace ember
