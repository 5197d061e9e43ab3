// `ember synth -o OUT.gguf [--preset P] [flags]`: writes a random-weight GGUF of any architecture Ember runs
// (see src/synth/synth.hpp). Individual flags override the preset's values.
#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "model/arch_synth.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"

namespace ember::cli {
namespace {

struct SynthArgs {
  std::string out;
  std::string preset = "tiny";
  int64_t n_embd = 0, n_ff = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_vocab = 0, n_ctx = 0, n_expert = 0,
          n_expert_used = 0;
  std::string type = "f32";
  std::string act = "silu";
  std::string arch = "llama";
  int64_t head_dim = 0;
  bool tied = false;
  uint64_t seed = 1;
  float rope_base = 0;
  int threads = 0;
  float sparsity = 0.0f, zipf = 1.1f;
  bool powerinfer = false;
  bool rope_freqs = false;
  std::string pre = "default";
  bool symbol_merges = false;
  int64_t predictor_rank = 0;
  float predictor_threshold = 0.0f;
  CLI::Option* o_act = nullptr;
  int64_t gate_rank = 0;
  float gate_noise = 0.1f;
  // Which flags were given (they override the preset).
  std::vector<std::pair<CLI::Option*, int64_t*>> dims;
  CLI::Option *o_tied = nullptr, *o_rope = nullptr;
};

void run_synth(const SynthArgs& a) {
  SynthOptions o = synth_preset(a.preset);
  int64_t* fields[] = {&o.n_embd, &o.n_ff, &o.n_layer, &o.n_head, &o.n_head_kv, &o.n_vocab, &o.n_ctx, &o.n_expert,
                       &o.n_expert_used};
  for (size_t k = 0; k < a.dims.size(); ++k)
    if (a.dims[k].first->count() > 0) *fields[k] = *a.dims[k].second;
  auto t = dtype_from_name(a.type);
  EMBER_CHECK(t.has_value(), "unknown --type '{}' (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k)", a.type);
  o.type = *t;
  o.act = parse_ffn_activation(a.act);
  o.arch = a.arch;
  // Without --act, the architecture's own activation (validate names a conflict); an
  // architecture without grouped-query attention or an output matrix of its own (OPT) gets
  // neither.
  if (find_architecture(o.arch)) {  // (validate names an unknown one)
    const SynthOptions fitted = synth_options_for(o, o.arch);
    if (a.o_act->count() == 0) o.act = fitted.act;
    o.tied = fitted.tied, o.n_head_kv = fitted.n_head_kv;  // experts stay as given (validate asks for them)
  }
  o.head_dim = a.head_dim;
  o.rope_freqs = a.rope_freqs;
  o.pre = a.pre;
  o.symbol_merges = a.symbol_merges;
  if (a.o_tied->count() > 0) o.tied = a.tied;
  o.seed = a.seed;
  if (a.o_rope->count() > 0) o.rope_base = a.rope_base;
  o.n_threads = a.threads;
  o.sparsity = a.sparsity;
  o.zipf = a.zipf;
  o.powerinfer = a.powerinfer;
  o.predictor_rank = a.predictor_rank;
  o.predictor_threshold = a.predictor_threshold;
  o.gate_rank = a.gate_rank;
  o.gate_noise = a.gate_noise;
  validate(o);
  // Fail before minutes of generation, not after.
  auto dir = std::filesystem::absolute(a.out).parent_path();
  EMBER_CHECK(std::filesystem::is_directory(dir), "cannot write '{}': directory '{}' does not exist", a.out,
              dir.string());

  fmt::print(stderr, "synth: {} {} layers, n_embd {}, n_ff {}, heads {}/{}, vocab {}, type {}, {}{}{}, ~{:.1f} MiB\n",
             o.arch, o.n_layer, o.n_embd, o.n_ff, o.n_head, o.n_head_kv, o.n_vocab, dtype_name(o.type),
             ffn_activation_name(o.act), o.tied ? ", tied" : "",
             o.powerinfer ? fmt::format(", PowerInfer layout (predictor rank {})", synth_predictor_rank(o)) : "",
             synth_file_size(o) / 1048576.0);
  Timer timer;
  const bool tty = ::isatty(STDERR_FILENO);
  gguf::Writer w = synth_model(o, [tty](int64_t done, int64_t total) {
    // On a terminal one line updated in place; in a log one line per layer.
    fmt::print(stderr, "{}synth: layer {}/{}{}", tty ? "\r" : "", done, total, tty ? "" : "\n");
    std::fflush(stderr);
  });
  fmt::print(stderr, "{}synth: writing {}\n", tty ? "\n" : "", a.out);
  w.write(a.out);
  fmt::print(stderr, "synth: wrote {} ({:.1f} MiB, {} tensors) in {:.1f} s\n", a.out, w.file_size() / 1048576.0,
             w.n_tensors(), timer.seconds());
}

}  // namespace

void add_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand("synth", "Write a random-weight GGUF model (llama, bamboo, opt, gemma3; PowerInfer layout)");
  auto a = std::make_shared<SynthArgs>();
  cmd->add_option("-o,--output", a->out, "Output GGUF file")->required();
  std::string presets;
  for (const auto& n : synth_preset_names()) presets += (presets.empty() ? "" : "|") + n;
  cmd->add_option("--preset", a->preset, "Shape preset: " + presets)->capture_default_str();
  struct Dim {
    const char* flag;
    int64_t* field;
    const char* help;
  };
  const Dim dims[] = {
      {"--n-embd", &a->n_embd, "Embedding width"},
      {"--n-ff", &a->n_ff, "FFN hidden width"},
      {"--n-layer", &a->n_layer, "Number of transformer blocks"},
      {"--n-head", &a->n_head, "Attention heads"},
      {"--n-head-kv", &a->n_head_kv, "Key/value heads (grouped-query attention)"},
      {"--n-vocab", &a->n_vocab, "Vocabulary size (at least 260)"},
      {"--ctx", &a->n_ctx, "Context length written to the metadata"},
      {"--n-expert", &a->n_expert, "Experts per layer (a mixture of experts: llama as Mixtral, qwen3moe; 0: dense)"},
      {"--n-expert-used", &a->n_expert_used, "Experts chosen per token"},
  };
  for (const auto& d : dims) a->dims.push_back({cmd->add_option(d.flag, *d.field, d.help), d.field});
  cmd->add_option("--type", a->type, "Type of the 2-D weights: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k")
                  ->capture_default_str();
  a->o_act = cmd->add_option("--act", a->act, "FFN activation: silu or relu (bamboo, opt: relu; falcon: gelu or relu)")->capture_default_str();
  cmd->add_option("--arch", a->arch, "Architecture: " + architecture_names())->capture_default_str();
  cmd->add_flag("--powerinfer", a->powerinfer,
                "PowerInfer's layout: PWRI magic, ffn_down_t instead of ffn_down, predictor fc1/fc2, "
                "powerinfer.sparse_threshold");
  cmd->add_option("--predictor-rank", a->predictor_rank, "Rank of the --powerinfer predictor (0: n_embd/8)")
      ->capture_default_str();
  cmd->add_option("--predictor-threshold", a->predictor_threshold, "powerinfer.sparse_threshold of --powerinfer")
      ->capture_default_str();
  cmd->add_option("--head-dim", a->head_dim, "Head size (gemma3, qwen3, qwen3moe; 0: n_embd / n_head)")->capture_default_str();
  a->o_tied = cmd->add_flag("--tied,!--untied", a->tied, "Share token_embd as the output projection");
  cmd->add_option("--seed", a->seed, "Random seed")->capture_default_str();
  a->o_rope = cmd->add_option("--rope-base", a->rope_base, "RoPE frequency base (default: the preset's)");
  cmd->add_option("--pre", a->pre,
                  "tokenizer.ggml.pre (default, llama-bpe, qwen2, falcon, gpt-2, smollm, ...)")
      ->capture_default_str();
  cmd->add_flag("--symbol-merges", a->symbol_merges,
                "The vocabulary also merges digits, whitespace and punctuation (pre-tokenizer splits then show)");
  cmd->add_flag("--rope-freqs", a->rope_freqs, "llama: Llama-3.1's RoPE frequency factors (rope_freqs.weight)");
  cmd->add_option("--sparsity", a->sparsity,
                  "ReLU activation profile: mean fraction of inactive FFN neurons on random inputs (0: off)")
      ->capture_default_str();
  cmd->add_option("--zipf", a->zipf, "Power-law exponent of the per-neuron firing probabilities")->capture_default_str();
  cmd->add_option("--gate-rank", a->gate_rank,
                  "Predictable firing: gate rows from this many shared directions per layer (0: fully random)")
      ->capture_default_str();
  cmd->add_option("--gate-noise", a->gate_noise, "With --gate-rank: fraction of each gate row's variance that is noise")
      ->capture_default_str();
  cmd->add_option("-t,--threads", a->threads, "Threads (0: all)")->capture_default_str();
  cmd->callback([a] { run_synth(*a); });
}

}  // namespace ember::cli
