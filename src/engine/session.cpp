#include "engine/session.hpp"

#include <algorithm>
#include <thread>

#include "core/error.hpp"
#include "sparse/predictor.hpp"

namespace ember {

int default_thread_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

RepackScope repack_scope_for(FfnMode mode, bool hybrid) {
  // Input sparsity's prompts (and its dense sites' decode) run the dense kernels, so everything is
  // repacked; its copies are built from the file's layout (Model::file_layers, kept by the loader).
  if (mode == FfnMode::input) return RepackScope::all;
  if (hybrid || mode == FfnMode::predictor) return RepackScope::attention_output;
  return mode == FfnMode::dense ? RepackScope::all : RepackScope::attention_output_gate;
}

RepackStats repack_for_session(Model& model, FfnMode mode, RepackScope scope, ResidentWeights resident, bool hybrid) {
  if ((mode == FfnMode::input || hybrid) && scope > RepackScope::output) model.file_layers = model.layers;
  if (hybrid && scope >= RepackScope::output) model.file_output = model.output;
  return repack_for_dense_kernels(model, scope, resident, model.resident_weight_budget);
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
  EMBER_CHECK(p.n_seq >= 1 && p.n_seq <= 256, "the number of sequences must be between 1 and 256, got {}", p.n_seq);
  int64_t n_ctx = std::min(p.n_ctx, model.hp.n_ctx_train);
  const Hparams& hp = model.hp;
  seqs_.resize(static_cast<size_t>(p.n_seq));
  for (Seq& sq : seqs_) {
    sq.logits.resize(static_cast<size_t>(hp.n_vocab));
    sq.tokens.reserve(static_cast<size_t>(n_ctx));  // no reallocation on the decode path
  }
  ws_.init(model, std::min(p.n_batch, n_ctx * p.n_seq), n_ctx, pool_.size());
  {
    const size_t most = static_cast<size_t>(std::min<int64_t>(p.n_seq, ws_.max_batch));
    batch_tokens_.reserve(static_cast<size_t>(ws_.max_batch));
    batch_spans_.reserve(most);
    batch_rows_.reserve(most);
    batch_hidden_.reserve(most);
    batch_logits_.resize(most * static_cast<size_t>(hp.n_vocab));
  }
  // Input sparsity and the hybrid (dense experts split by the plan) take a mixture's experts; the
  // other sparse modes do not yet.
  if (ffn_mode_gathers_rows(p.sparse.mode)) {
    const std::string why = model_moe_refusal(model, fmt::format("--sparse-mode {}", ffn_mode_name(p.sparse.mode)));
    EMBER_CHECK(why.empty(), "{}: {}", model.file->path(), why);
  }
  if (p.hybrid_on()) {
    EMBER_CHECK(p.sparse.mode == FfnMode::dense || p.sparse.mode == FfnMode::oracle ||
                    p.sparse.mode == FfnMode::predictor,
                "the hybrid executor (--vram-budget / --plan) runs the oracle rule (the gate decides on both sides, "
                "--sparse-threshold) or the model's predictors (--sparse-mode predictor); --sparse-mode {} does not "
                "combine with it yet", ffn_mode_name(p.sparse.mode));
    HybridOptions h = p.hybrid;
    h.predictor = p.sparse.mode == FfnMode::predictor;
    EMBER_CHECK(!h.predictor || has_predictors(model), "--sparse-mode predictor needs a predictor for every layer: pass "
                "--predictor FILE (made by `ember train-predictor`) or a sparse-ready model with fc1/fc2 tensors");
    h.threshold = p.sparse.threshold;
    h.kv_type = p.kv_type;
    h.down_type = p.sparse.down_type;
    h.n_seq = p.n_seq;
    hybrid_ = std::make_unique<HybridExecutor>(model, pool_, h, n_ctx, ws_.max_batch);
    ws_.layers = hybrid_.get();
  } else if (p.sparse.mode == FfnMode::input) {
    InputThresholds t = p.sparse.input_thresholds.empty() ? model.input_thresholds : p.sparse.input_thresholds;
    auto dropped = p.sparse.input_thresholds.empty() ? model.input_sparsity : p.sparse.input_sparsity;
    EMBER_CHECK(!t.empty(), "--sparse-mode input needs thresholds: give --sparse-profile FILE --sparsity S (a profile "
                "from `ember profile`) or a model made with `ember sparsify`");
    input_ = std::make_unique<InputSparseExecutor>(model, pool_, std::move(t), p.sparse.down_type, ws_.max_batch,
                                                   p.sparse.input_min_row_bytes, p.sparse.input_copy_by_cost,
                                                   std::move(dropped));
    ws_.proj = input_.get();
  } else if (p.sparse.mode != FfnMode::dense) {
    SparseFfnOptions so = p.sparse;
    // Threshold mode without thresholds given: the calibrated ones stored in the model file.
    if (so.mode == FfnMode::threshold && so.layer_thresholds.empty()) so.layer_thresholds = model.gate_thresholds;
    sparse_ = std::make_unique<SparseFfn>(model, pool_, so, ws_.max_batch);
  }
  // The KV caches: the layers whose attention a device holds keep theirs there.
  std::vector<char> held;
  if (hybrid_) {
    held.assign(static_cast<size_t>(hp.n_layer), 1);
    for (size_t l = 0; l < held.size(); ++l) held[l] = !hybrid_->plan().layers[l].attn_gpu;
  }
  for (Seq& sq : seqs_) sq.kv.init(hp.n_layer, n_ctx, hp.n_head_kv * hp.head_dim, p.kv_type, held);
  set_ffn_executor(nullptr);
}

void Session::set_ffn_executor(FfnExecutor* e) {
  FfnExecutor* ffn = e ? e : own_ffn();
  if (ffn) {
    std::string why = ffn->takes_experts() ? std::string()
                                           : model_moe_refusal(model_, "an FFN executor (sparse modes, predictor training)");
    if (why.empty()) why = ffn->refusal(model_);
    EMBER_CHECK(why.empty(), "{}: {}", model_.file->path(), why);
  }
  ws_.ffn = ffn;
}

void Session::set_projection_executor(ProjectionExecutor* e) { ws_.proj = e ? e : input_.get(); }

void Session::set_dense(bool dense) {
  EMBER_CHECK(input_ && !hybrid_, "the dense path beside the session's own is measured in input mode only (its matrices are "
              "a dense session's); this session runs {}", hybrid_ ? "the hybrid executor" : sparse_ ? "a neuron-sparse FFN"
              : "dense already");
  ws_.ffn = dense ? nullptr : input_.get();
  ws_.proj = dense ? nullptr : input_.get();
}

Session::Seq& Session::at(int seq) {
  EMBER_CHECK(seq >= 0 && seq < n_seq(), "sequence {} does not exist (the session has {})", seq, n_seq());
  return seqs_[static_cast<size_t>(seq)];
}
const Session::Seq& Session::at(int seq) const { return const_cast<Session*>(this)->at(seq); }

void Session::eval(const std::vector<int32_t>& tokens) { eval(tokens.data(), static_cast<int64_t>(tokens.size())); }

void Session::eval(const int32_t* tokens, int64_t n, int seq) {
  Seq& sq = at(seq);
  for (int64_t done = 0; done < n;) {
    int64_t chunk = std::min(ws_.max_batch, n - done);
    forward(model_, pool_, sq.kv, ws_, tokens + done, chunk, pos(seq), sq.logits.data(), false, seq);
    sq.tokens.insert(sq.tokens.end(), tokens + done, tokens + done + chunk);
    done += chunk;
  }
}

void Session::eval_all_logits(const int32_t* tokens, int64_t n, float* all_logits) {
  const int64_t nv = model_.hp.n_vocab;
  Seq& sq = seqs_[0];
  for (int64_t done = 0; done < n;) {
    int64_t chunk = std::min(ws_.max_batch, n - done);
    forward(model_, pool_, sq.kv, ws_, tokens + done, chunk, pos(), all_logits + done * nv, true);
    sq.tokens.insert(sq.tokens.end(), tokens + done, tokens + done + chunk);
    done += chunk;
  }
  std::copy(all_logits + (n - 1) * nv, all_logits + n * nv, sq.logits.begin());
}

void Session::eval_seqs(std::span<const SeqEval> items) {
  EMBER_CHECK(!items.empty(), "eval_seqs: no sequence given");
  for (const SeqEval& it : items) EMBER_CHECK(it.n >= 1, "eval_seqs: sequence {} is given {} tokens", it.seq, it.n);
  if (items.size() == 1 && !items[0].hidden && !items[0].logits) return eval(items[0].tokens, items[0].n, items[0].seq);
  EMBER_CHECK(items.size() <= batch_spans_.capacity(), "eval_seqs: {} sequences in one step (at most {})", items.size(),
              batch_spans_.capacity());
  batch_tokens_.clear();
  batch_spans_.clear();
  batch_rows_.clear();
  batch_hidden_.clear();
  for (const SeqEval& it : items) {
    Seq& sq = at(it.seq);
    for (const SeqSpan& earlier : batch_spans_)
      EMBER_CHECK(earlier.kv != &sq.kv, "eval_seqs: sequence {} is given twice", it.seq);
    EMBER_CHECK(static_cast<int64_t>(batch_tokens_.size()) + it.n <= ws_.max_batch,
                "eval_seqs: {} tokens in one step (1 to {} allowed)", static_cast<int64_t>(batch_tokens_.size()) + it.n,
                ws_.max_batch);
    const int64_t first = static_cast<int64_t>(batch_tokens_.size());
    batch_spans_.push_back({&sq.kv, first, it.n, pos(it.seq), it.seq});
    if (it.hidden) batch_hidden_.push_back({first, it.n, it.hidden});
    else
      for (int64_t r = it.logits ? first : first + it.n - 1; r < first + it.n; ++r) batch_rows_.push_back(r);
    batch_tokens_.insert(batch_tokens_.end(), it.tokens, it.tokens + it.n);
  }
  const size_t nv = static_cast<size_t>(model_.hp.n_vocab);
  if (batch_logits_.size() < batch_rows_.size() * nv) batch_logits_.resize(batch_rows_.size() * nv);  // all rows asked
  forward_seqs(model_, pool_, ws_, batch_tokens_.data(), batch_spans_, batch_rows_.data(),
               static_cast<int64_t>(batch_rows_.size()), batch_logits_.data(), batch_hidden_);
  size_t row = 0;
  for (const SeqEval& it : items) {
    Seq& sq = seqs_[static_cast<size_t>(it.seq)];
    if (it.logits) {
      std::copy_n(batch_logits_.data() + row * nv, static_cast<size_t>(it.n) * nv, it.logits);
      row += static_cast<size_t>(it.n);
      std::copy_n(it.logits + (it.n - 1) * static_cast<int64_t>(nv), nv, sq.logits.begin());
    } else if (!it.hidden) {
      std::copy_n(batch_logits_.data() + row++ * nv, nv, sq.logits.begin());
    }
    sq.tokens.insert(sq.tokens.end(), it.tokens, it.tokens + it.n);
  }
}

void Session::truncate(int64_t pos, int seq) {
  Seq& sq = at(seq);
  EMBER_CHECK(pos >= 0 && pos <= static_cast<int64_t>(sq.tokens.size()), "cannot truncate to {} (sequence has {} tokens)",
              pos, sq.tokens.size());
  sq.tokens.resize(static_cast<size_t>(pos));
}

}  // namespace ember
