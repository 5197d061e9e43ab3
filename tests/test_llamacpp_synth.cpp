// Every architecture against llama.cpp on the same file: tests/data/llamacpp_synth/*.json hold
// llama.cpp's logits (scripts/llamacpp_ref/make_refs.py, llama.cpp commit in each file,
// docs/agreement.md) on `ember synth` models of each architecture and weight type (F32, F16,
// Q8_0, Q4_K), for a batched prompt followed by decode steps and for decode steps alone, teacher
// forced. The synth models are deterministic for their options (stored in the file), so the test
// writes the same model again and runs Ember on it as `ember generate` does (matrices repacked,
// F16 KV cache: llama.cpp's default too).
//
// The tolerance is llama.cpp's own: the same file once more with an F32 KV cache and without
// flash attention moves its logits by `f32_kv_no_fa_max_abs_diff`; Ember must stay within
// 1.5 times that (plus 1e-3 for F32 weights, where that difference is tiny). Top-1: identical
// at every position where llama.cpp's top two logits are further apart than that tolerance
// (closer ones are a coin toss at this rounding level; llama.cpp flips some against itself).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/session.hpp"
#include "model/model.hpp"
#include "model/repack.hpp"
#include "synth/synth.hpp"
#include "support/paths.hpp"
#include "tokenizer/tokenizer.hpp"

using namespace ember;

namespace {

// The SynthOptions of `ember synth FLAGS` (the flags make_refs.py passes).
SynthOptions synth_options(const std::vector<std::string>& flags) {
  SynthOptions o = synth_preset("tiny");
  const std::map<std::string, int64_t*> dims = {{"--n-embd", &o.n_embd}, {"--n-ff", &o.n_ff},
                                                {"--n-layer", &o.n_layer}, {"--n-head", &o.n_head},
                                                {"--n-head-kv", &o.n_head_kv}, {"--n-vocab", &o.n_vocab},
                                                {"--ctx", &o.n_ctx}, {"--head-dim", &o.head_dim},
                                                {"--n-expert", &o.n_expert}, {"--n-expert-used", &o.n_expert_used}};
  bool act_given = false;
  for (size_t i = 0; i < flags.size(); ++i) {
    const std::string& f = flags[i];
    if (f == "--tied" || f == "--rope-freqs" || f == "--symbol-merges") {
      (f == "--tied" ? o.tied : f == "--rope-freqs" ? o.rope_freqs : o.symbol_merges) = true;
      continue;
    }
    EXPECT_LT(i + 1, flags.size()) << f;
    const std::string v = flags[++i];
    if (dims.count(f)) *dims.at(f) = std::stoll(v);
    else if (f == "--seed") o.seed = std::stoull(v);
    else if (f == "--rope-base") o.rope_base = std::stof(v);
    else if (f == "--arch") o.arch = v;
    else if (f == "--type") o.type = *dtype_from_name(v);
    else if (f == "--act") o.act = parse_ffn_activation(v), act_given = true;
    else if (f == "--pre") o.pre = v;
    else if (f == "--preset") continue;  // tiny, the starting point here too
    else ADD_FAILURE() << "unknown synth flag " << f;
  }
  if (!act_given) o.act = synth_default_activation(o.arch);  // as `ember synth`
  o.n_threads = 2;
  return o;
}

struct Case {
  std::string name;
  nlohmann::json data;
};

// The data files whose name starts with `prefix` ("tokenizer_": pre-tokenizer cases, "": the rest).
std::vector<Case> cases(bool tokenizer) {
  std::vector<Case> out;
  const std::string dir = test_support::data_path("llamacpp_synth");
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    if ((e.path().stem().string().rfind("tokenizer_", 0) == 0) != tokenizer) continue;
    std::ifstream f(e.path());
    out.push_back({e.path().stem().string(), nlohmann::json::parse(f)});
  }
  std::sort(out.begin(), out.end(), [](const Case& a, const Case& b) { return a.name < b.name; });
  return out;
}

int32_t argmax(const float* l, int64_t n) { return static_cast<int32_t>(std::max_element(l, l + n) - l); }

}  // namespace

TEST(LlamaCppSynth, EveryArchitectureAndTypeAgrees) {
  const std::vector<Case> all = cases(false);
  ASSERT_GE(all.size(), 44u) << "tests/data/llamacpp_synth is incomplete";
  const auto dir = std::filesystem::temp_directory_path() / "ember-test-llamacpp-synth";
  std::filesystem::create_directories(dir);
  std::map<std::string, int> archs;
  for (const Case& c : all) {
    SCOPED_TRACE(c.name);
    const SynthOptions o = synth_options(c.data["synth"].get<std::vector<std::string>>());
    ++archs[o.n_expert > 0 ? (o.arch == "llama" ? "mixtral" : o.arch) : o.rope_freqs ? "llama3" : o.arch];
    const std::string path = (dir / (c.name + ".gguf")).string();
    synth_write(o, path);
    auto m = load_model(path);
    repack_for_dense_kernels(*m, RepackScope::all);
    if (o.arch == "phi3") {  // which LongRoPE table a 512-token session takes
      EXPECT_TRUE(m->rope_long);
      EXPECT_EQ(&m->rope_for_context(512) == m->rope_long.get(), o.n_ctx < 512) << "original context " << o.n_ctx;
    }

    const int64_t nv = c.data["n_vocab"].get<int64_t>();
    ASSERT_EQ(nv, m->hp.n_vocab);
    const double self = c.data["f32_kv_no_fa_max_abs_diff"].get<double>();
    const double tol = 1.5 * self + (o.type == DType::F32 ? 1e-3 : 0.0);
    double worst = 0;
    int positions = 0, top1_checked = 0;
    for (const auto& seq : c.data["sequences"]) {
      const auto tokens = seq["tokens"].get<std::vector<int32_t>>();
      const int64_t n_prompt = seq["n_prompt"].get<int64_t>();
      const auto ref = seq["logits"].get<std::vector<std::vector<float>>>();
      ASSERT_EQ(ref.size(), tokens.size());
      SessionParams p;
      p.n_threads = 2;
      p.n_ctx = 512;  // as the dump program's: phi3-long's context then exceeds its original 256 (long RoPE factors)
      p.kv_type = DType::F16;
      Session s(*m, p);
      std::vector<float> got(tokens.size() * static_cast<size_t>(nv));
      s.eval_all_logits(tokens.data(), n_prompt, got.data());
      for (size_t t = static_cast<size_t>(n_prompt); t < tokens.size(); ++t) {
        s.eval(&tokens[t], 1);
        std::copy(s.logits(), s.logits() + nv, got.begin() + static_cast<std::ptrdiff_t>(t * nv));
      }
      for (size_t t = 0; t < tokens.size(); ++t, ++positions) {
        const float* g = got.data() + t * nv;
        const std::vector<float>& r = ref[t];
        for (int64_t i = 0; i < nv; ++i) worst = std::max(worst, static_cast<double>(std::fabs(g[i] - r[i])));
        std::vector<float> sorted = r;
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        if (sorted[0] - sorted[1] > tol) {
          ++top1_checked;
          EXPECT_EQ(argmax(g, nv), argmax(r.data(), nv)) << "position " << t << " of a " << n_prompt << "-token prompt";
        }
      }
    }
    EXPECT_LE(worst, tol) << "llama.cpp against itself (F32 KV, no flash attention): " << self;
    std::printf("%-18s max |Ember - llama.cpp| %.4f (llama.cpp vs itself %.4f), top-1 checked at %d of %d positions\n",
                c.name.c_str(), worst, self, top1_checked, positions);
  }
  for (const char* a : {"llama", "llama3", "qwen2", "qwen3", "phi3", "falcon", "mixtral", "qwen3moe"})
    EXPECT_GE(archs[a], 4) << a;
}

// Pre-tokenizers: llama.cpp's token ids for ~300 awkward strings (unicode, digits, whitespace
// runs, code, CJK, emoji, contractions) per tokenizer.ggml.pre, on a synth vocabulary whose
// merges of digits, whitespace and punctuation make every split visible; Ember's must be
// identical on every string.
TEST(LlamaCppSynth, PreTokenizersGiveLlamaCppsIds) {
  const std::vector<Case> all = cases(true);
  ASSERT_GE(all.size(), 6u) << "tests/data/llamacpp_synth has too few tokenizer_*.json";
  const auto dir = std::filesystem::temp_directory_path() / "ember-test-llamacpp-synth";
  std::filesystem::create_directories(dir);
  for (const Case& c : all) {
    SCOPED_TRACE(c.name);
    const SynthOptions o = synth_options(c.data["synth"].get<std::vector<std::string>>());
    const std::string path = (dir / (c.name + ".gguf")).string();
    synth_write(o, path);
    gguf::Reader r(path);
    Tokenizer tok(r);
    int same = 0, total = 0;
    for (const auto& e : c.data["cases"]) {
      const std::string text = e["text"].get<std::string>();
      const auto want = e["ids"].get<std::vector<int32_t>>();
      const std::vector<int32_t> got = tok.encode(text, /*add_special=*/false, /*parse_special=*/false);
      ++total;
      if (got == want) ++same;
      else ADD_FAILURE() << "'" << text << "': " << got.size() << " tokens, llama.cpp " << want.size();
    }
    EXPECT_GE(total, 290);
    std::printf("%-22s %d of %d strings identical to llama.cpp\n", c.name.c_str(), same, total);
  }
}
