// The block allocation of input sparsity (sparse/input_allocation.hpp): TEAL's greedy on the
// measured error of each layer's output.
//
// The calibration tokens run through the dense model layer by layer (in sequences spread over the
// text, each from a BOS where the model expects one, as a prompt and perplexity's chunks start); at each layer its dense
// input X and output Y are kept, and the greedy starts from every site keeping all its inputs.
// A step raises the layer's share of weights skipped by `step` (less at the last, to land on the
// target): it tries each site at once, its quantile index raised by as many thousandths as skip
// that share of the layer's weights (fewer where the site's cap of 95 % stops it), runs the layer
// on X with those thresholds (the executor's prompt path: the dense kernels on masked inputs,
// input mode's own function), and keeps the site whose output moved least from Y per weight
// skipped. Then Y, not the sparse output, goes on to the next layer (TEAL's per-block calibration:
// each layer is allocated for the inputs the dense model gives it).
//
// With BlockAllocationOptions::paying_sites_only (`sparsify --paying-sites`), only sites whose
// skipped inputs save decode time take a share: a site keeps an input-channel-major copy, and reads it, only where its kept
// rows read faster than the dense kernels (input_site_max_kept / input_copy_pays, the executor's
// own rule); below that its tokens run the dense kernels on masked inputs, reading every weight.
// So where a layer has sites whose copy can pay, the others keep every input, and a site the
// greedy leaves below its break-even is closed and the layer allocated again without it: the
// share is then weights a decode token really skips. A layer with no such site (SmolLM2's short
// rows: none) is allocated over all four for accuracy alone. It buys speed with accuracy, by how
// much depends on the model (docs/agreement.md): so it is asked for, not the default.
//
// The output is compared as the next layer sees it: through that layer's input norm (the head's
// after the last layer), TEAL's block error taken where it is read. Compared raw, the residual
// stream's few huge entries (Gemma's, the first token's of every sequence) outweigh everything
// else: on Gemma-3-270M at 40 % the raw comparison's allocation made 1.8x the KL divergence of the
// energy greedy (docs/agreement.md, twenty-third session).
//
// The cost: per layer and step one layer run per open site, on `tokens` tokens: at a 50 % target
// and steps of 2 %, up to 100 layer runs of 256 tokens per layer, again for each reallocation
// (SmolLM2-135M: about a second a layer on two cores; the 7B shape: about a minute).
#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "core/error.hpp"
#include "core/timer.hpp"
#include "model/blocks.hpp"
#include "sparse/input_allocation.hpp"
#include "sparse/input_allocation_steps.hpp"
#include "sparse/input_sparse.hpp"

namespace ember {

InputSparsityPlan allocate_input_sparsity_by_block(const Profile& p, const Model& model, double target,
                                                   ThreadPool& pool, const std::vector<int32_t>& tokens,
                                                   const BlockAllocationOptions& o,
                                                   const std::function<void(int64_t, const std::string&)>& progress) {
  check_allocation_inputs(p, model, target);
  const Hparams& hp = model.hp;
  EMBER_CHECK(o.chunk >= 2 && o.tokens >= 2, "block allocation: {} tokens in sequences of {} (need 2 or more of "
              "each)", o.tokens, o.chunk);
  EMBER_CHECK(o.step > 0 && o.step <= 0.5, "block allocation: step {} must be in (0, 0.5]", o.step);
  const int64_t have = static_cast<int64_t>(tokens.size());
  const int64_t chunk = std::min({o.chunk, o.tokens, have, hp.n_ctx_train});
  EMBER_CHECK(chunk >= 16, "block allocation: the calibration text has {} tokens; it needs at least 16", have);
  const int64_t n_seq = std::max<int64_t>(1, std::min(o.tokens, have) / chunk);
  const int64_t n = n_seq * chunk;
  for (int32_t t : tokens)
    EMBER_CHECK(t >= 0 && t < hp.n_vocab, "block allocation: token id {} out of the vocabulary ({})", t, hp.n_vocab);

  // The sequences, spread evenly over the text, one batch.
  std::vector<int32_t> batch;
  std::vector<KvCache> kv(static_cast<size_t>(n_seq));
  std::vector<SeqSpan> seqs;
  EMBER_CHECK(o.bos < hp.n_vocab, "block allocation: BOS id {} out of the vocabulary ({})", o.bos, hp.n_vocab);
  const int64_t text = o.bos >= 0 ? chunk - 1 : chunk;  // text tokens per sequence
  // The text's own leading BOS (the tokenizer adds one) is not read as text after ours.
  const int64_t first = o.bos >= 0 && tokens[0] == o.bos ? 1 : 0;
  for (int64_t i = 0; i < n_seq; ++i) {
    const int64_t start = first + (n_seq == 1 ? 0 : i * (have - first - text) / (n_seq - 1));
    if (o.bos >= 0) batch.push_back(o.bos);
    batch.insert(batch.end(), tokens.begin() + start, tokens.begin() + start + text);
    kv[static_cast<size_t>(i)].init(hp.n_layer, chunk, hp.n_head_kv * hp.head_dim, DType::F32);
    seqs.push_back(SeqSpan{&kv[static_cast<size_t>(i)], i * chunk, chunk, 0, i});
  }
  Workspace ws;
  ws.init(model, n, chunk, pool.size());
  // The prompt path only (no copies: every site dense), thresholds set per candidate.
  InputThresholds none(static_cast<size_t>(hp.n_layer));
  for (auto& t : none) t.fill(-1.0f);
  InputSparseExecutor exec(model, pool, none, cpu::NeuronMajorType::exact, n, kInputNoCopies, false);

  const size_t width = static_cast<size_t>(n * hp.n_embd);
  std::vector<float> x(width), y(width);
  embed_seqs(model, batch.data(), seqs, ws.x.data(), ws.o.data());
  const int64_t nq = kQuantiles;
  std::vector<std::array<int64_t, kInputSites>> idx(static_cast<size_t>(hp.n_layer));
  std::vector<double> rel_error(static_cast<size_t>(hp.n_layer), 0.0);
  Timer timer;
  std::vector<float> seen_x(width), seen_y(width), seen(width);
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    // What the next consumer of the residual stream sees of a layer output: its norm (the next
    // layer's attention norm, the head's after the last layer).
    const bool last = l + 1 == hp.n_layer;
    const LayerWeights* next = last ? nullptr : &model.layers[static_cast<size_t>(l + 1)];
    const auto seen_by_next = [&](const float* v, float* out) {
      apply_norm(model, last ? model.output_norm : next->attn_norm, last ? model.output_norm_b : next->attn_norm_b, v,
                 out, n);
    };
    // The dense layer: its input x and output y.
    std::copy_n(ws.x.data(), width, x.data());
    ws.proj = nullptr;
    ws.ffn = nullptr;
    cpu_layer(model, l, pool, seqs, ws, n);
    std::copy_n(ws.x.data(), width, y.data());
    seen_by_next(x.data(), seen_x.data());
    seen_by_next(y.data(), seen_y.data());
    double update = 0;
    for (size_t i = 0; i < width; ++i) update += static_cast<double>(seen_y[i] - seen_x[i]) * (seen_y[i] - seen_x[i]);

    const std::vector<float>& q = p.input_quantiles[static_cast<size_t>(l)];
    auto error_at = [&](const std::array<int64_t, kInputSites>& k) {
      std::array<float, kInputSites> t{};
      for (int s = 0; s < kInputSites; ++s) t[s] = k[s] == 0 ? -1.0f : q[static_cast<size_t>(s * nq + k[s])];
      exec.set_thresholds(l, t);
      std::copy_n(x.data(), width, ws.x.data());
      ws.proj = &exec;
      ws.ffn = &exec;
      cpu_layer(model, l, pool, seqs, ws, n);
      seen_by_next(ws.x.data(), seen.data());
      double e = 0;
      for (size_t i = 0; i < width; ++i) e += static_cast<double>(seen[i] - seen_y[i]) * (seen[i] - seen_y[i]);
      return e;
    };

    const LayerWeights& L = model.layers[static_cast<size_t>(l)];
    const std::array<double, kInputSites> w = input_site_weights(L);
    double w_layer = 0;
    for (double v : w) w_layer += v;
    const double want = target * w_layer * 1000.0;  // in weight x quantile-index units
    // The greedy over the open sites: the quantile indices and the error they leave.
    const auto greedy = [&](const std::array<bool, kInputSites>& open) {
      std::array<int64_t, kInputSites> k{};
      double got = 0, err = 0;
      while (got + 0.5 * w_layer < want) {  // within half a thousandth of the layer's weights
        const double share = std::min(o.step * w_layer * 1000.0, want - got);
        int best = -1;
        double best_cost = 0, best_err = 0;
        int64_t best_inc = 0;
        for (int s = 0; s < kInputSites; ++s) {
          if (!open[s] || w[s] <= 0 || k[s] >= kMaxQuantileIndex) continue;
          const int64_t inc = std::min(std::max<int64_t>(1, std::llround(share / w[s])), kMaxQuantileIndex - k[s]);
          std::array<int64_t, kInputSites> cand = k;
          cand[s] += inc;
          const double e = error_at(cand);
          const double cost = (e - err) / (w[s] * static_cast<double>(inc));
          if (best < 0 || cost < best_cost) best = s, best_cost = cost, best_err = e, best_inc = inc;
        }
        if (best < 0) break;  // every open site at its cap
        k[best] += best_inc;
        got += w[best] * static_cast<double>(best_inc);
        err = best_err;
      }
      return std::pair{k, err};
    };
    // Sites whose skipped inputs would save decode time: those with a copy that can pay. Where
    // some can, the others stay whole, and a site the greedy leaves below its copy's break-even
    // is closed and the layer allocated again without it (its inputs would decode dense).
    std::array<bool, kInputSites> open{};
    std::array<int64_t, kInputSites> max_kept{}, n_in{};
    const InputSiteMatrices mats = input_site_matrices(L);
    bool any_pays = false;
    for (int s = 0; s < kInputSites; ++s) {
      max_kept[s] = input_site_max_kept(model.file_layer(static_cast<size_t>(l)), L, s, o.copy_type);
      n_in[s] = mats.site[static_cast<size_t>(s)][0]->cols();
      any_pays = any_pays || max_kept[s] != kInputCopyNone;
    }
    const bool paying_only = o.paying_sites_only && any_pays;
    for (int s = 0; s < kInputSites; ++s) open[s] = !paying_only || max_kept[s] != kInputCopyNone;
    auto [k, err] = greedy(open);
    for (bool closed = paying_only; closed;) {
      closed = false;
      for (int s = 0; s < kInputSites; ++s)
        if (open[s] && k[s] > 0 && !input_copy_pays(max_kept[s], k[s] / 1000.0, n_in[s])) open[s] = false, closed = true;
      if (closed) std::tie(k, err) = greedy(open);
    }
    idx[static_cast<size_t>(l)] = k;
    rel_error[static_cast<size_t>(l)] = update > 0 ? err / update : 0.0;  // both as the next layer sees them
    std::copy_n(y.data(), width, ws.x.data());  // the dense output feeds the next layer
    if (progress)
      progress(l, fmt::format("sparsity attn_in {:.3f} attn_out {:.3f} ffn_in {:.3f} ffn_hidden {:.3f}, output error "
                              "{:.4f} of the layer's update ({:.0f} s)",
                              k[0] / 1000.0, k[1] / 1000.0, k[2] / 1000.0, k[3] / 1000.0,
                              rel_error[static_cast<size_t>(l)], timer.seconds()));
  }
  ws.proj = nullptr;
  ws.ffn = nullptr;
  InputSparsityPlan plan = input_plan_from_indices(p, model, idx);
  plan.block_error = std::move(rel_error);
  return plan;
}

}  // namespace ember
