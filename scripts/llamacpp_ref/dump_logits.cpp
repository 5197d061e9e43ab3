// Reference logits from llama.cpp, for Ember's agreement tests (docs/agreement.md).
// Ember's own program, compiled by scripts/llamacpp_ref/make_refs.py against a llama.cpp that
// you built yourself (never part of this repository):
//
//   dump_logits MODEL.gguf KV_TYPE(f16|f32) FLASH_ATTN(auto|on|off) THREADS < sequences.txt > logits.json
//
// Each input line is "N_PROMPT t0 t1 ...": the first N_PROMPT tokens are evaluated as one
// batch (all their logits kept), every further token alone (a decode step), teacher forced.
// Output: {"n_vocab": V, "sequences": [{"n_prompt": P, "tokens": [...], "logits": [[V floats]
// per position]}]}, each sequence in a fresh KV cache.
//
//   dump_logits MODEL.gguf tokenize < strings.hex > ids.txt
//
// Each input line is a string's UTF-8 bytes in hex; each output line its token ids as llama.cpp's
// tokenizer gives them (no BOS/EOS added, special tokens not parsed), space-separated.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

bool decode(llama_context* ctx, const std::vector<llama_token>& toks, int pos0) {
  llama_batch b = llama_batch_init(static_cast<int32_t>(toks.size()), 0, 1);
  for (size_t i = 0; i < toks.size(); ++i) {
    b.token[i] = toks[i];
    b.pos[i] = pos0 + static_cast<int>(i);
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = 1;
  }
  b.n_tokens = static_cast<int32_t>(toks.size());
  const int rc = llama_decode(ctx, b);
  llama_batch_free(b);
  return rc == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[2], "tokenize") == 0) {
    llama_log_set(quiet, nullptr);
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model* model = llama_model_load_from_file(argv[1], mp);
    if (!model) return std::fprintf(stderr, "cannot load %s\n", argv[1]), 1;
    const llama_vocab* vocab = llama_model_get_vocab(model);
    std::string line;
    while (std::getline(std::cin, line)) {
      std::string text;
      for (size_t i = 0; i + 1 < line.size(); i += 2) text += static_cast<char>(std::stoi(line.substr(i, 2), nullptr, 16));
      std::vector<llama_token> ids(text.size() + 16);
      const int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                                   static_cast<int32_t>(ids.size()), false, false);
      if (n < 0) return std::fprintf(stderr, "tokenize failed\n"), 1;
      for (int i = 0; i < n; ++i) std::printf("%s%d", i ? " " : "", ids[i]);
      std::printf("\n");
    }
    llama_model_free(model);
    return 0;
  }
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL.gguf f16|f32 auto|on|off THREADS < sequences.txt\n", argv[0]);
    return 2;
  }
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  const ggml_type kv = std::strcmp(argv[2], "f32") == 0 ? GGML_TYPE_F32 : GGML_TYPE_F16;
  const llama_flash_attn_type fa = std::strcmp(argv[3], "on") == 0    ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                                   : std::strcmp(argv[3], "off") == 0 ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                                      : LLAMA_FLASH_ATTN_TYPE_AUTO;
  const int threads = std::atoi(argv[4]);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  std::printf("{\"n_vocab\": %d, \"sequences\": [", n_vocab);
  std::string line;
  bool first_seq = true;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    int n_prompt = 0;
    if (!(in >> n_prompt)) continue;
    std::vector<llama_token> toks;
    for (llama_token t; in >> t;) toks.push_back(t);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.type_k = cp.type_v = kv;
    cp.flash_attn_type = fa;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (!ctx) {
      std::fprintf(stderr, "cannot create a context\n");
      return 1;
    }
    std::printf("%s\n{\"n_prompt\": %d, \"tokens\": [", first_seq ? "" : ",", n_prompt);
    first_seq = false;
    for (size_t i = 0; i < toks.size(); ++i) std::printf("%s%d", i ? "," : "", toks[i]);
    std::printf("], \"logits\": [");
    auto emit = [&](int ith, bool first) {
      const float* l = llama_get_logits_ith(ctx, ith);
      std::printf("%s\n[", first ? "" : ",");
      for (int v = 0; v < n_vocab; ++v) std::printf("%s%.6g", v ? "," : "", l[v]);
      std::printf("]");
    };
    std::vector<llama_token> prompt(toks.begin(), toks.begin() + n_prompt);
    if (!decode(ctx, prompt, 0)) return std::fprintf(stderr, "decode failed\n"), 1;
    for (int i = 0; i < n_prompt; ++i) emit(i, i == 0);
    for (size_t p = static_cast<size_t>(n_prompt); p < toks.size(); ++p) {
      if (!decode(ctx, {toks[p]}, static_cast<int>(p))) return std::fprintf(stderr, "decode failed\n"), 1;
      emit(0, false);
    }
    std::printf("]}");
    llama_free(ctx);
  }
  std::printf("]}\n");
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
