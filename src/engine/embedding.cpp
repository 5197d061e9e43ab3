#include "engine/embedding.hpp"

#include <cmath>
#include <cstring>

#include "core/enum_names.hpp"
#include "core/error.hpp"

namespace ember {

namespace {
constexpr EnumName<Pooling> kPoolings[] = {{Pooling::mean, "mean"}, {Pooling::last, "last"}, {Pooling::cls, "cls"}};
}  // namespace

const char* pooling_name(Pooling p) { return enum_name(kPoolings, p); }
std::optional<Pooling> parse_pooling(const std::string& name) { return find_enum(kPoolings, name); }

Pooling default_pooling(const Model& model) {
  if (!model.file) return Pooling::mean;
  const auto t = model.file->opt_int(model.hp.arch + ".pooling_type");
  if (t == 2) return Pooling::cls;
  if (t == 3) return Pooling::last;
  return Pooling::mean;
}

Pooler::Pooler(Pooling pooling, int64_t n_embd, int64_t n_tokens)
    : pooling_(pooling), d_(n_embd), n_tokens_(n_tokens), acc_(static_cast<size_t>(n_embd), 0.0) {
  EMBER_CHECK(n_embd >= 1 && n_tokens >= 1, "pooling {} tokens of {} values", n_tokens, n_embd);
}

void Pooler::add(const float* rows, int64_t pos0, int64_t n) {
  EMBER_CHECK(pos0 == n_seen_ && n >= 1 && pos0 + n <= n_tokens_, "pooling rows [{}, {}) after {} of {}", pos0,
              pos0 + n, n_seen_, n_tokens_);
  n_seen_ += n;
  const auto copy = [&](int64_t i) {
    for (int64_t j = 0; j < d_; ++j) acc_[static_cast<size_t>(j)] = rows[i * d_ + j];
  };
  switch (pooling_) {
    case Pooling::mean:
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < d_; ++j) acc_[static_cast<size_t>(j)] += rows[i * d_ + j];
      break;
    case Pooling::last:
      if (n_seen_ == n_tokens_) copy(n - 1);
      break;
    case Pooling::cls:
      if (pos0 == 0) copy(0);
      break;
  }
}

std::vector<float> Pooler::result() const {
  EMBER_CHECK(n_seen_ == n_tokens_, "pooling: {} of {} tokens seen", n_seen_, n_tokens_);
  const double scale = pooling_ == Pooling::mean ? 1.0 / static_cast<double>(n_tokens_) : 1.0;
  std::vector<float> v(static_cast<size_t>(d_));
  for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(acc_[j] * scale);
  return v;
}

void l2_normalize(std::span<float> v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  if (s <= 0) return;
  const double inv = 1.0 / std::sqrt(s);
  for (float& x : v) x = static_cast<float>(x * inv);
}

}  // namespace ember
