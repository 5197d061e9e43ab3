// The block allocation of input sparsity (sparse/input_allocation.hpp): TEAL's greedy on the
// measured error of each layer's output.
//
// The calibration tokens run through the dense model layer by layer (in sequences spread over the
// text, each from a BOS where the model expects one, as a prompt and perplexity's chunks start); at each layer its dense
// input X and output Y are kept, and the greedy starts from every site keeping all its inputs.
// A step raises the layer's share of weights skipped by `step` (less at the last, to land on the
// target) at one site: a site's candidate raises its quantile index by as many thousandths as skip
// that share of the layer's weights (fewer where the site's cap of 95 % stops it) and runs the
// layer on X with those thresholds (the executor's prompt path: the dense kernels on masked
// inputs, input mode's own function); its cost is the output's move from Y per weight skipped.
// The step takes the cheapest. Then Y, not the sparse output, goes on to the next layer (TEAL's
// per-block calibration: each layer is allocated for the inputs the dense model gives it).
//
// Two things keep the runs few. A candidate runs the layer only from its site on: the stages
// before it (the attention heads, the residual after attention, the FFN's neuron values) are the
// current indices', kept from the candidate the last step took, so a down candidate costs one
// product, not the layer (BlockAllocationOptions::whole_layers runs them whole: the same plan,
// tested). And a step does not try every site again (TEAL's greedy; every_candidate): a site's
// cost grows as the layer gets sparser, so the cost it had when last tried is close to a bound;
// the step tries the site cheapest by those costs at the current indices, and takes it if it
// is still the cheapest, else tries the next cheapest (about two runs a step, not one per site;
// the 7B shape's plan moved by under 1 % of a site's share, the same output error). A mixture's
// layer runs its FFN whole from either FFN site (its values are per token and chosen expert).
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
// energy greedy (docs/agreement.md).
//
// The cost: per layer about two partial layer runs a step on `tokens` tokens: at a 50 % target
// and steps of 2 %, about 50 runs, again for each reallocation (the 7B shape: 11 s a layer on two
// Sapphire Rapids cores, 25-50 s with --paying-sites, docs/benchmarks.md).
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
namespace {

// What a layer's run computes before each site's input: the attention heads (attn_out's input),
// the residual after attention (the FFN block's input), the FFN's neuron values (ffn_hidden's).
struct Stages {
  std::vector<float> heads, residual, values;
  Stages(size_t n_heads, size_t n_residual, size_t n_values)
      : heads(n_heads), residual(n_residual), values(n_values) {}
  // Takes the stages a run from site `from` computed (those before it are unchanged).
  void take(Stages& o, int from) {
    if (from == 0) heads.swap(o.heads);
    if (from <= 1) residual.swap(o.residual);
    if (from <= 2) values.swap(o.values);
  }
};

}  // namespace

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
  int64_t n_ff = 0;
  for (const LayerWeights& L : model.layers) n_ff = std::max(n_ff, L.ffn.n_ff());
  const size_t heads = static_cast<size_t>(n * hp.n_head * hp.head_dim), values = static_cast<size_t>(n * n_ff);
  Stages current(heads, width, values);
  std::vector<Stages> tried(kInputSites, Stages(heads, width, values));  // each site's last candidate
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
    const LayerWeights& L = model.layers[static_cast<size_t>(l)];
    const size_t hidden = static_cast<size_t>(n * L.ffn.n_ff());
    // Layer l with the thresholds of indices k, from site `from`'s stage on: the stages before it
    // are taken from `kept` (those of the indices k had before this site's raise), the ones it
    // computes go to `got`; the output to ws.x. The stages: the attention heads (from x, masked
    // at attn_in), the residual after attention (attn_out), the FFN's neuron values (ffn_in); the
    // output (ffn_hidden) is the last.
    const auto run_from = [&](int from, const std::array<int64_t, kInputSites>& k, const Stages& kept, Stages& got) {
      std::array<float, kInputSites> t{};
      for (int s = 0; s < kInputSites; ++s) t[s] = k[s] == 0 ? -1.0f : q[static_cast<size_t>(s * nq + k[s])];
      exec.set_thresholds(l, t);
      ws.proj = &exec;
      ws.ffn = &exec;
      float* h = ws.x.data();
      if (from == 0) {
        attention_heads(model, L, l, pool, seqs, l, ws, x.data(), n);
        std::copy_n(ws.attn.data(), heads, got.heads.data());
      } else if (from == 1) {
        std::copy_n(kept.heads.data(), heads, ws.attn.data());
      }
      if (from <= 1) {
        std::copy_n(x.data(), width, h);
        attention_output(model, L, l, pool, ws, h, n);
        std::copy_n(h, width, got.residual.data());
      } else {
        std::copy_n(kept.residual.data(), width, h);
      }
      if (L.moe.valid()) {  // a mixture: its FFN whole from either FFN site (no values stage kept)
        ffn_block_input(model, L, ws, h, ws.xn.data(), n);
        ws.ffn_residual = h;
        exec.run_moe(pool, l, L.moe, hp.act, ws.xn.data(), n, ws.o.data(), ws);
        return ffn_block_output(model, L, ws.o.data(), h, n);
      }
      float* values = ws.up.data();
      if (from <= 2) {
        ffn_block_input(model, L, ws, h, ws.xn.data(), n);
        values = exec.batch_values(pool, l, L.ffn, hp.act, ws.xn.data(), n, ws);
        std::copy_n(values, hidden, got.values.data());
      } else {
        std::copy_n(kept.values.data(), hidden, values);
      }
      ws.ffn_residual = h;
      exec.batch_down(pool, l, L.ffn, values, n, ws.o.data(), ws);
      ffn_block_output(model, L, ws.o.data(), h, n);
    };
    const auto error_of_output = [&] {
      seen_by_next(ws.x.data(), seen.data());
      double e = 0;
      for (size_t i = 0; i < width; ++i) e += static_cast<double>(seen[i] - seen_y[i]) * (seen[i] - seen_y[i]);
      return e;
    };

    const std::array<double, kInputSites> w = input_site_weights(L);
    double w_layer = 0;
    for (double v : w) w_layer += v;
    const double want = target * w_layer * 1000.0;  // in weight x quantile-index units
    // The greedy over the open sites: the quantile indices and the error they leave.
    const auto greedy = [&](const std::array<bool, kInputSites>& open) {
      std::array<int64_t, kInputSites> k{};
      run_from(0, k, current, current);  // every input kept: the stages every first candidate starts from
      double got = 0, err = 0;
      // Each site's cost (error added per weight skipped) when last tried, and whether that was
      // at the current indices.
      std::array<double, kInputSites> cost{}, error{};
      std::array<int64_t, kInputSites> inc{};
      std::array<bool, kInputSites> tried_once{}, fresh{};
      while (got + 0.5 * w_layer < want) {  // within half a thousandth of the layer's weights
        const double share = std::min(o.step * w_layer * 1000.0, want - got);
        const auto try_site = [&](int s) {
          inc[s] = std::min(std::max<int64_t>(1, std::llround(share / w[s])), kMaxQuantileIndex - k[s]);
          std::array<int64_t, kInputSites> cand = k;
          cand[s] += inc[s];
          run_from(o.whole_layers ? 0 : s, cand, current, tried[static_cast<size_t>(s)]);
          error[s] = error_of_output();
          cost[s] = (error[s] - err) / (w[s] * static_cast<double>(inc[s]));
          tried_once[s] = fresh[s] = true;
        };
        fresh.fill(false);
        int best = -1;
        while (true) {
          best = -1;
          for (int s = 0; s < kInputSites; ++s) {
            if (!open[s] || w[s] <= 0 || k[s] >= kMaxQuantileIndex) continue;
            if (!tried_once[s] || (o.every_candidate && !fresh[s])) try_site(s);
            if (best < 0 || cost[s] < cost[best]) best = s;
          }
          if (best < 0 || fresh[best]) break;
          try_site(best);  // lowest when last tried: tried again at the current indices
        }
        if (best < 0) break;  // every open site at its cap
        k[best] += inc[best];
        current.take(tried[static_cast<size_t>(best)], o.whole_layers ? 0 : best);
        got += w[best] * static_cast<double>(inc[best]);
        err = error[best];
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
