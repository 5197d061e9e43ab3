#include "engine/session.hpp"

#include <algorithm>
#include <thread>

#include "core/error.hpp"

namespace ember {

int default_thread_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

RepackScope repack_scope_for(FfnMode mode, bool hybrid) {
  // Input sparsity reads the file's row-major matrices for prompts (its decode reads its own
  // copies), and builds those copies from them: every layer matrix stays as the file has it.
  if (mode == FfnMode::input) return RepackScope::output;
  if (hybrid || mode == FfnMode::predictor) return RepackScope::attention_output;
  return mode == FfnMode::dense ? RepackScope::all : RepackScope::attention_output_gate;
}

namespace {
int resolve_threads(int n) {
  EMBER_CHECK(n >= 0 && n <= 1024, "thread count must be between 1 and 1024, got {}", n);
  return n == 0 ? default_thread_count() : n;
}
}  // namespace

Session::Session(const Model& model, const SessionParams& p) : model_(model), pool_(resolve_threads(p.n_threads)) {
  EMBER_CHECK(p.n_ctx >= 1, "context size must be positive, got {}", p.n_ctx);
  EMBER_CHECK(p.n_batch >= 1, "batch size must be positive, got {}", p.n_batch);
  int64_t n_ctx = std::min(p.n_ctx, model.hp.n_ctx_train);
  const Hparams& hp = model.hp;
  kv_.init(hp.n_layer, n_ctx, hp.n_head_kv * hp.head_dim, p.kv_type);
  ws_.init(model, std::min(p.n_batch, n_ctx), n_ctx, pool_.size());
  logits_.resize(hp.n_vocab);
  tokens_.reserve(static_cast<size_t>(n_ctx));  // no reallocation on the decode path
  if (p.hybrid_on() || p.sparse.mode != FfnMode::dense) {
    const std::string why = model_moe_refusal(model, p.hybrid_on() ? "the hybrid executor (--vram-budget / --plan)"
                                                                    : fmt::format("--sparse-mode {}", ffn_mode_name(p.sparse.mode)));
    EMBER_CHECK(why.empty(), "{}: {}", model.file->path(), why);
  }
  if (p.hybrid_on()) {
    EMBER_CHECK(p.sparse.mode == FfnMode::dense || p.sparse.mode == FfnMode::oracle,
                "the hybrid executor (--vram-budget / --plan) runs the oracle rule (the gate decides on both sides, "
                "--sparse-threshold); --sparse-mode {} does not combine with it yet", ffn_mode_name(p.sparse.mode));
    HybridOptions h = p.hybrid;
    h.threshold = p.sparse.threshold;
    h.kv_type = p.kv_type;
    hybrid_ = std::make_unique<HybridFfn>(model, pool_, h, n_ctx, ws_.max_batch);
    ws_.layers = hybrid_.get();
  } else if (p.sparse.mode == FfnMode::input) {
    InputThresholds t = p.sparse.input_thresholds.empty() ? model.input_thresholds : p.sparse.input_thresholds;
    EMBER_CHECK(!t.empty(), "--sparse-mode input needs thresholds: give --sparse-profile FILE --sparsity S (a profile "
                "from `ember profile`) or a model made with `ember sparsify`");
    input_ = std::make_unique<InputSparseExecutor>(model, pool_, std::move(t), p.sparse.down_type, ws_.max_batch);
    ws_.proj = input_.get();
  } else if (p.sparse.mode != FfnMode::dense) {
    SparseFfnOptions so = p.sparse;
    // Threshold mode without thresholds given: the calibrated ones stored in the model file.
    if (so.mode == FfnMode::threshold && so.layer_thresholds.empty()) so.layer_thresholds = model.gate_thresholds;
    sparse_ = std::make_unique<SparseFfn>(model, pool_, so, ws_.max_batch);
  }
  set_ffn_executor(nullptr);
}

void Session::set_ffn_executor(FfnExecutor* e) {
  FfnExecutor* ffn = e ? e : own_ffn();
  if (ffn) {
    std::string why = model_moe_refusal(model_, "an FFN executor (sparse modes, profiling, predictor training)");
    if (why.empty()) why = ffn->refusal(model_);
    EMBER_CHECK(why.empty(), "{}: {}", model_.file->path(), why);
  }
  ws_.ffn = ffn;
}

void Session::set_projection_executor(ProjectionExecutor* e) { ws_.proj = e ? e : input_.get(); }

void Session::eval(const std::vector<int32_t>& tokens) { eval(tokens.data(), static_cast<int64_t>(tokens.size())); }

void Session::eval(const int32_t* tokens, int64_t n) {
  for (int64_t done = 0; done < n;) {
    int64_t chunk = std::min(ws_.max_batch, n - done);
    forward(model_, pool_, kv_, ws_, tokens + done, chunk, pos_, logits_.data(), false);
    tokens_.insert(tokens_.end(), tokens + done, tokens + done + chunk);
    pos_ += chunk;
    done += chunk;
  }
}

void Session::eval_all_logits(const int32_t* tokens, int64_t n, float* all_logits) {
  const int64_t nv = model_.hp.n_vocab;
  for (int64_t done = 0; done < n;) {
    int64_t chunk = std::min(ws_.max_batch, n - done);
    forward(model_, pool_, kv_, ws_, tokens + done, chunk, pos_, all_logits + done * nv, true);
    tokens_.insert(tokens_.end(), tokens + done, tokens + done + chunk);
    pos_ += chunk;
    done += chunk;
  }
  std::copy(all_logits + (n - 1) * nv, all_logits + n * nv, logits_.begin());
}

void Session::truncate(int64_t pos) {
  EMBER_CHECK(pos >= 0 && pos <= pos_, "cannot truncate to {} (sequence has {} tokens)", pos, pos_);
  pos_ = pos;
  tokens_.resize(static_cast<size_t>(pos));
}

}  // namespace ember
