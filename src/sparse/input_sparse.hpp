// Training-free input sparsity on every matrix of a layer (TEAL, arXiv 2408.14690): the entries of
// a matrix's input whose magnitude is at or below a calibrated threshold are taken as zero, so
// the columns of the matrix they multiply are never read. Unlike the threshold mode (CATS),
// which skips up and down for silent neurons but reads the whole gate, every matrix skips, at
// each of the four input sites of a layer (sparse/input_site.hpp: the inputs of q/k/v, o,
// gate/up and down).
//
// A skipped input is a skipped row only when the matrix is stored input-channel-major: one row
// of n_out values per input. The executor keeps such a copy of each matrix (built with the
// neuron-major copies of ops/cpu/sparse/sparse.hpp: a Q4_0 / Q4_1 matrix keeps the file's codes and
// scales bit for bit as Q4_0_NM / Q4_1_NM, F32 / F16 / BF16 are transposed exactly, other
// quantized types become Q8_0; matrices that read one input, q / k / v and gate / up, share one
// copy with their outputs side by side in each row), and one token (decode) runs
// cpu::sparse_axpy over the kept inputs (a long row streams faster: bench_sparse's
// SparseAxpy/Q4_0_NM, 28672 x 4096 against 4096 x 4096). Batches of several tokens (prompts,
// perplexity) run the dense kernels on the model's matrices (repacked for them at load, as in
// dense mode) with the same inputs zeroed: the same function, from the other layout. The copies
// are built from the file's layout (Model::file_layer) and add the size of the layers' weights.
// A site whose copy would have short rows (input_site_dense: SmolLM2's, under 2 KiB) gets no
// copy: it decodes with the dense kernels on its masked input, as its prompts do. A site with a
// copy takes it for a decode token only where that reads faster (input_copy_max_kept): the kept
// rows and the scale tables at the copy's rate (input_copy_rate) against the matrices' bytes at
// the dense rate; at low sparsity (the 7B shape's attention inputs at a 50 % target keep 75-83 %
// of their entries) the dense kernels on the masked input are the faster way to the same function.
//
// Thresholds (per layer and site) come from a profile's input quantiles (`ember profile` records
// them) and an allocation of a model-wide target sparsity (sparse/input_allocation.hpp).
#pragma once
#include <array>
#include <initializer_list>
#include <cstdint>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "model/ffn.hpp"
#include "model/workspace.hpp"
#include "ops/cpu/sparse/sparse.hpp"
#include "sparse/input_site.hpp"

namespace ember {

// The matrices that read each site's input (the table above), for one layer: what the copies
// are made of and what skipping an input saves. Down is the file's down, or its neuron-major
// down_t where it has only that.
// In a mixture-of-experts layer the FFN sites are each expert's (ffn_in: the FFN input, which
// every chosen expert reads, the router reading it whole; ffn_hidden: each expert's own values):
// the matrices listed are the first expert's, which every expert's match in shape and type (one
// tensor of the file holds them all), and every decision made on them holds for each.
struct InputSiteMatrices {
  std::array<std::vector<const TensorView*>, kInputSites> site;
};
InputSiteMatrices input_site_matrices(const LayerWeights& L);
// The FFN whose matrices the FFN sites list: the layer's, or its first expert.
const FfnWeights& input_site_ffn(const LayerWeights& L);
// The matrices of an FFN that read its input (ffn_in) and its neuron values (ffn_hidden).
void ffn_site_matrices(const FfnWeights& f, std::vector<const TensorView*>& in, std::vector<const TensorView*>& hidden);
// The number of weights of each site's matrices (n_in x the sum of their n_out) a token reads:
// a mixture's FFN sites count n_used experts.
std::array<double, kInputSites> input_site_weights(const LayerWeights& L);

// Whether site s of layer L decodes with the dense kernels on its masked input rather than
// through an input-channel-major copy: where the copy's rows would be shorter than min_row_bytes
// (input_site.hpp's kInputMinRowBytes: SmolLM2's are). Decided on the file's types (a repacked
// matrix counts as its base type). The file's own neuron-major down_t is never dense.
bool input_site_dense(const LayerWeights& L, int site, cpu::NeuronMajorType copy_type,
                      size_t min_row_bytes = kInputMinRowBytes);

// The most kept inputs for which a decode token reads a site faster through its copy than with
// the dense kernels: k rows of each stack (row_bytes[i] each, plus table_bytes[i] of shared
// scales, read whole) at input_copy_rate of the row length, against dense_bytes at the dense
// rate. -1 where the copy never pays.
int64_t input_copy_max_kept(const std::vector<size_t>& row_bytes, const std::vector<size_t>& table_bytes,
                            size_t dense_bytes);

// How a session decodes site s of a layer (file_L: the file's layout the copy is made from,
// own_L: the model's matrices, repacked or not, the dense path's bytes): kInputCopyNone where it
// keeps no copy by its shapes (input_site_dense) or the copy never pays, else the most kept
// inputs for which a token reads the copy (input_copy_max_kept; INT64_MAX for the file's own
// down_t, which has no dense layout, and wherever `by_cost` is off).
constexpr int64_t kInputCopyNone = -1;
int64_t input_site_max_kept(const LayerWeights& file_L, const LayerWeights& own_L, int site,
                            cpu::NeuronMajorType copy_type, size_t min_row_bytes = kInputMinRowBytes,
                            bool by_cost = true);
// Whether a site keeps its copy where the allocation drops a share `dropped` of its n_in inputs:
// it has one (max_kept >= 0) and keeps on average at most kInputCopySlack times max_kept. A site
// that does not decodes every token with the dense kernels on its masked input: its skipped
// inputs save no time.
bool input_copy_pays(int64_t max_kept, double dropped, int64_t n_in);

// The kept entries of x[0..n): their indices and values, in index order; returns their count.
int64_t select_inputs(const float* x, int64_t n, float threshold, int32_t* ids, float* vals);

// Counts over the one-token (decode) path, per layer and site: input entries seen, kept.
struct InputSparsityStats {
  std::vector<std::array<uint64_t, kInputSites>> seen, kept;
  // The decode tokens that met each site, those of them that read the site's copy (the others
  // ran the dense kernels on their masked inputs), and the inputs these kept.
  std::vector<std::array<uint64_t, kInputSites>> tokens, copy_tokens, copy_kept;
  uint64_t batch_tokens = 0;  // token-layers that took the dense path (batches of several tokens)
  double sparsity(int site) const;  // over all layers; 0 when none seen
  double sparsity() const;          // weighted by the weights each site's inputs multiply
  double copy_share(int site) const;  // of a site's decode tokens over all layers, those through copies
  std::vector<double> site_weights;  // per site, the model's total (for sparsity())
};

class InputSparseExecutor final : public FfnExecutor, public ProjectionExecutor {
 public:
  // Builds the input-channel-major copies of every layer's matrices (threaded on `pool`), but
  // for the sites input_site_dense names (no copy: they decode with the dense kernels on their
  // masked inputs). `copy_type` as SparseFfnOptions::down_type (ops/cpu/sparse/sparse.hpp's
  // NeuronMajorType). `by_cost`: a decode token reads a copy only where input_copy_max_kept
  // says it is faster, else always. `dropped` (per layer and site, the share of inputs the
  // thresholds drop on the profile's corpus; may be empty): with by_cost, a site that keeps on
  // average more than kInputCopySlack times its break-even count keeps no copy either (its
  // tokens would take the dense kernels anyway; at a 50 % target the 7B shape's attention inputs).
  InputSparseExecutor(const Model& model, ThreadPool& pool, InputThresholds thresholds,
                      cpu::NeuronMajorType copy_type, int64_t max_batch,
                      size_t min_row_bytes = kInputMinRowBytes, bool by_cost = true,
                      std::vector<std::array<float, kInputSites>> dropped = {});

  void qkv(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* xn, int64_t n, Workspace& ws) override;
  void out(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* attn, int64_t n, float* o,
           Workspace& ws) override;
  void run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
           float* out, Workspace& ws) override;
  // A mixture's layer: the router reads the FFN input whole; each chosen expert's gate and up
  // read it masked at ffn_in's threshold, its down its values masked at ffn_hidden's. A decode
  // token runs each chosen expert through that expert's copies where the layer's experts have
  // them, else (and for batches) the mixture's own fused paths on the masked inputs.
  bool takes_experts() const override { return true; }
  void run_moe(ThreadPool& pool, int64_t layer, const MoeWeights& moe, cpu::Activation act, const float* x, int64_t n,
               float* out, Workspace& ws) override;
  std::string refusal(const Model& model) const override;
  // run()'s batch path (n > 1) in its two halves: the neuron values of the FFN of x with x's
  // entries at or below ffn_in's threshold dropped (n x n_ff in ws.up, returned, unmasked);
  // then out = down h with h's entries at or below ffn_hidden's threshold dropped (h is masked
  // in place).
  float* batch_values(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                      int64_t n, Workspace& ws);
  void batch_down(ThreadPool& pool, int64_t layer, const FfnWeights& w, float* h, int64_t n, float* out,
                  Workspace& ws);

  const InputThresholds& thresholds() const { return thr_; }
  // Replaces one layer's thresholds (the block allocation tries candidates on the prompt path;
  // a decode token's choice of copy or dense, fixed at construction, does not follow them).
  void set_thresholds(int64_t layer, const std::array<float, kInputSites>& t);
  const InputSparsityStats& stats() const { return stats_; }
  void reset_stats();
  size_t copy_bytes() const;  // the input-channel-major copies
  size_t bytes() const;       // everything the executor holds
  // Weight bytes one decode token read on average so far: the model's bytes per token with each
  // layer's matrices replaced by the rows of the kept inputs (and a shared-scale copy's tables,
  // counted whole). 0 before a decode token ran.
  double weight_bytes_per_token() const;

 private:
  // The input-channel-major copy of a site's matrices that share one: consecutive ones of one
  // type (q, k, v; gate, up) side by side in each row, so that a kept input is one long row.
  struct Stack {
    cpu::NeuronMajorMatrix copy;  // empty for the file's own neuron-major down_t
    TensorView view;              // what the axpy reads
    std::vector<int64_t> widths;  // the outputs of each matrix, in the site's order
  };
  using LayerCopies = std::array<std::vector<Stack>, kInputSites>;
  using ExpertCopies = std::array<std::vector<Stack>, 2>;  // an expert's ffn_in and ffn_hidden
  // Whether a site's decode runs the dense kernels on its masked input (no copy kept): where the
  // copy's rows would be shorter than the constructor's min_row_bytes (input_site_dense), or
  // where it would not pay.
  bool dense_site(size_t layer, int site) const { return !has_copy_[layer][static_cast<size_t>(site)]; }
  // One decode token through an FFN (the layer's, or one expert), its two sites through their
  // copies (in_stacks, hidden_stacks: that FFN's) or dense on the masked inputs.
  void decode_ffn(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x,
                  float* out, Workspace& ws, const std::vector<Stack>& in_stacks,
                  const std::vector<Stack>& hidden_stacks);
  template <class F>
  void for_each_stack(F&& f) const {
    for (const LayerCopies& c : copies_)
      for (const auto& site : c)
        for (const Stack& st : site) f(st);
    for (const auto& layer : experts_)
      for (const ExpertCopies& c : layer)
        for (const auto& site : c)
          for (const Stack& st : site) f(st);
  }
  // Decode, one token's input x[0..n_in) at a site: true where the product reads the site's copy
  // (it has one, and the token keeps at most input_copy_max_kept inputs: ids_ / vals_ hold them,
  // k their count); else dense_in (x itself, or a buffer it is copied to) holds x with the dropped
  // entries zeroed, for the dense kernels. Counts the token in the stats either way.
  bool decode_via_copy(int64_t layer, InputSite site, const float* x, float* dense_in, int64_t n_in, int64_t& k);
  // The stacks of a site's matrices (`as_is`: one matrix already channel-major, read uncopied).
  static std::vector<Stack> site_stacks(ThreadPool& pool, const std::vector<const TensorView*>& mats,
                                        cpu::NeuronMajorType choice, bool as_is);
  // x[0..n_in) restricted to its kept entries (ids_, vals_) times each of a site's matrices,
  // into dst[m][0..rows of matrix m) (overwritten).
  void site_product(ThreadPool& pool, const std::vector<Stack>& stacks, int64_t n_kept,
                    std::initializer_list<float*> dst);
  // Zeroes the entries at or below t in x (n rows of width w): the batch path's input.
  static void mask(ThreadPool& pool, float* x, int64_t n, int64_t w, float t);
  static void mask(float* x, int64_t count, float t);  // one thread
  int64_t keep(int64_t layer, InputSite site, const float* x, int64_t n_in);
  // A dense site's decode input: x masked in place, the kept entries counted as keep() counts them
  // (`runs` times: a mixture's input read by each chosen expert).
  void keep_and_mask(int64_t layer, InputSite site, float* x, int64_t n_in, uint64_t runs = 1);

  const Model& model_;
  InputThresholds thr_;
  std::vector<LayerCopies> copies_;
  std::vector<std::vector<ExpertCopies>> experts_;  // per layer: a mixture's, per expert (else empty)
  std::vector<std::array<bool, kInputSites>> has_copy_;
  std::vector<std::array<int64_t, kInputSites>> max_kept_;  // per site with a copy: input_copy_max_kept
  std::vector<int32_t> ids_;
  std::vector<float> vals_;
  std::vector<float> axpy_scratch_;
  std::vector<float> stack_out_;  // a stack's outputs before they are handed out
  AlignedBuffer<float> xm_;  // batches: the FFN's masked input
  InputSparsityStats stats_;
};

}  // namespace ember
