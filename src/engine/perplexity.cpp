#include "engine/perplexity.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"
#include "core/mmap_file.hpp"
#include "engine/sampler.hpp"

namespace ember {

void log_softmax(const float* logits, int64_t n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(s);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

double kl_divergence(const std::vector<double>& log_p, const std::vector<double>& log_q) {
  EMBER_CHECK(log_p.size() == log_q.size(), "KL divergence of distributions of {} and {} entries", log_p.size(),
              log_q.size());
  double kl = 0;
  for (size_t i = 0; i < log_p.size(); ++i) {
    const double p = std::exp(log_p[i]);
    if (p > 0) kl += p * (log_p[i] - log_q[i]);
  }
  return std::max(kl, 0.0);  // rounding can make a tiny negative sum
}

LogProbRow quantize_log_probs(const std::vector<double>& log_p, int32_t true_token) {
  LogProbRow r;
  const size_t n = log_p.size();
  size_t top = 0;
  for (size_t i = 1; i < n; ++i)
    if (log_p[i] > log_p[top]) top = i;
  r.top1 = static_cast<int32_t>(top);
  r.lp_max = static_cast<float>(log_p[top]);
  r.lp_true = static_cast<float>(log_p[static_cast<size_t>(true_token)]);
  r.q.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const double q = std::round((static_cast<double>(r.lp_max) - log_p[i]) / kLogProbStep);
    r.q[i] = static_cast<uint16_t>(std::clamp(q, 0.0, 65535.0));
  }
  return r;
}

void dequantize_log_probs(const LogProbRow& row, std::vector<double>& log_p) {
  const size_t n = row.q.size();
  log_p.resize(n);
  double s = 0;
  for (size_t i = 0; i < n; ++i) {
    log_p[i] = static_cast<double>(row.lp_max) - row.q[i] * kLogProbStep;
    s += std::exp(log_p[i]);
  }
  const double lse = std::log(s);
  for (double& v : log_p) v -= lse;
}

namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'E', 'R', 'L', 'P', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 6 * 4;
constexpr size_t kRowHeaderBytes = 12;

struct LogProbHeader {
  uint32_t n_vocab = 0, n_ctx = 0, n_chunk = 0, first = 0;
};

class LogProbWriter {
 public:
  LogProbWriter(const std::string& path, const LogProbHeader& h, const int32_t* tokens)
      : path_(path), tmp_(path + ".part"), n_vocab_(h.n_vocab) {
    f_ = std::fopen(tmp_.c_str(), "wb");
    EMBER_CHECK(f_, "cannot write the log-prob file '{}': {}", tmp_, std::strerror(errno));
    const uint32_t words[6] = {kVersion, h.n_vocab, h.n_ctx, h.n_chunk, h.first, 0};
    put(kMagic, sizeof kMagic);
    put(words, sizeof words);
    put(tokens, sizeof(int32_t) * static_cast<size_t>(h.n_chunk) * h.n_ctx);
  }
  ~LogProbWriter() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  void row(const LogProbRow& r) {
    put(&r.top1, 4);
    put(&r.lp_true, 4);
    put(&r.lp_max, 4);
    put(r.q.data(), sizeof(uint16_t) * n_vocab_);
  }
  void finish() {
    const bool ok = std::fclose(f_) == 0;
    f_ = nullptr;
    EMBER_CHECK(ok, "cannot finish writing the log-prob file '{}' (disk full?)", tmp_);
    std::filesystem::rename(tmp_, path_);
  }

 private:
  void put(const void* p, size_t n) {
    EMBER_CHECK(std::fwrite(p, 1, n, f_) == n, "cannot write the log-prob file '{}' (disk full?)", tmp_);
  }
  std::string path_, tmp_;
  size_t n_vocab_;
  std::FILE* f_ = nullptr;
};

class LogProbReader {
 public:
  explicit LogProbReader(const std::string& path) : file_(path) {
    const uint8_t* d = file_.data();
    EMBER_CHECK(file_.size() >= kHeaderBytes && std::memcmp(d, kMagic, 8) == 0,
                "'{}' is not an Ember log-prob file (write one with `ember perplexity --save-logits`)", path);
    uint32_t w[6];
    std::memcpy(w, d + 8, sizeof w);
    EMBER_CHECK(w[0] == kVersion, "'{}': log-prob file version {} (this build reads {})", path, w[0], kVersion);
    h_ = {w[1], w[2], w[3], w[4]};
    EMBER_CHECK(h_.n_vocab > 0 && h_.n_ctx >= 2 && h_.first < h_.n_ctx, "'{}': malformed log-prob header", path);
    row_bytes_ = kRowHeaderBytes + 2 * static_cast<size_t>(h_.n_vocab);
    const size_t want = kHeaderBytes + 4 * static_cast<size_t>(h_.n_chunk) * h_.n_ctx +
                        static_cast<size_t>(h_.n_chunk) * scored_per_chunk() * row_bytes_;
    EMBER_CHECK(file_.size() == want, "'{}' has {} bytes, its header says {} (truncated or not written to the end)",
                path, file_.size(), want);
  }
  const LogProbHeader& header() const { return h_; }
  uint32_t scored_per_chunk() const { return h_.n_ctx - 1 - h_.first; }
  const int32_t* token(size_t i, int32_t* out) const {
    std::memcpy(out, file_.data() + kHeaderBytes + 4 * i, 4);
    return out;
  }
  void row(size_t chunk, size_t j, LogProbRow& r) const {
    const uint8_t* p = file_.data() + kHeaderBytes + 4 * static_cast<size_t>(h_.n_chunk) * h_.n_ctx +
                       (chunk * scored_per_chunk() + j) * row_bytes_;
    std::memcpy(&r.top1, p, 4);
    std::memcpy(&r.lp_true, p + 4, 4);
    std::memcpy(&r.lp_max, p + 8, 4);
    r.q.resize(h_.n_vocab);
    std::memcpy(r.q.data(), p + kRowHeaderBytes, 2 * static_cast<size_t>(h_.n_vocab));
  }

 private:
  MappedFile file_;
  LogProbHeader h_;
  size_t row_bytes_ = 0;
};

// Mean and standard error of the mean from a sum and a sum of squares over n samples.
void mean_err(double sum, double sum2, int64_t n, double& mean, double& err) {
  mean = sum / static_cast<double>(n);
  const double var = sum2 / static_cast<double>(n) - mean * mean;
  err = (n > 1 && var > 0) ? std::sqrt(var / static_cast<double>(n - 1)) : 0.0;
}

double percentile(std::vector<double>& v, double p) {  // v sorted in place
  std::sort(v.begin(), v.end());
  const double idx = p * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(idx)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (idx - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

}  // namespace

PerplexityReport compute_perplexity(Session& session, const std::vector<int32_t>& tokens, int32_t bos,
                                    const PerplexityOptions& opts,
                                    const std::function<void(int64_t, int64_t, double)>& on_chunk) {
  const int64_t n_ctx = opts.n_ctx;
  const int64_t nv = session.model().hp.n_vocab;
  EMBER_CHECK(n_ctx >= 2, "perplexity needs chunks of at least 2 tokens, got -c {}", n_ctx);
  EMBER_CHECK(n_ctx <= session.n_ctx(), "chunk length {} exceeds the session's context of {} tokens", n_ctx,
              session.n_ctx());
  int64_t n_chunk = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (opts.max_chunks > 0) n_chunk = std::min(n_chunk, opts.max_chunks);
  EMBER_CHECK(n_chunk >= 1, "the text has {} tokens, fewer than one chunk of {} (use a longer text or a smaller -c)",
              tokens.size(), n_ctx);
  const int64_t first = n_ctx / 2, n_scored_chunk = n_ctx - 1 - first;
  EMBER_CHECK(n_scored_chunk >= 1, "-c {} leaves no token to score (use -c 4 or more)", n_ctx);

  // The evaluated input: chunks with the first token replaced by BOS.
  std::vector<int32_t> input(tokens.begin(), tokens.begin() + n_chunk * n_ctx);
  for (int64_t c = 0; c < n_chunk; ++c) {
    if (bos >= 0) input[c * n_ctx] = bos;
    for (int64_t i = 0; i < n_ctx; ++i)
      EMBER_CHECK(input[c * n_ctx + i] >= 0 && input[c * n_ctx + i] < nv, "token id {} out of the vocabulary ({})",
                  input[c * n_ctx + i], nv);
  }

  const LogProbHeader header{static_cast<uint32_t>(nv), static_cast<uint32_t>(n_ctx), static_cast<uint32_t>(n_chunk),
                             static_cast<uint32_t>(first)};
  std::unique_ptr<LogProbReader> base;
  if (!opts.kl_base.empty()) {
    base = std::make_unique<LogProbReader>(opts.kl_base);
    const LogProbHeader& bh = base->header();
    EMBER_CHECK(bh.n_vocab == header.n_vocab, "--kl-base '{}' has a vocabulary of {}, this model {}", opts.kl_base,
                bh.n_vocab, header.n_vocab);
    EMBER_CHECK(bh.n_ctx == header.n_ctx, "--kl-base '{}' was made with -c {}, this run uses -c {}: use the same -c",
                opts.kl_base, bh.n_ctx, header.n_ctx);
    EMBER_CHECK(bh.n_chunk >= header.n_chunk, "--kl-base '{}' has {} chunks, this run needs {} (use --chunks {})",
                opts.kl_base, bh.n_chunk, header.n_chunk, bh.n_chunk);
    for (size_t i = 0; i < input.size(); ++i) {
      int32_t t;
      EMBER_CHECK(*base->token(i, &t) == input[i],
                  "--kl-base '{}' was made from a different text or tokenizer (token {} differs): use the same -f "
                  "and model vocabulary",
                  opts.kl_base, i);
    }
  }
  std::unique_ptr<LogProbWriter> writer;
  if (!opts.save_logits.empty()) writer = std::make_unique<LogProbWriter>(opts.save_logits, header, input.data());

  std::vector<float> logits(static_cast<size_t>((n_ctx - first) * nv));
  std::vector<double> lp, lp_base;
  LogProbRow base_row;
  double nll = 0, nll2 = 0, bnll = 0, bnll2 = 0, d_sum = 0, d_sum2 = 0, kl_sum = 0, kl_sum2 = 0;
  int64_t n = 0, same = 0;
  std::vector<double> klds;
  PerplexityReport rep;
  for (int64_t c = 0; c < n_chunk; ++c) {
    const int32_t* in = input.data() + c * n_ctx;
    session.reset();
    session.eval(in, first);
    session.eval_all_logits(in + first, n_ctx - first, logits.data());
    for (int64_t j = 0; j < n_scored_chunk; ++j) {
      const int32_t truth = in[first + j + 1];
      check_logits(logits.data() + j * nv, nv, first + j);
      log_softmax(logits.data() + j * nv, nv, lp);
      const double l = -lp[static_cast<size_t>(truth)];
      nll += l;
      nll2 += l * l;
      if (writer) writer->row(quantize_log_probs(lp, truth));
      if (base) {
        base->row(static_cast<size_t>(c), static_cast<size_t>(j), base_row);
        const double bl = -static_cast<double>(base_row.lp_true);
        bnll += bl;
        bnll2 += bl * bl;
        d_sum += l - bl;
        d_sum2 += (l - bl) * (l - bl);
        dequantize_log_probs(base_row, lp_base);
        const double kl = kl_divergence(lp_base, lp);
        kl_sum += kl;
        kl_sum2 += kl * kl;
        klds.push_back(kl);
        size_t top = 0;
        for (size_t i = 1; i < lp.size(); ++i)
          if (lp[i] > lp[top]) top = i;
        same += static_cast<int32_t>(top) == base_row.top1;
      }
      ++n;
    }
    if (on_chunk) on_chunk(c, n_chunk, std::exp(nll / static_cast<double>(n)));
  }
  if (writer) writer->finish();

  rep.n_chunks = n_chunk;
  rep.n_scored = n;
  double m;
  mean_err(nll, nll2, n, m, rep.ppl_err);
  rep.ppl = std::exp(m);
  rep.ppl_err *= rep.ppl;
  if (base) {
    rep.has_base = true;
    mean_err(bnll, bnll2, n, m, rep.base_ppl_err);
    rep.base_ppl = std::exp(m);
    rep.base_ppl_err *= rep.base_ppl;
    mean_err(d_sum, d_sum2, n, rep.ln_ratio, rep.ln_ratio_err);
    mean_err(kl_sum, kl_sum2, n, rep.kld_mean, rep.kld_err);
    rep.kld_p99 = percentile(klds, 0.99);
    rep.kld_median = percentile(klds, 0.5);
    rep.kld_max = klds.back();
    rep.same_top1 = static_cast<double>(same) / static_cast<double>(n);
    rep.same_top1_err = n > 1 ? std::sqrt(rep.same_top1 * (1 - rep.same_top1) / static_cast<double>(n - 1)) : 0.0;
  }
  return rep;
}

}  // namespace ember
