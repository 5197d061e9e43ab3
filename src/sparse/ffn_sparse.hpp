// The neuron-sparse FFN executor on the CPU (PowerInfer's CPU path).
//
//   dense:  every neuron (dense_ffn), no executor installed.
//   oracle: the gate is computed for all neurons; a neuron is active for a token when
//           |act(gate)| > threshold (threshold 0: act(gate) != 0, which for ReLU is gate > 0
//           and makes the result exact); up is computed only for the active rows
//           (gather_matmul) and down only over them (sparse_axpy on a neuron-major copy of
//           down built when the executor is made, or the file's own ffn_down_t when it has
//           one: no copy). Bamboo (FfnGating::sym) multiplies by act(up); an FFN without a
//           gate (OPT, FfnGating::none) fires on act(up x + up_b) itself.
//   threshold: as oracle, with a calibrated threshold per layer on |act(gate)| (CATS / TEAL:
//           training-free sparsity for SwiGLU/GeGLU models; sparse/threshold.hpp). Approximate:
//           the dropped neurons' small contributions are lost.
//   predictor: the layer's predictor (sparse/predictor.hpp, FfnWeights::fc1/fc2) names the
//           neurons to compute; the gate is computed only for them (gather_matmul), then up and
//           down only for the predicted neurons whose |act(gate)| > threshold. Exact for every
//           neuron the predictor finds; a truly active neuron it misses is dropped.
//
// A single token (decode) of a gated FFN without gate/up biases takes a fused path: one
// dispatch computes the predictor's scores, the gate, the firing test, up and down (each thread
// a share of 64-neuron blocks, its down rows summed into its own partial); the partials are
// added in thread order. Deterministic for a thread count; on one thread bit-identical to the
// separate steps, on more equal to rounding (the sum is grouped by thread).
//
// Batches of several tokens take the union of the tokens' active sets (a neuron inactive for a
// token contributes an exact zero). Batches of kDenseBatch tokens or more run the dense kernels:
// over a long prompt nearly every neuron fires for some token, and the dense kernels reuse
// weights across tokens. With a nonzero threshold the dense path still zeroes every inactive
// act(gate), and in predictor mode every batch (short or long) zeroes each token's neurons
// that its own prediction does not name, so a prompt computes the function its tokens would
// decode one by one (what perplexity and KL measure, at any batch size).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/thread_pool.hpp"
#include "model/ffn.hpp"
#include "model/workspace.hpp"
#include "ops/cpu/sparse/sparse.hpp"
#include "sparse/map_reads.hpp"
#include "sparse/input_site.hpp"

namespace ember {

// input: not a SparseFfn mode but input sparsity on every matrix (sparse/input_sparse.hpp), run
// by its own executor; it shares the option and the CLI's flags.
enum class FfnMode { dense, oracle, threshold, predictor, input };
FfnMode parse_ffn_mode(const std::string& s);  // "dense" | "oracle" | "threshold" | "predictor" | "input"
const char* ffn_mode_name(FfnMode m);
// The neuron-sparse modes (SparseFfn): they read the rows of the neurons that fire, not whole
// matrices.
inline bool ffn_mode_gathers_rows(FfnMode m) { return m != FfnMode::dense && m != FfnMode::input; }

// The copies' type where none is asked for (the CLI's `--sparse-down auto`): input mode's copies
// hold their scale tables in 8 bits (compact: at a 50 % target on the 7B shape a decode token
// reads 7 % fewer bytes, and where decode is memory-bound it runs 1.66x dense against 1.56x with
// the file's tables, docs/benchmarks.md; the tables' rounding costs about
// a tenth of the copies' own, docs/agreement.md); the neuron-sparse modes' down copies keep the
// file's scales (exact).
cpu::NeuronMajorType default_copy_type(FfnMode mode);

struct SparseFfnOptions {
  FfnMode mode = FfnMode::dense;
  float threshold = 0.0f;  // oracle: a neuron is active when |act(gate)| > threshold
  // threshold mode: per layer, a neuron is active when |act(gate)| > layer_thresholds[layer]
  // (empty in SessionParams: the model file's Model::gate_thresholds).
  std::vector<float> layer_thresholds;
  // input mode: per layer and input site (sparse/input_site.hpp), entries kept when |x| > t
  // (empty in SessionParams: the model file's Model::input_thresholds).
  InputThresholds input_thresholds;
  // Beside them, the share of each site's inputs they drop on the profile's corpus (the
  // allocation's; empty in SessionParams: the model file's Model::input_sparsity, which may be
  // empty too): a site whose copy would not pay at that share gets none (InputSparseExecutor).
  std::vector<std::array<float, kInputSites>> input_sparsity;
  size_t input_min_row_bytes = kInputMinRowBytes;  // shorter copy rows: the site decodes dense
  // Per decode token, a site with a copy reads it only where that is cheaper than the dense
  // kernels on its masked input for the inputs this token keeps (InputSparseExecutor); false:
  // always the copy.
  bool input_copy_by_cost = true;
  cpu::NeuronMajorType down_type = cpu::NeuronMajorType::exact;
  cpu::AxpySplit split = cpu::AxpySplit::columns;
  // predictor mode: run mirrored predictors at half rank (sparse/predictor.hpp; tests compare
  // with the whole one)
  bool mirrored_predictors = true;
};

// Counts over the tokens the sparse path evaluated (per layer and in total).
struct FfnSparsityStats {
  std::vector<uint64_t> neurons, active;  // per layer: token-neurons seen, of which active
  // predictor mode, per layer: token-neurons whose gate was computed (the batch's predicted set
  // times its tokens); active counts only the computed ones that fired.
  std::vector<uint64_t> predicted;
  uint64_t dense_tokens = 0;              // token-layers that took the dense path (long batches)
  double sparsity() const;                // fraction of inactive neurons, 0 when none seen
  double layer_sparsity(size_t layer) const;
};

class SparseFfn final : public FfnExecutor {
 public:
  static constexpr int64_t kDenseBatch = 16;

  // Builds the neuron-major copies of every layer's down matrix (threaded on `pool`).
  // Predictor mode needs every layer's fc1/fc2 (attach_predictors or a sparse-ready file).
  SparseFfn(const Model& model, ThreadPool& pool, const SparseFfnOptions& opts, int64_t max_batch);

  void run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
           float* out, Workspace& ws) override;
  std::string refusal(const Model& model) const override;

  const SparseFfnOptions& options() const { return opts_; }
  size_t neuron_major_bytes() const;  // the down copies (0 for layers that use the file's down_t)
  size_t predictor_run_bytes() const;  // of the predictors as run (mirrored ones: the halves)
  size_t bytes() const;               // everything the executor holds
  const FfnSparsityStats& stats() const { return stats_; }
  // Weight bytes one token read on average over the sparse path so far (the stats): the model's
  // non-FFN weights, plus per layer the predictor and the rows of gate (all rows in oracle
  // mode, the predicted ones in predictor mode), up and the neuron-major down that were
  // computed. Batches count each row once per token (an upper bound for them). 0 before any
  // token ran the sparse path.
  double weight_bytes_per_token() const;
  void reset_stats();
  // Whether one-token batches take the fused decode path (default on; off: the separate steps,
  // which give the same bits on one thread and the same values to rounding on more).
  void set_fused_decode(bool on) { fused_ = on; }
  // Where the FFN rows are read from the file's map (a model larger than its memory budget):
  // how many pages were brought in, and the time waited on them; null otherwise.
  const MapReadStats* map_read_stats() const { return map_reads_ ? &map_reads_->stats() : nullptr; }
  void reset_map_read_stats() {
    if (map_reads_) map_reads_->reset_stats();
  }

 private:
  const Model& model_;
  // A model larger than its memory budget (Model::resident_weight_budget): every kernel's rows
  // are made resident first, many reads at once (sparse/map_reads.hpp); null otherwise.
  std::unique_ptr<MapReads> map_reads_;
  std::vector<int32_t> map_ids_;  // the fused decode's candidates of all threads
  SparseFfnOptions opts_;
  std::vector<cpu::NeuronMajorMatrix> down_nm_;  // per layer
  std::vector<int32_t> active_;
  std::vector<float> axpy_scratch_;
  // predictor mode: the predicted neurons, the predictor's scores and hidden rows, and the
  // scratch of its matmuls.
  std::vector<int32_t> predicted_;
  AlignedBuffer<float> pred_scratch_;
  AlignedBuffer<uint8_t> pred_mm_scratch_;
  // The predictor each layer runs: the model's fc1 / fc2 with the ReLU, or for a mirrored one
  // (sparse/predictor.hpp) fc1's first half and a copy of fc2's first half columns (in
  // pred_halves_), without it.
  struct LayerPredictorRun {
    TensorView fc1, fc2;
    bool linear = false;
  };
  std::vector<LayerPredictorRun> pred_;
  AlignedBuffer<uint8_t> pred_halves_;

  // One token through a gated FFN without biases on gate/up (decode), in one dispatch:
  //   step 1: the predicted neurons (after the predictor's hidden layer, split by rows, and a
  //     barrier), each thread over a contiguous range of blocks of kNeuronBlock neurons; or
  //     act(gate) of every neuron and the firing ones, each thread over every nth block;
  //   step 2: predictor mode, after a barrier, the candidates of all threads dealt out round
  //     robin in chunks of at least kDealChunk that end where a block of cpu::kNm4Block neurons
  //     does (balanced by count; a 4-bit neuron-major down rounds its factors per such block's
  //     run of the list, so every thread count rounds alike), their gate gathered and the firing
  //     ones kept; otherwise the thread's own firing neurons. Then up and down for them in one
  //     pass (cpu::sparse_up_down_rows), thread 0 into out and thread i > 0 into
  //     fused_partials_ row i - 1 (the caller adds those in order).
  // Which neurons fire does not depend on the thread count; the output does only through the
  // grouping of the down sum. Returns false where it does not apply.
  static constexpr int64_t kNeuronBlock = 64;
  // Whether a decode token of a layer read from the file's map reads each predicted neuron's
  // whole bundle at once (its gate, up and down rows: neighbouring pages, one read where the
  // neurons that fire together lie together) rather than the gate rows, then the firing ones' up
  // and down rows in a second wave: in predictor mode where the layer is bundled and, so far, at
  // least half of its predicted neurons fired (a loose predictor would read pages it does not use).
  bool read_whole_bundles(int64_t layer, const FfnWeights& w, const TensorView& down_nm) const;
  static constexpr int64_t kDealChunk = 8;  // the sparse kernels' row group
  bool run_decode_fused(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                        float* out, Workspace& ws);
  // Per thread: step-1 finds and step-2 share (neuron ids) and two value rows (2 x n_ff each),
  // and the thread's counters (step-1 finds, predicted, fired).
  AlignedBuffer<int32_t> fused_ids_;
  AlignedBuffer<float> fused_vals_;
  std::vector<uint64_t> thread_counts_;
  AlignedBuffer<uint8_t> fused_hq_;  // per thread: the predictor's hidden row as fc2's kernel takes it
  size_t hq_stride_ = 0;             // bytes per thread in fused_hq_ (a multiple of 64)
  AlignedBuffer<float> fused_partials_;  // threads 1.. : their share of the down product
  size_t partial_stride_ = 0;            // floats per partial (n_embd rounded up to 16)
  int fused_threads_ = 0;  // the pool size the buffers are for (a larger pool takes the separate steps)
  bool fused_ = true;  // tests switch it off to compare with the separate steps

  // Repacks a mirrored predictor's fc2 half (the executor's own copy) 16 rows at a time where the
  // dense kernels have a fast layout for its type.
  static void repack_for_decode(TensorView& fc2);
  // What the predictor reads: the residual stream before ffn_norm for PowerInfer's predictors
  // (Model::predictor_on_residual), else the FFN input x.
  const float* predictor_input(const float* x, const Workspace& ws) const;
  void run_predicted_dense(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                           int64_t n, float* out, Workspace& ws);
  void run_predicted(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                     int64_t n, float* out, Workspace& ws);
  // up for active_[0..na), times the activated gate g[t * g_stride + i], then down into out.
  // (Bamboo: times act(up); an FFN without a gate: H = g), plus down's bias. read_rows: ask the
  // file's map for the rows first (false: the caller read them with the gate's).
  void up_down(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
               const float* g, int64_t g_stride, int64_t na, float* out, Workspace& ws, bool read_rows = true);
  FfnSparsityStats stats_;
};

}  // namespace ember
