// The memory tier (model/expert_cache.hpp): a mixture whose experts live in a cache of fewer
// slots than experts, read from the file as the router chooses them, computes the logits of the
// model without a budget bit for bit (every weight type, repacked or not, prompts and decode,
// one and several sequences); the counts add up; a budget that cannot hold the resident part and
// one layer's experts is refused naming the bytes; the budget's parsing and detection.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/session.hpp"
#include "model/expert_cache.hpp"
#include "model/repack.hpp"
#include "support/errors.hpp"
#include "support/session_logits.hpp"
#include "support/session_params.hpp"
#include "support/synth_files.hpp"

using namespace ember;
using test_support::Logits;

namespace {

SynthOptions moe_options(DType type) {
  SynthOptions o;
  o.type = type;
  o.act = FfnActivation::silu;
  o.n_embd = 256;  // K-quants' blocks
  o.n_ff = 256;
  o.n_layer = 3;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.n_expert = 8;
  o.n_expert_used = 2;
  o.seed = 17;
  o.n_threads = 1;
  return o;
}

// The file is kept (the cache reads it) and removed with the test's temporary directory.
std::unique_ptr<Model> load_kept(const SynthOptions& o, const std::string& name) {
  const auto dir = test_support::test_temp_dir("expert-cache");
  const std::string path = (dir / name).string();
  synth_write(o, path);
  return load_model(path);
}

// The tier of a budget that leaves exactly `slots` slots for the experts (fewer than all of
// them), or (all of them) a cache that holds every expert.
MemoryTier tier_with_slots(const Model& m, int64_t slots) {
  MemoryTier t = plan_memory_tier(m, SIZE_MAX / 2, 0);
  if (slots < t.experts) return plan_memory_tier(m, t.resident + static_cast<size_t>(slots) * t.slot_bytes, 0);
  t.slots = t.experts;
  return t;
}

}  // namespace

TEST(ExpertCache, ItsModelComputesTheUnlimitedModelsLogitsBitForBit) {
  for (DType t : {DType::F32, DType::Q4_0, DType::Q4_K}) {
    const SynthOptions o = moe_options(t);
    auto plain = load_kept(o, "plain_" + std::string(dtype_name(t)) + ".gguf");
    auto cached = load_kept(o, "cached_" + std::string(dtype_name(t)) + ".gguf");
    const MemoryTier tier = tier_with_slots(*cached, 3);  // of 24; a prompt's 8 run in groups of 3
    ASSERT_TRUE(tier.needed);
    ASSERT_EQ(tier.slots, 3);
    cached->expert_cache = std::make_shared<ExpertCache>(*cached, tier, /*repack=*/true);
    repack_for_dense_kernels(*plain, RepackScope::all);
    repack_for_dense_kernels(*cached, RepackScope::all);  // everything but the experts: the cache repacks those
    SessionParams p = test_support::session_params(2, 64, 64);
    Session a(*plain, p), b(*cached, p);
    const Logits want = test_support::session_logits(a), got = test_support::session_logits(b);
    EXPECT_EQ(got, want) << dtype_name(t);
    // Several sequences at once (batches of mixed prompts and decode steps).
    p.n_seq = 3;
    Session as(*plain, p), bs(*cached, p);
    EXPECT_EQ(test_support::session_logits_seqs(bs), test_support::session_logits_seqs(as)) << dtype_name(t);

    const ExpertCacheStats& st = cached->expert_cache->stats();
    EXPECT_GT(st.misses, 0u);
    const FfnWeights& e = cached->layers[0].moe.experts[0];
    EXPECT_EQ(st.bytes_read, (st.misses + st.read_ahead) * (e.gate.nbytes + e.up.nbytes + e.down.nbytes));
    EXPECT_EQ(cached->expert_cache->slots(), 3);
  }
}

// Read-ahead: the next layer's guessed experts read while a layer computes change which experts
// are resident, never the logits: every mode computes the unlimited model's bits. Every decode
// step but the last layer's guesses (always), the guesses are scored, and what was read ahead
// is counted in the bytes read.
TEST(ExpertCache, ReadAheadChangesResidencyNotLogits) {
  const SynthOptions o = moe_options(DType::Q4_K);
  auto plain = load_kept(o, "plain_ahead.gguf");
  repack_for_dense_kernels(*plain, RepackScope::all);
  SessionParams p = test_support::session_params(2, 64, 64);
  Session a(*plain, p);
  const Logits want = test_support::session_logits(a);
  for (ReadAhead mode : {ReadAhead::always, ReadAhead::automatic, ReadAhead::off}) {
    auto cached = load_kept(o, "cached_ahead.gguf");
    // 5 slots: one layer's 2 experts (decode) and room for the next layer's 2 beside them
    cached->expert_cache = std::make_shared<ExpertCache>(*cached, tier_with_slots(*cached, 5), true, mode);
    repack_for_dense_kernels(*cached, RepackScope::all);
    Session b(*cached, p);
    EXPECT_EQ(test_support::session_logits(b), want) << static_cast<int>(mode);
    const ExpertCacheStats& st = cached->expert_cache->stats();
    const FfnWeights& e = cached->layers[0].moe.experts[0];
    EXPECT_EQ(st.bytes_read, (st.misses + st.read_ahead) * (e.gate.nbytes + e.up.nbytes + e.down.nbytes));
    EXPECT_LE(st.read_ahead_used, st.read_ahead);
    EXPECT_LE(st.guesses_chosen, st.guesses);
    if (mode == ReadAhead::off) {
      EXPECT_EQ(st.guesses, 0u);
      EXPECT_EQ(st.read_ahead, 0u);
    } else {
      EXPECT_GT(st.guesses, 0u);  // two guesses of 2 experts a decode token (layers 1 and 2)
      EXPECT_EQ(st.guesses % 2, 0u);
    }
    if (mode == ReadAhead::always) {
      EXPECT_GT(st.read_ahead, 0u);
      EXPECT_GT(st.read_ahead_used, 0u);
    }
  }
}

// A cache without repacking reads the file's layout (what --no-repack runs); a cache of as many
// slots as experts misses each expert once and then only hits.
TEST(ExpertCache, FileLayoutAndAFullCache) {
  const SynthOptions o = moe_options(DType::Q4_0);
  auto plain = load_kept(o, "plain_file.gguf");
  auto cached = load_kept(o, "cached_file.gguf");
  cached->expert_cache = std::make_shared<ExpertCache>(*cached, tier_with_slots(*cached, 9), /*repack=*/false);
  SessionParams p = test_support::session_params(1, 64, 64);
  Session a(*plain, p), b(*cached, p);
  EXPECT_EQ(test_support::session_logits(b), test_support::session_logits(a));
  EXPECT_EQ(cached->layers[1].moe.experts[0].gate.type, DType::Q4_0);

  auto full = load_kept(o, "cached_full.gguf");
  full->expert_cache = std::make_shared<ExpertCache>(*full, tier_with_slots(*full, 24), true);
  Session c(*full, p);
  test_support::session_logits(c);
  const uint64_t misses = full->expert_cache->stats().misses;
  EXPECT_LE(misses, 24u);
  c.reset();
  test_support::session_logits(c);
  EXPECT_EQ(full->expert_cache->stats().misses, misses);  // the second pass reads nothing
  EXPECT_GT(full->expert_cache->stats().hits, 0u);
}

TEST(ExpertCache, BudgetsAreParsedCheckedAndDetected) {
  EXPECT_EQ(parse_memory_budget("auto"), SIZE_MAX);
  EXPECT_EQ(parse_memory_budget("off"), 0u);
  EXPECT_EQ(parse_memory_budget("6G"), size_t{6} << 30);
  EXPECT_EQ(parse_memory_budget("512M"), size_t{512} << 20);
  EXPECT_EQ(parse_memory_budget("1.5K"), size_t{1536});
  EXPECT_NE(test_support::error_of([] { parse_memory_budget("6T"); }).find("unit"), std::string::npos);
  EXPECT_NE(test_support::error_of([] { parse_memory_budget("lots"); }).find("--mem-budget"), std::string::npos);
  EXPECT_GT(detect_memory_budget(), size_t{0});

  auto m = load_kept(moe_options(DType::Q4_0), "budget.gguf");
  const MemoryTier all = plan_memory_tier(*m, SIZE_MAX / 2, 0);
  EXPECT_FALSE(all.needed);
  EXPECT_EQ(all.experts, 24);
  EXPECT_EQ(all.min_slots, 2);
  const std::string e = test_support::error_of([&] { plan_memory_tier(*m, all.resident + all.slot_bytes, 0); });
  EXPECT_NE(e.find("the 2 experts a token runs"), std::string::npos) << e;
  EXPECT_NE(e.find("--mem-budget"), std::string::npos) << e;
  // A dense model has no experts: nothing to cache, whatever the budget.
  SynthOptions d = moe_options(DType::Q4_0);
  d.n_expert = 0;
  d.n_expert_used = 0;
  auto dense = load_kept(d, "dense.gguf");
  EXPECT_FALSE(plan_memory_tier(*dense, 1, 0).needed);
}
