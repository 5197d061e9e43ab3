// `ember bench`: prompt-processing and generation throughput, like llama-bench.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.hpp"
#include "model/expert_cache.hpp"
#include "common.hpp"
#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "ops/cpu/vec.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "ops/cpu/bandwidth.hpp"

namespace ember::cli {
namespace {

struct BenchFlags {
  EngineFlags engine;
  int n_prompt = 512;
  int n_gen = 128;
  int depth = 0;  // tokens already in the context when each test starts (llama-bench's -d)
  int reps = 5;
  int seqs = 1;   // sequences generating together (continuous batching's step), as llama-batched-bench
  std::string json_path;
  bool bandwidth = false;
  // Input mode against its own dense path in the same process (Session::set_dense): each
  // repetition times both, in alternating order, and the ratios are taken pair by pair.
  bool versus_dense = false;
};

struct Stats {
  double median = 0, min = 0, max = 0, stddev = 0;
};

Stats stats_of(std::vector<double> v) {
  Stats s;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  double mean = 0;
  for (double x : v) mean += x / n;
  for (double x : v) s.stddev += (x - mean) * (x - mean) / std::max<size_t>(n - 1, 1);
  s.stddev = std::sqrt(s.stddev);
  return s;
}

void run_bench(const BenchFlags& f) {
  auto model = load_model_logged(f.engine, nullptr);
  // The memory tier reads only what each token needs (the experts chosen, the rows that fire).
  if (!model->expert_cache && model->resident_weight_budget == 0) model->file->prefetch();
  SessionParams sp = f.engine.session_params(*model);
  sp.n_seq = f.seqs;
  sp.n_ctx = std::max<int64_t>(sp.n_ctx, int64_t{f.depth} + f.n_prompt + f.n_gen + 1);
  Session session(*model, sp);
  EMBER_CHECK(!f.versus_dense || session.input_sparse(), "--versus-dense times input sparsity against the dense path in "
              "one process: give --sparse-mode input (a model made by `ember sparsify`, or --sparse-profile with "
              "--sparsity); this session runs {}", f.engine.resolved_sparse_mode(*model));
  EMBER_CHECK(int64_t{f.depth} + f.n_prompt + f.n_gen < session.n_ctx(),
              "-d {} plus -p {} plus -n {} does not fit the model's context of {}", f.depth, f.n_prompt, f.n_gen,
              session.n_ctx());
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(model->hp.n_vocab - 1));
  std::vector<int32_t> prompt(std::max(f.n_prompt, 1)), context(static_cast<size_t>(f.depth));
  for (auto& t : prompt) t = pick(rng);
  for (auto& t : context) t = pick(rng);
  // Each test starts from `depth` tokens of context (evaluated untimed).
  auto start = [&] {
    for (int s = 0; s < f.seqs; ++s) {
      session.reset(s);
      if (f.depth > 0) session.eval(context.data(), f.depth, s);
    }
  };

  auto time_pp = [&] {
    start();
    Timer t;
    session.eval(prompt.data(), f.n_prompt);
    return f.n_prompt / t.seconds();
  };
  // Every sequence generates n_gen tokens, all of them in each step: tokens/s counts them all.
  std::vector<int32_t> toks(static_cast<size_t>(f.seqs));
  std::vector<Session::SeqEval> items(static_cast<size_t>(f.seqs));
  auto time_tg = [&] {
    start();
    for (int s = 0; s < f.seqs; ++s) toks[static_cast<size_t>(s)] = prompt[static_cast<size_t>(s) % prompt.size()];
    if (HybridExecutor* hy = session.hybrid()) hy->reset_stats();  // its breakdown: of the last decode run
    if (model->expert_cache) model->expert_cache->reset_stats();
    if (SparseFfn* sp = session.sparse_ffn()) sp->reset_map_read_stats();
    Timer t;
    for (int i = 0; i < f.n_gen; ++i) {
      for (int s = 0; s < f.seqs; ++s) items[static_cast<size_t>(s)] = {s, &toks[static_cast<size_t>(s)], 1};
      session.eval_seqs(items);
      for (int s = 0; s < f.seqs; ++s)
        toks[static_cast<size_t>(s)] = static_cast<int32_t>(cpu::argmax_f32(session.logits(s), model->hp.n_vocab));
    }
    return static_cast<double>(f.n_gen) * f.seqs / t.seconds();
  };

  // One untimed warm-up of each (pages the weights in, settles the clocks). With --versus-dense
  // each repetition runs input sparsity's path and the dense path, input first in even
  // repetitions and dense first in odd ones, so that a drift of the machine falls on both alike.
  const int paths = f.versus_dense ? 2 : 1;
  std::vector<double> pp, tg, pp_dense, tg_dense, bws;
  for (int r = -1; r < f.reps; ++r) {
    // Each repetition its own prompt (the pair of --versus-dense shares it): a greedy decode from
    // the warm-up's prompt would retrace its tokens, and with them what a cache kept (the memory
    // tier's experts).
    if (r >= 0)
      for (auto& t : prompt) t = pick(rng);
    for (int k = 0; k < paths; ++k) {
      const bool dense = f.versus_dense && (k == 1) == (r % 2 == 0 || r < 0);
      if (f.versus_dense) session.set_dense(dense);
      const double p = f.n_prompt > 0 ? time_pp() : 0, g = f.n_gen > 0 ? time_tg() : 0;
      if (r < 0) continue;
      if (f.n_prompt > 0) (dense ? pp_dense : pp).push_back(p);
      if (f.n_gen > 0) (dense ? tg_dense : tg).push_back(g);
    }
    // The box's read bandwidth beside each repetition: it drifts within minutes on shared machines.
    if (r >= 0 && f.bandwidth && f.n_gen > 0) bws.push_back(cpu::measure_read_bandwidth(session.pool(), size_t{1} << 30));
    if (r >= 0) log_info("repetition {}/{} done", r + 1, f.reps);
  }
  if (f.versus_dense) session.set_dense(false);

  const double bw = bws.empty() ? 0.0 : stats_of(bws).median;
  const double bytes_per_token = static_cast<double>(model->weight_bytes_per_token());
  nlohmann::json out;
  out["model"] = f.engine.model_path;
  out["model_bytes"] = model->file_bytes();
  out["weight_bytes_per_token"] = bytes_per_token;
  out["threads"] = session.n_threads();
  out["kernels"] = simd_level_name(simd_level());
  out["weight_prefetch"] = cpu_features().stream_prefetch;
  out["tile_prefetch"] = cpu_features().tile_prefetch;
  out["repetitions"] = f.reps;
  out["kv_type"] = f.engine.kv_type;
  out["depth"] = f.depth;
  out["seqs"] = f.seqs;
  std::printf("kernels: %s%s, weight streams %s%s\n", simd_level_name(simd_level()),
              std::getenv("EMBER_SIMD") ? " (set by EMBER_SIMD)" : "", prefetch_summary(cpu_features()),
              cpu_features().stream_prefetch_forced ? " (set by EMBER_PREFETCH)" : "");
  std::printf("| model | threads | test | tokens/s (median) | min | max | stddev |\n");
  std::printf("| --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
  auto row = [&](const char* name, int n, const std::vector<double>& v) {
    if (v.empty()) return;
    Stats s = stats_of(v);
    std::string test = fmt::format("{}{}", name, n);
    if (name[0] == 't' && f.seqs > 1) test += fmt::format("x{}", f.seqs);
    if (f.depth > 0) test += fmt::format("@d{}", f.depth);
    std::printf("| %s | %d | %s | %.2f | %.2f | %.2f | %.2f |\n", f.engine.model_path.c_str(), session.n_threads(),
                test.c_str(), s.median, s.min, s.max, s.stddev);
    out[test] = {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"stddev", s.stddev}, {"samples", v}};
  };
  row("pp", f.n_prompt, pp);
  row("tg", f.n_gen, tg);
  if (f.versus_dense) {
    // The dense path's rows, then each test's ratio repetition by repetition (the pairs ran
    // seconds apart) beside the ratio of the medians.
    std::vector<std::string> versus_lines;
    auto versus = [&](const char* name, int n, const std::vector<double>& own, const std::vector<double>& dense) {
      if (own.empty()) return;
      const std::string test = fmt::format("{}{}", name, n);
      const Stats d = stats_of(dense);
      std::printf("| %s | %d | %s dense | %.2f | %.2f | %.2f | %.2f |\n", f.engine.model_path.c_str(),
                  session.n_threads(), test.c_str(), d.median, d.min, d.max, d.stddev);
      std::vector<double> ratios(own.size());
      for (size_t i = 0; i < own.size(); ++i) ratios[i] = own[i] / dense[i];
      const Stats q = stats_of(ratios);
      out["versus_dense"][test] = {{"dense", {{"median", d.median}, {"min", d.min}, {"max", d.max}, {"samples", dense}}},
                                   {"ratios", ratios}, {"ratio_median", q.median},
                                   {"ratio_of_medians", stats_of(own).median / d.median}};
      versus_lines.push_back(fmt::format("{} / dense, pair by pair: median {:.3f}x (min {:.3f}, max {:.3f}, {} pairs); "
                                         "ratio of the medians {:.3f}x", test, q.median, q.min, q.max, ratios.size(),
                                         stats_of(own).median / d.median));
    };
    versus("pp", f.n_prompt, pp, pp_dense);
    versus("tg", f.n_gen, tg, tg_dense);
    std::printf("\n");
    for (const std::string& l : versus_lines) std::printf("%s\n", l.c_str());
  }
  if (!tg.empty()) {
    const auto reads = [&](double tok_s) { return tok_s / f.seqs * bytes_per_token; };  // one read of the weights per step
    const double achieved = reads(stats_of(tg).median);
    out["tg_weight_bytes_per_s"] = achieved;
    std::printf("\ngeneration reads %.2f GB/s of weights", achieved / 1e9);
    if (const double experts = static_cast<double>(model->expert_bytes_per_token()); experts > 0) {
      out["expert_bytes_per_token"] = experts;
      std::printf(" (the chosen experts: %.1f of %.1f MB a token, %.2f GB/s)", experts / 1e6, bytes_per_token / 1e6,
                  reads(stats_of(tg).median) * experts / bytes_per_token / 1e9);
    }
    if (bw > 0) {
      // Repetition by repetition (each beside its own bandwidth measure), then the median.
      std::vector<double> fractions;
      for (size_t i = 0; i < tg.size() && i < bws.size(); ++i) fractions.push_back(reads(tg[i]) / bws[i]);
      const double fraction = stats_of(fractions).median;
      out["read_bandwidth_bytes_per_s"] = bw;
      out["read_bandwidth_samples"] = bws;
      out["tg_bandwidth_fraction"] = fraction;
      std::printf(" = %.1f%% of the measured read bandwidth (median of %zu repetitions, each beside its own measure; "
                  "bandwidth median %.2f GB/s)", 100 * fraction, fractions.size(), bw / 1e9);
    }
    std::printf("\n");
  }
  if (const ExpertCache* c = model->expert_cache.get(); c && !tg.empty()) {  // of the last decode run
    const ExpertCacheStats& st = c->stats();
    const double tokens = static_cast<double>(f.n_gen) * f.seqs;
    out["expert_cache"] = {{"slots", c->slots()}, {"bytes", c->bytes()}, {"hit_rate", st.hit_rate()},
                           {"bytes_read_per_token", st.bytes_read / tokens},
                           {"read_seconds_per_token", st.read_seconds / tokens}, {"direct_io", c->direct_io()},
                           {"read_ahead_per_token", st.read_ahead / tokens},
                           {"guesses_chosen", st.guesses ? static_cast<double>(st.guesses_chosen) / st.guesses : 0.0},
                           {"read_ahead_used", st.read_ahead ? static_cast<double>(st.read_ahead_used) / st.read_ahead : 0.0}};
    std::printf("memory tier: %lld experts held (%.1f MiB of a %.1f MiB budget); last decode run: %.1f%% of the "
                "chosen experts held, %.1f MB read a token, %.1f ms a token waiting on reads",
                static_cast<long long>(c->slots()), c->bytes() / 1048576.0, c->tier().budget / 1048576.0,
                100 * st.hit_rate(), st.bytes_read / tokens / 1e6, 1e3 * st.read_seconds / tokens);
    if (st.read_ahead > 0)
      std::printf("; %.1f experts a token read ahead, %.0f%% of them then chosen", st.read_ahead / tokens,
                  100.0 * st.read_ahead_used / st.read_ahead);
    else
      std::printf(" (%.0f MB/s)", st.read_seconds > 0 ? st.bytes_read / st.read_seconds / 1e6 : 0.0);
    if (st.guesses > 0)
      std::printf("; the next layer's router guessed %.0f%% of the experts chosen%s",
                  100.0 * st.guesses_chosen / st.guesses,
                  c->read_ahead_mode() == ReadAhead::automatic && st.read_ahead == 0
                      ? " (auto: none read ahead, where it would not pay)"
                      : "");
    std::printf("\n");
  }
  if (const SparseFfn* sp = session.sparse_ffn(); sp && sp->map_read_stats() && !tg.empty()) {  // of the last decode run
    const MapReadStats& st = *sp->map_read_stats();
    const double tokens = static_cast<double>(f.n_gen) * f.seqs;
    const double kept = st.rows ? static_cast<double>(st.kept_rows) / static_cast<double>(st.rows) : 0.0;
    out["map_reads"] = {{"resident_weight_budget", model->resident_weight_budget},
                        {"rows_kept_resident", kept}, {"pages_per_token", st.pages / tokens},
                        {"runs_per_token", st.runs / tokens}, {"read_seconds_per_token", st.seconds / tokens}};
    std::printf("memory tier: %.1f MiB of weights resident; last decode run: %.1f%% of the neuron rows asked for kept "
                "resident, %.0f pages of FFN rows made resident from the file's map a token (%.1f MB in %.0f runs; "
                "those the page cache held cost no read), %.1f ms a token waiting on them (%.0f MB/s)\n",
                model->resident_weight_budget / 1048576.0, 100 * kept, st.pages / tokens,
                st.pages * 4096.0 / tokens / 1e6, st.runs / tokens, 1e3 * st.seconds / tokens,
                st.seconds > 0 ? st.pages * 4096.0 / st.seconds / 1e6 : 0.0);
  }
  out["sparse_mode"] = f.engine.resolved_sparse_mode(*model);
  if (SparseFfn* sp = session.sparse_ffn()) {
    out["ffn_sparsity"] = sp->stats().sparsity();
    out["sparse_extra_bytes"] = sp->bytes();
    std::printf("FFN sparsity (%s): %.1f%% of neurons inactive; neuron-major down copies %.1f MiB\n",
                f.engine.resolved_sparse_mode(*model).c_str(), 100.0 * sp->stats().sparsity(), sp->neuron_major_bytes() / 1048576.0);
    // Decode reads only the rows it computes: the bytes the sparse path really streams.
    const double sparse_bytes = sp->weight_bytes_per_token();
    if (!tg.empty() && sparse_bytes > 0) {
      out["sparse_weight_bytes_per_token"] = sparse_bytes;
      std::printf("sparse path reads %.1f MB of weights per token (dense %.1f MB): %.2f GB/s\n", sparse_bytes / 1e6,
                  bytes_per_token / 1e6, stats_of(tg).median * sparse_bytes / 1e9);
    }
    log_ffn_sparsity(session);
  }
  if (InputSparseExecutor* in = session.input_sparse()) {
    const double input_bytes = in->weight_bytes_per_token();
    out["input_sparsity"] = in->stats().sparsity();
    out["sparse_extra_bytes"] = in->bytes();
    if (!tg.empty() && input_bytes > 0) {
      out["sparse_weight_bytes_per_token"] = input_bytes;
      std::printf("input sparsity: %.1f%% of the layers' weights meet zeroed inputs; %.1f MB of weights per token (dense %.1f MB, "
                  "ideal %.2fx): %.2f GB/s; input-channel-major copies %.1f MiB\n",
                  100.0 * in->stats().sparsity(), input_bytes / 1e6, bytes_per_token / 1e6, bytes_per_token / input_bytes,
                  stats_of(tg).median * input_bytes / 1e9, in->copy_bytes() / 1048576.0);
    }
    log_ffn_sparsity(session);
  }
  if (HybridExecutor* hy = session.hybrid(); hy && !tg.empty()) {
    // Where a decode token's time went, over the last decode run (HybridStats).
    const HybridStats st = hy->stats();
    const DeviceCounters dc = hy->device().stats().counters;
    // Per decode step (all sequences' tokens of a step together), as the device counted them.
    const double steps = static_cast<double>(f.n_gen), n = steps * f.seqs, ms = 1e3 / n;
    const uint64_t fired = st.device_fired + st.cpu_fired, runs = st.device_expert_runs + st.cpu_expert_runs;
    out["hybrid"] = {{"device", hy->device().name()},
                     {"device_fired_share", fired ? static_cast<double>(st.device_fired) / fired : 0.0},
                     {"device_expert_share", runs ? static_cast<double>(st.device_expert_runs) / runs : 0.0},
                     {"cpu_ffn_ms_per_token", st.cpu_ffn_seconds * ms},
                     {"wait_ms_per_token", st.wait_seconds * ms},
                     {"device_block_ms_per_token", st.device_block_seconds * ms},
                     {"cpu_layer_ms_per_token", st.cpu_layer_seconds * ms},
                     {"launches_per_step", static_cast<double>(dc.launches) / steps},
                     {"graphs_per_step", static_cast<double>(dc.graphs) / steps},
                     {"graph_nodes_per_step", static_cast<double>(dc.graph_nodes) / steps},
                     {"host_waits_per_step", static_cast<double>(dc.host_waits) / steps},
                     {"bytes_in_per_step", static_cast<double>(dc.bytes_in) / steps},
                     {"bytes_out_per_step", static_cast<double>(dc.bytes_out) / steps}};
    const std::string share = runs ? fmt::format("{:.1f}% of the chosen experts' runs", 100.0 * st.device_expert_runs / runs)
                                   : fmt::format("{:.1f}% of the firing neurons", fired ? 100.0 * st.device_fired / fired : 0.0);
    std::printf("hybrid decode per token (last run, device %s): CPU FFN shares %.3f ms, waiting for the device %.3f ms, "
                "device blocks and boundaries %.3f ms, CPU layers %.3f ms; %s on the device\n",
                hy->device().name(), st.cpu_ffn_seconds * ms, st.wait_seconds * ms, st.device_block_seconds * ms,
                st.cpu_layer_seconds * ms, share.c_str());
    std::printf("device per decode step: %.1f kernel launches, %.2f graph replays (%.1f nodes), %.2f host waits, "
                "%.1f KiB in, %.1f KiB out\n", dc.launches / steps, dc.graphs / steps, dc.graph_nodes / steps,
                dc.host_waits / steps, dc.bytes_in / steps / 1024, dc.bytes_out / steps / 1024);
  }
  out["peak_rss_bytes"] = peak_rss_bytes();
  std::printf("peak RSS: %.1f MiB\n", peak_rss_bytes() / 1048576.0);
  std::printf("%s\n", out.dump().c_str());
  if (!f.json_path.empty()) {
    std::ofstream js(f.json_path);
    EMBER_CHECK(js, "cannot write '{}'", f.json_path);
    js << out.dump(2) << "\n";
  }
}

}  // namespace

void add_bench(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "measure prompt processing and generation speed");
  f->engine.add_to(cmd);
  cmd->add_option("-p,--n-prompt", f->n_prompt, "prompt tokens (0 = skip)")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-n,--n-gen", f->n_gen, "generated tokens (0 = skip)")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-d,--depth", f->depth, "tokens already in the context when each test starts (as llama-bench -d)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--seqs", f->seqs,
                  "sequences generating together: each step of the tg test is one forward pass over one token of "
                  "each (the server's continuous batching); tokens/s counts all of them")
      ->check(CLI::Range(1, 256));
  cmd->add_option("-r,--repetitions", f->reps, "repetitions")->check(CLI::Range(1, 1000));
  cmd->add_option("--json", f->json_path, "also write the results as JSON to this file");
  cmd->add_flag("--bandwidth", f->bandwidth, "also measure the machine's memory read bandwidth");
  cmd->add_flag("--versus-dense", f->versus_dense,
                "input mode: also time the dense path in the same process (the same matrices, a dense session's "
                "kernels), alternating with input sparsity's runs repetition by repetition, and report the ratios "
                "pair by pair");
  cmd->callback([f] { run_bench(*f); });
}

}  // namespace ember::cli
