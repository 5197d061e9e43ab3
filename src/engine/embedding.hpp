// Embeddings: a text's vector from the model's final hidden states (after the output norm, what
// the head reads), pooled over its tokens as llama.cpp's --pooling does: the mean of all of them,
// the last token's (what a causal model has read the whole text by), or the first's (cls: BERT's
// convention, for files that ask for it). Clients get it L2-normalized, as OpenAI's and Ollama's
// /api/embed return it.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/model.hpp"

namespace ember {

enum class Pooling { mean, last, cls };

const char* pooling_name(Pooling p);
std::optional<Pooling> parse_pooling(const std::string& name);  // "mean", "last", "cls"
// The file's `<arch>.pooling_type` (GGUF: 1 mean, 2 cls, 3 last) where it names one of these,
// else mean.
Pooling default_pooling(const Model& model);

// Folds hidden states into a pooled vector, chunk by chunk (the engine evaluates a long text in
// several forward passes): add() takes rows [pos0, pos0 + n) of the text, result() the vector
// once all n_tokens rows went in.
class Pooler {
 public:
  Pooler(Pooling pooling, int64_t n_embd, int64_t n_tokens);
  void add(const float* rows, int64_t pos0, int64_t n);
  std::vector<float> result() const;

 private:
  Pooling pooling_;
  int64_t d_, n_tokens_, n_seen_ = 0;
  std::vector<double> acc_;
};

// v / |v|_2 (a zero vector stays zero).
void l2_normalize(std::span<float> v);

}  // namespace ember
