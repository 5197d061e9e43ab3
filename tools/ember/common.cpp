#include "common.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/ranges.h>

#include "core/huge_pages.hpp"
#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "model/expert_cache.hpp"
#include "model/hot_rows.hpp"
#include "model/kv_cache.hpp"
#include "model/workspace.hpp"
#include "sparse/input_allocation.hpp"
#include "sparse/threshold.hpp"
#include "sparse/predictor.hpp"
#include "engine/profile_run.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember::cli {

void EngineFlags::add_to(CLI::App* app, bool model_required) {
  auto* m = app->add_option("-m,--model", model_path, "GGUF model file");
  if (model_required) m->required();
  app->add_option("-t,--threads", threads, "threads (0 = all cores)")->check(CLI::Range(0, 1024));
  app->add_option("-c,--ctx-size", ctx, "context size in tokens (capped at the model's)")->check(CLI::Range(1, 1 << 20));
  app->add_option("-b,--batch-size", batch, "prompt tokens per forward pass")->check(CLI::Range(1, 8192));
  app->add_option("--kv-type", kv_type, "KV cache values: f16 (half the memory, as llama.cpp) or f32")
      ->check(CLI::IsMember({"f16", "f32"}))
      ->capture_default_str();
  app->add_flag("-v,--verbose", verbose, "more log output");
  app->add_option("--sparse-mode", sparse_mode,
                  "auto (the default: input or predictor for a model made by `ember sparsify` or one given "
                  "--predictor, dense otherwise), "
                  "dense, oracle (gate for all neurons, up and down only for the active ones), or "
                  "threshold (as oracle with calibrated per-layer thresholds: --sparse-profile, or the model's), or "
                  "predictor (gate, up and down only for the neurons the predictor names), or input (every matrix "
                  "skips the weights of its input's small entries, TEAL: --sparse-profile and --sparsity, or the "
                  "thresholds of a model from `ember sparsify`)")
      ->check(CLI::IsMember({"auto", "dense", "oracle", "threshold", "predictor", "input"}))
      ->capture_default_str();
  app->add_option("--sparse-threshold", sparse_threshold, "oracle: a neuron is active when |act(gate)| > this")
      ->check(CLI::Range(0.0f, 1e30f));
  app->add_option("--sparse-profile", sparse_profile,
                  "threshold and input modes: calibrate the thresholds from this profile (`ember profile`)");
  app->add_option("--sparsity", sparsity, "target fraction of inactive neurons (threshold mode with --sparse-profile; profile: where "
                  "the per-layer firing thresholds lie); input mode: of the layers' weights skipped")
      ->check(CLI::Range(0.0f, 0.999f))
      ->capture_default_str();
  app->add_option("--input-allocation", input_allocation,
                  "input mode: greedy (per layer, more sparsity where the profile says it costs less error) or "
                  "uniform (every input at --sparsity)")
      ->check(CLI::IsMember({"greedy", "uniform"}))
      ->capture_default_str();
  app->add_option("--input-copies", input_copies,
                  "input mode: auto (a decode token reads a site's input-channel-major copy where that is faster than "
                  "the dense kernels on its masked input) or all (every site has a copy and every decode token reads "
                  "it, whatever it costs: to measure the copies' own accuracy, e.g. `perplexity -b 1`)")
      ->check(CLI::IsMember({"auto", "all"}))
      ->capture_default_str();
  app->add_option("--vram-budget", vram_budget,
                  "hybrid: GPU memory the process may take, e.g. 4GiB, or auto (the GPU's free memory less a margin); "
                  "the plan (FFN neurons, predictors, attention blocks with their KV cache) gets it less CUDA's own "
                  "context (--vram-reserve) and must fit the free memory; computed at load (needs a profile) and "
                  "cached beside the model");
  app->add_option("--vram-reserve", vram_reserve,
                  "hybrid: what the GPU runtime takes of --vram-budget by itself (CUDA's context), e.g. 600MiB "
                  "(default: 512MiB on CUDA, 0 on the CPU stand-in)");
  app->add_option("--plan", plan_path, "hybrid: a plan file from `ember plan` (instead of --vram-budget)");
  app->add_option("--plan-method", plan_method,
                  "hybrid: how --vram-budget is planned: ilp (optimal within a time limit), greedy, or layer-split "
                  "(whole layers from the first, as llama.cpp's -ngl: the baseline)")
      ->check(CLI::IsMember({"ilp", "greedy", "layer-split"}))
      ->capture_default_str();
  app->add_option("--hybrid-device", hybrid_device, "hybrid: auto (CUDA if built and present), cuda, or cpu (stand-in)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
      ->capture_default_str();
  app->add_option("--predictor", predictor_path, "predictor GGUF (ember train-predictor) for --sparse-mode predictor")
      ->check(CLI::ExistingFile);
  app->add_option("--sparse-down", sparse_down,
                  "sparse modes: type of the neuron-major copy of down (input mode: of every copy): auto (compact in "
                  "input mode, exact in the others), exact (Q4_0 / Q4_1 keep their codes and scales, bit-exact in "
                  "the same bytes; other quantized types become Q8_0), compact (as exact, but the scales of Q4_0 / "
                  "Q4_1 / Q4_K held in 8 bits: 9-15 % fewer bytes a kept row, each scale within 1/510 of its 32's "
                  "range), same (the type of down: rounded twice), q8_0, f16 or f32")
      ->check(CLI::IsMember({"auto", "exact", "compact", "same", "q8_0", "f16", "f32"}))
      ->capture_default_str();
  app->add_flag("--no-repack", no_repack,
                "keep weights in the file's layout (by default Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K matrices are repacked 16 rows at a time at load "
                "for faster dense products, as llama.cpp does)");
  app->add_option("--mem-budget", mem_budget,
                  "memory the model may take: a mixture of experts whose experts do not fit keeps everything else "
                  "resident and its experts in a cache of that size, each read from the file when the router first "
                  "chooses it (the same tokens, bit for bit): auto (the cgroup's limit or the memory available, "
                  "used only where the model does not fit), off, or a size (6G, 512M)")
      ->capture_default_str();
  app->add_option("--read-ahead", read_ahead,
                  "under a --mem-budget that holds only some experts, whether the next layer's experts are read while "
                  "this layer computes, as its router guesses them from the current hidden state: auto (while the "
                  "guesses are mostly right), always, or off (each read when chosen)")
      ->check([](const std::string& s) {
        try {
          parse_read_ahead(s);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      })
      ->capture_default_str();
  app->add_flag("--mmap", mmap,
                "use the matrices that are not repacked in place in the file's memory map (by default they are copied "
                "into memory backed by huge pages, like the repacked ones: fewer TLB misses, faster decode; --mmap "
                "saves that copy for a model that barely fits in memory)");
}

std::string EngineFlags::resolved_sparse_mode(const Model& model) const {
  if (sparse_mode != "auto") return sparse_mode;
  if (!model.input_thresholds.empty()) return "input";
  return has_predictors(model) ? "predictor" : "dense";  // the hybrid too runs a model's predictors
}

SessionParams EngineFlags::session_params(const Model& model) const {
  SessionParams p;
  p.n_threads = threads;
  p.n_ctx = ctx;
  p.n_batch = batch;
  p.kv_type = parse_kv_type(kv_type);
  p.sparse.mode = parse_ffn_mode(resolved_sparse_mode(model));
  p.sparse.threshold = sparse_threshold;
  if (input_copies == "all") p.sparse.input_min_row_bytes = 0, p.sparse.input_copy_by_cost = false;
  if (!sparse_profile.empty() && p.sparse.mode == FfnMode::input) {
    const InputSparsityPlan plan =
        allocate_input_sparsity(read_profile(sparse_profile), model, sparsity, parse_input_allocation(input_allocation));
    p.sparse.input_thresholds = plan.thresholds;
    p.sparse.input_sparsity = plan.sparsity;
    log_info("input mode: thresholds for {:.0f}% of the layers' weights ({} allocation) from {}",
             100.0 * plan.weighted_sparsity, input_allocation, sparse_profile);
  } else if (!sparse_profile.empty()) {
    EMBER_CHECK(p.sparse.mode == FfnMode::threshold, "--sparse-profile is for --sparse-mode threshold or input");
    p.sparse.layer_thresholds = calibrate_thresholds(sparse_profile, sparsity);
    log_info("threshold mode: per-layer thresholds for sparsity {:.2f} from {}", sparsity, sparse_profile);
  }
  if (vram_budget == "auto") p.hybrid.vram_auto = true;
  else if (!vram_budget.empty()) p.hybrid.vram_budget = parse_byte_size(vram_budget);
  EMBER_CHECK(vram_budget.empty() || p.hybrid.vram_auto || p.hybrid.vram_budget > 0,
              "--vram-budget must be more than 0 bytes (or auto)");
  if (!vram_reserve.empty()) p.hybrid.vram_reserve = static_cast<int64_t>(parse_byte_size(vram_reserve));
  p.hybrid.plan_path = plan_path;
  p.hybrid.method = parse_plan_method(plan_method);
  p.hybrid.device_kind = hybrid_device;
  p.sparse.down_type = sparse_down == "auto"  ? default_copy_type(p.sparse.mode)
                       : sparse_down == "same"  ? cpu::NeuronMajorType::same
                       : sparse_down == "q8_0" ? cpu::NeuronMajorType::q8_0
                       : sparse_down == "f16" ? cpu::NeuronMajorType::f16
                       : sparse_down == "f32" ? cpu::NeuronMajorType::f32
                       : sparse_down == "compact" ? cpu::NeuronMajorType::compact
                                                  : cpu::NeuronMajorType::exact;
  return p;
}

DenseMemoryTier attach_memory_tier(const EngineFlags& flags, Model& model, FfnMode mode, bool repack) {
  const size_t asked = parse_memory_budget(flags.mem_budget);
  if (asked == 0) return {};
  const size_t budget = asked == SIZE_MAX ? detect_memory_budget() : asked;
  if (budget == 0) return {};
  const Hparams& hp = model.hp;
  const size_t process = anon_rss_bytes();  // before the working buffers below are sized
  log_debug("memory tier: the process holds {:.1f} MiB of anonymous memory before the weights", process / 1048576.0);
  const size_t kv = KvCache::bytes_for(hp.n_layer, flags.ctx > 0 ? flags.ctx : 4096, hp.n_head_kv * hp.head_dim,
                                       flags.kv_type == "f32" ? DType::F32 : DType::F16);
  Workspace ws;  // the session's working buffers, sized as it will size them (then freed)
  ws.init(model, std::max<int64_t>(flags.batch, 1), flags.ctx > 0 ? flags.ctx : 4096,
          flags.threads > 0 ? flags.threads : default_thread_count());
  if (!model_has_moe(model)) {
    // A dense model: what does not fit stays in the file's map (model.resident_weight_budget).
    // The process as it stands (the file's metadata, code) and what it makes later.
    const size_t others = kv + ws.bytes() + process + kMemoryTierReserve;
    if (model.file_bytes() + others <= budget) return {};
    EMBER_CHECK(budget > others, "a memory budget of {:.1f} MiB cannot run {}: the KV cache ({:.1f} MiB), the working "
                "buffers ({:.1f} MiB) and {:.0f} MiB for the process need {:.1f} MiB before any weight: give a larger "
                "--mem-budget, or a shorter context (-c) or batch (-b)",
                budget / 1048576.0, model.file->path(), kv / 1048576.0, ws.bytes() / 1048576.0,
                (process + kMemoryTierReserve) / 1048576.0, others / 1048576.0);
    model.resident_weight_budget = budget - others;
    log_info("memory tier: a budget of {:.1f} MiB ({}) holds the KV cache and working buffers ({:.1f} MiB) and {:.1f} "
             "MiB of the {:.1f} MiB of weights; the rest is read from the file's map as each token needs it{}",
             budget / 1048576.0, asked == SIZE_MAX ? "detected: the cgroup's limit or the memory available" : "given",
             (kv + ws.bytes()) / 1048576.0, model.resident_weight_budget / 1048576.0, model.file_bytes() / 1048576.0,
             flags.batch > 64 ? fmt::format(" (the buffers of a {}-token batch take {:.1f} MiB: -b 64 leaves most of "
                                            "them to weights, faster decode for slower prompts)",
                                            flags.batch, ws.bytes() / 1048576.0)
                              : std::string());
    return {budget, kv + ws.bytes()};
  }
  const MemoryTier tier = plan_memory_tier(model, budget, kv, ws.bytes());
  if (!tier.needed) return {};
  EMBER_CHECK(mode == FfnMode::dense, "the memory tier (its experts do not fit {:.1f} MiB) runs the dense mode only; "
              "pass --sparse-mode dense (or a larger --mem-budget)", budget / 1048576.0);
  model.expert_cache = std::make_shared<ExpertCache>(model, tier, repack, parse_read_ahead(flags.read_ahead));
  log_info("memory tier: a budget of {:.1f} MiB ({}) holds the resident part ({:.1f} MiB with the KV cache) and {} of "
           "the {} experts ({:.1f} of {:.1f} MiB); the others are read from the file when chosen{}",
           budget / 1048576.0, asked == SIZE_MAX ? "detected: the cgroup's limit or the memory available" : "given",
           tier.resident / 1048576.0, tier.slots, tier.experts, tier.slots * tier.slot_bytes / 1048576.0,
           tier.expert_bytes / 1048576.0, model.expert_cache->direct_io() ? " (O_DIRECT)" : "");
  return {};
}

std::unique_ptr<Model> load_model_logged(const EngineFlags& flags, double* load_seconds, RepackScope max_scope) {
  if (flags.verbose) set_log_level(LogLevel::debug);
  Timer timer;
  auto model = load_model(flags.model_path);
  if (!flags.predictor_path.empty()) attach_predictors(*model, flags.predictor_path);
  const bool hybrid = !flags.vram_budget.empty() || !flags.plan_path.empty();
  const FfnMode mode = parse_ffn_mode(flags.resolved_sparse_mode(*model));
  const RepackScope ffn_scope = repack_scope_for(mode, hybrid);
  if (flags.sparse_mode == "auto" && !model->input_thresholds.empty())
    log_info("{} carries input-sparsity thresholds (`ember sparsify`): running --sparse-mode input (pass "
             "--sparse-mode dense for the dense model)", flags.model_path);
  else if (flags.resolved_sparse_mode(*model) == "predictor" && flags.sparse_mode == "auto")
    log_info("{} has activation predictors (`ember sparsify`, `ember prepare`, or --predictor): running "
             "--sparse-mode predictor (pass --sparse-mode dense for the dense model)", flags.model_path);
  const RepackScope scope = flags.no_repack ? RepackScope::none : std::min(max_scope, ffn_scope);
  const DenseMemoryTier dense_tier = attach_memory_tier(flags, *model, mode, scope == RepackScope::all);
  const RepackStats rp =
      repack_for_session(*model, mode, scope, flags.mmap ? ResidentWeights::in_file : ResidentWeights::copy, hybrid);
  if (rp.tensors > 0 || rp.copied_tensors > 0)
    log_info("repacked {} matrices ({:.1f} MiB) 16 rows at a time for the dense kernels{} in {:.2f} s; {:.1f} MiB in "
             "huge pages",
             rp.tensors, rp.bytes / 1048576.0,
             rp.copied_tensors ? fmt::format(", copied {} more ({:.1f} MiB) out of the file{}", rp.copied_tensors,
                                             rp.copied_bytes / 1048576.0,
                                             rp.bundled_layers ? fmt::format(" (the FFN rows of {} layers bundled by "
                                                                             "neuron)", rp.bundled_layers)
                                                               : std::string())
                               : std::string(),
             rp.seconds, rp.huge_page_bytes / 1048576.0);
  if (model->resident_weight_budget > 0) {
    // A neuron-sparse mode reads the FFN rows left in the map a few at a time, wherever the
    // active neurons are: readahead around each would fetch rows no token asked for and push out
    // those that are. The dense kernels read whole matrices, which readahead serves.
    size_t random = 0;
    if (ffn_mode_gathers_rows(mode))
      for (const LayerWeights& l : model->layers)
        for (const TensorView* w : {&l.ffn.gate, &l.ffn.up, &l.ffn.down, &l.ffn.down_t})
          if (w->valid() && model->file->contains(w->data))
            advise_random_reads(w->data, w->span_bytes()), random += w->nbytes;
    log_info("memory tier: {:.1f} MiB repacked or copied, {:.1f} MiB kept in the file's layout, {:.1f} MiB of FFN rows "
             "read at random from the map", (rp.bytes + rp.copied_bytes) / 1048576.0,
             (rp.repack_skipped_bytes + rp.copy_skipped_bytes) / 1048576.0, random / 1048576.0);
    // What the budget leaves, measured: the process's anonymous memory now (the repacked
    // matrices among it) and the session's to come, and a share for the page cache (the rows each
    // token reads pass through it) and buffers made later. The rest holds what every token reads
    // and the hottest neurons (model/hot_rows.hpp).
    const size_t need = anon_rss_bytes() + dense_tier.session_bytes + page_cache_slack(dense_tier.budget);
    if (dense_tier.budget > need) {
      const HotRows h = keep_hot_rows(*model, dense_tier.budget - need);
      log_info("memory tier: kept resident {:.1f} MiB that every token reads and the rows of the {} hottest of {} "
               "neurons ({:.1f} MiB{}) in {:.2f} s", h.every_token_bytes / 1048576.0, h.neurons, h.all_neurons,
               h.neuron_bytes / 1048576.0,
               h.firing_share >= 0 ? fmt::format(", {:.1f}% of the profile's firings", 100 * h.firing_share)
                                   : std::string(", no profile frequencies in the file: an equal count a layer"),
               h.seconds);
    }
  } else if (rp.copy_skipped_bytes > 0)
    log_info("kept {:.1f} MiB of matrices in the file's map: with the repacked ones they need more than 90% of the "
             "memory available now ({:.1f} MiB)",
             rp.copy_skipped_bytes / 1048576.0, available_memory_bytes() / 1048576.0);
  if (load_seconds) *load_seconds = timer.seconds();
  const Hparams& hp = model->hp;
  log_info("model: {} ({}), {} layers, n_embd {}, n_ff {}, heads {}/{} (KV), vocab {}, {:.1f} MiB", flags.model_path,
           hp.arch, hp.n_layer, hp.n_embd, hp.n_ff, hp.n_head, hp.n_head_kv, hp.n_vocab,
           model->file_bytes() / 1048576.0);
  log_debug("kernels: {}", simd_level_name(simd_level()));
  return model;
}

void log_ffn_sparsity(Session& session) {
  if (const HybridExecutor* hy = session.hybrid()) {
    const HybridStats st = hy->stats();
    const uint64_t all = st.device_fired + st.cpu_fired, runs = st.device_expert_runs + st.cpu_expert_runs;
    if (runs > 0)
      log_info("hybrid experts: {} (token, expert) runs, {:.1f}% on the device ({}), {:.1f}% on the CPU", runs,
               100.0 * st.device_expert_runs / runs, hy->device().name(), 100.0 * st.cpu_expert_runs / runs);
    else
      log_info("hybrid FFN: {} fired (token, neuron) pairs, {:.1f}% on the device ({}), {:.1f}% on the CPU", all,
               all ? 100.0 * st.device_fired / all : 0.0, hy->device().name(), all ? 100.0 * st.cpu_fired / all : 0.0);
    const CrossingStats c = hy->device().stats().crossings;
    log_info("hybrid time: CPU FFN shares {:.3f} s, waiting for the device's shares {:.3f} s, device blocks and "
             "boundaries {:.3f} s, CPU layers {:.3f} s; {} hidden-state crossings, {:.1f} MiB moved",
             st.cpu_ffn_seconds, st.wait_seconds, st.device_block_seconds, st.cpu_layer_seconds,
             c.hidden_in + c.hidden_out, c.bytes / 1048576.0);
  }
  if (const InputSparseExecutor* in = session.input_sparse()) {
    const InputSparsityStats& st = in->stats();
    std::string sites;
    for (int s = 0; s < kInputSites; ++s)
      sites += fmt::format("{} {}: {:.1f}% (copy {:.0f}% of tokens)", s ? "," : "", input_site_name(s),
                           100.0 * st.sparsity(s), 100.0 * st.copy_share(s));
    log_info("input sparsity (decode tokens): {:.1f}% of the layers' weights meet zeroed inputs;{}; {:.1f} MB read per "
             "token", 100.0 * st.sparsity(), sites, in->weight_bytes_per_token() / 1e6);
  }
  const SparseFfn* sp = session.sparse_ffn();
  if (!sp) return;
  const FfnSparsityStats& st = sp->stats();
  uint64_t seen = 0;
  for (uint64_t v : st.neurons) seen += v;
  log_info("FFN sparsity ({}): {:.1f}% of neurons inactive over {} token-neurons{}", ffn_mode_name(sp->options().mode),
           100.0 * st.sparsity(), seen,
           st.dense_tokens ? fmt::format(" ({} token-layers of long batches ran on the dense kernels)", st.dense_tokens) : "");
  uint64_t predicted = 0;
  for (uint64_t v : st.predicted) predicted += v;
  if (predicted > 0)
    log_info("predictor: gate computed for {:.1f}% of neurons (predicted), {:.1f}% of those fired",
             seen ? 100.0 * predicted / seen : 0.0, 100.0 * (1.0 - st.sparsity()) * seen / predicted);
  std::string per_layer;
  for (size_t l = 0; l < st.neurons.size(); ++l) per_layer += fmt::format(" {:.3f}", st.layer_sparsity(l));
  log_debug("FFN sparsity per layer:{}", per_layer);
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

std::vector<int32_t> read_corpus_tokens(const Model& model, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in.good(), "cannot read the text '{}' (the project's corpus: scripts/get_corpus.sh)", path);
  std::stringstream ss;
  ss << in.rdbuf();
  Tokenizer tok(*model.file);
  return tok.encode(ss.str(), tok.vocab().add_bos);
}

Profile profile_corpus(Session& session, const std::vector<int32_t>& tokens, ProfileOptions& opts,
                       FfnSampleRecorder* samples) {
  opts.n_ctx = std::min<int64_t>(opts.n_ctx, session.n_ctx());
  const int64_t n_tok = opts.max_tokens > 0 ? std::min<int64_t>(opts.max_tokens, tokens.size()) : tokens.size();
  const int passes = opts.threshold >= 0.0f || opts.quantiles_only ? 1 : 2;
  log_info("profile: {} of {} corpus tokens in chunks of {}, {} threads; firing threshold {}", n_tok, tokens.size(),
           opts.n_ctx, session.n_threads(),
           opts.threshold >= 0.0f ? fmt::format("{}", opts.threshold)
           : opts.quantiles_only  ? fmt::format("per layer at sparsity {} (one pass: the quantiles, no counts)",
                                                opts.sparsity)
                                  : fmt::format("per layer at sparsity {} (two passes: quantiles, then counts)",
                                                opts.sparsity));
  Timer timer;
  int64_t next_report = 0;
  return run_profile(session, tokens, opts, [&](int64_t done, int64_t total, int pass) {
    const int64_t all = total * passes, now = (pass - 1) * total + done;
    if (now >= next_report || now == all) {
      const double secs = timer.seconds();
      log_info("profile: pass {}/{}: {}/{} tokens, {:.0f} tokens/s, {:.0f} s left", pass, passes, done, total,
               now / secs, secs / now * (all - now));
      next_report = now + std::max<int64_t>(all / 10, 1);
    }
  }, samples);
}

void SamplingFlags::add_to(CLI::App* app) {
  temp_ = app->add_option("--temp", sampling.temperature, "temperature (0 = greedy; default: the model's recommended, else 0.8)")
              ->check(CLI::Range(0.0, 100.0));
  top_k_ = app->add_option("--top-k", sampling.top_k, "top-k (0 = off)")->check(CLI::Range(0, 1 << 24));
  top_p_ = app->add_option("--top-p", sampling.top_p, "top-p (1 = off)")->check(CLI::Range(0.0, 1.0));
  min_p_ = app->add_option("--min-p", sampling.min_p, "min-p (0 = off)")->check(CLI::Range(0.0, 1.0));
  app->add_option("--repeat-penalty", sampling.repeat_penalty, "repetition penalty (1 = off)")
      ->check(CLI::Range(0.01, 100.0));
  app->add_option("--repeat-last-n", sampling.repeat_last_n, "tokens the penalty looks back over")
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("-s,--seed", seed, "random seed (-1 = random)");
  sampling.repeat_penalty = 1.0f;
}

SamplerParams SamplingFlags::resolve(const Model& model) const {
  SamplerParams p = sampling;
  if (auto rec = recommended_sampling(model)) {
    std::vector<std::string> used;
    auto take = [&](CLI::Option* opt, auto& field, auto value, const char* name) {
      if (opt && opt->count() == 0 && field != value) {
        field = value;
        used.push_back(fmt::format("{} {}", name, value));
      }
    };
    take(temp_, p.temperature, rec->temperature, "temperature");
    take(top_k_, p.top_k, rec->top_k, "top-k");
    take(top_p_, p.top_p, rec->top_p, "top-p");
    take(min_p_, p.min_p, rec->min_p, "min-p");
    if (!used.empty()) log_info("sampling: the model's recommended {} (override with the flags)", fmt::join(used, ", "));
  }
  p.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
  return p;
}

size_t print_predictor_table(const std::vector<LayerPredictor>& layers) {
  std::printf("| layer | rank | recall (mass) | recall (count) | precision | predicted sparsity | true sparsity | bytes |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  size_t total = 0;
  for (size_t il = 0; il < layers.size(); ++il) {
    const LayerPredictor& p = layers[il];
    std::printf("| %zu | %lld | %.4f | %.4f | %.3f | %.3f | %.3f | %zu |\n", il, static_cast<long long>(p.rank),
                p.recall_mass, p.recall_count, p.precision, p.predicted_sparsity, p.true_sparsity, p.bytes);
    total += p.bytes;
  }
  return total;
}

}  // namespace ember::cli
