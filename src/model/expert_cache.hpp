// The memory tier for mixtures of experts: a model whose experts do not fit the memory budget
// keeps everything else resident (attention, norms, routers, embeddings, the output head, the KV
// cache) and its experts in a cache of slots in anonymous memory, filled from the file as the
// router chooses them. A miss is read synchronously with large reads straight from the file
// (O_DIRECT where the file system takes it: the page cache neither doubles the bytes nor counts
// against a cgroup's limit), repacked into the slot as repack_for_dense_kernels would repack it,
// and the expert's views point at the slot: the same bytes and the same kernels as without a
// budget, so the same tokens bit for bit. Eviction keeps the experts used most (uses counted
// since load; ties: the least recently used goes), never one the current call needs.
//
// Read-ahead (decode): once a layer's experts are resident, the next mixture layer's router,
// given this layer's residual stream normed with that layer's FFN norm, guesses its experts (the
// residual stream changes little from one layer to the next), and the missing ones are read on a
// background thread while this layer computes; that layer's ensure() waits for them first. A wrong
// guess costs a slot and a read, never a token: what runs is always what the router chose. In
// `automatic` mode the guesses are always made and scored against the router's choice (a
// decaying count per layer: the share p chosen), and a layer's m missing guesses are read only
// where that pays: a right one saves at most the window a layer computes in (w, measured from
// read_ahead() to the next ensure()), shared by the m, a wrong one costs a whole read (t, the
// measured time of an expert read when chosen) and a slot; so p / (1 - p) >= r with
// r = max(1, t m / w), p >= 1/2 at the least.
//
// moe_ffn (model/moe.cpp) calls ensure() after routing, then read_ahead(); the cache rebinds the
// views of the Model it was made for (Model::expert_cache owns it), so one model with a cache
// serves one session at a time, as the engine runs it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/background_job.hpp"
#include "core/thread_pool.hpp"
#include "model/model.hpp"

namespace ember {

// When read-ahead reads (above): never, where the guesses pay, or always (tests, measurements).
enum class ReadAhead { off, automatic, always };
ReadAhead parse_read_ahead(const std::string& s);  // "off" | "auto" | "always"

struct ExpertCacheStats {
  uint64_t calls = 0;         // ensure() calls (one per mixture layer and forward pass)
  uint64_t hits = 0, misses = 0;  // experts asked for that were, and were not, resident
  uint64_t bytes_read = 0;    // from the file
  double read_seconds = 0;    // waiting on those reads (and their repacking)
  uint64_t read_ahead = 0;    // experts read ahead of their layer (in bytes_read; asked for, they are hits;
                              // a guess cancelled before its read began is not counted)
  uint64_t read_ahead_used = 0;  // of those, chosen by their layer's router when it ran
  uint64_t guesses = 0, guesses_chosen = 0;  // every guess scored (read or not), and those chosen
  double hit_rate() const { return hits + misses ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 1.0; }
};

// How a memory budget splits (plan_memory_tier): what must stay resident, the experts' bytes,
// and the slots left for them. `needed`: the experts do not all fit, so the cache runs.
struct MemoryTier {
  size_t budget = 0;
  size_t resident = 0;      // every tensor but the experts', the KV cache, the working buffers, the reserve
  size_t expert_bytes = 0;  // all experts of all layers
  size_t slot_bytes = 0;    // the largest expert (gate, up, down), rounded to 4 KiB
  int64_t experts = 0;      // of all layers
  int64_t slots = 0;        // that the budget holds beside the resident part
  int64_t min_slots = 0;    // the experts a token runs (a prompt's run in groups the slots hold)
  bool needed = false;
};
// What the process takes besides the tensors, the KV cache and the working buffers (the code,
// threads' stacks, the allocator's slack, the logits): held back from every budget.
constexpr size_t kMemoryTierReserve = size_t{64} << 20;
// The split of `budget` bytes for `model` with a KV cache of kv_bytes and working buffers of
// work_bytes (Workspace::bytes of the session's batch). Throws, naming the bytes needed, where
// the budget cannot hold the resident part and the experts one token runs.
MemoryTier plan_memory_tier(const Model& model, size_t budget, size_t kv_bytes, size_t work_bytes = 0);
// The memory this process may use: the smaller of its cgroup's limit (v1 memory.limit_in_bytes
// or v2 memory.max of the cgroups /proc/self/cgroup names; none where unset) and the memory
// available now (core/huge_pages.hpp). 0 where neither is known.
size_t detect_memory_budget();
// Parses a --mem-budget value: "auto" (detect_memory_budget, used only where the model does not
// fit), "off" / "0" (none), or a size with an optional K, M, G suffix (binary units).
// Returns SIZE_MAX for auto, 0 for off.
size_t parse_memory_budget(const std::string& s);

class ExpertCache {
 public:
  // `slots` slots of tier.slot_bytes in anonymous memory; `repack`: each expert matrix that
  // repack_for_dense_kernels would repack (RepackScope::all) is repacked into its slot. The
  // experts' views keep pointing into the file's map until they are first read.
  ExpertCache(Model& model, const MemoryTier& tier, bool repack, ReadAhead read_ahead = ReadAhead::automatic);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Makes every expert named in ids[0..count) of `moe` (a layer of the model) resident, reading
  // the missing ones on its own reading threads (io_); they stay so until the next call.
  void ensure(const MoeWeights& moe, const int32_t* ids, int64_t count);
  // After ensure() for `moe`'s layer (one token): guesses the next mixture layer's experts from
  // `residual` (this layer's FFN input before its norm) and starts reading the missing ones in
  // the background, never evicting one the last ensure() asked for. Routes on `pool`.
  void read_ahead(ThreadPool& pool, const MoeWeights& moe, const float* residual);
  ReadAhead read_ahead_mode() const { return read_ahead_; }

  int64_t slots() const { return static_cast<int64_t>(slot_owner_.size()); }
  size_t bytes() const { return memory_.size(); }
  const MemoryTier& tier() const { return tier_; }
  bool direct_io() const { return direct_; }
  const ExpertCacheStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  struct Expert {
    FfnWeights* weights = nullptr;           // the model's views, rebound to the slot
    std::array<TensorView, 3> file;          // gate, up, down as the file lays them out
    std::array<uint64_t, 3> offset{};        // their bytes' offsets in the file
    int32_t slot = -1;
    uint64_t uses = 0, last = 0;             // calls that asked for it; the last one
    uint64_t ahead_at = 0;                   // the call after which it was read ahead; 0: asked for since
  };
  // Reads matrix i (gate, up, down) of expert x into its region of x's slot: the whole file
  // pages around it. Returns what went wrong (empty: nothing). On an I/O thread.
  std::string read(const Expert& x, size_t i);
  // Points matrix i's view at its region, repacked there first (through `scratch`) where the
  // cache repacks. On a pool thread.
  void bind(Expert& x, size_t i, uint8_t* scratch);
  uint8_t* region_of(int32_t slot, size_t i) const;
  void unbind(Expert& x);
  size_t layer_index(const MoeWeights& moe) const;
  // A slot for x: a free one, else that of the expert used least (the least recently used among
  // equals) that the current call neither asked for nor read ahead; -1 where there is none.
  int32_t take_slot(Expert& x);
  // Reads and binds the experts' matrices on the reading threads; errors_[j] per matrix (j / 3:
  // the expert); an expert whose cancel[] byte is set when its turn comes is skipped.
  void read_all(const std::vector<Expert*>& xs, const uint8_t* cancel = nullptr);
  // Where a read failed: frees the slots of xs (their views back to the file) and throws.
  void release(const std::vector<Expert*>& xs);
  // The read-ahead under way: its guesses not among ids[0..count) cancelled, then waited for;
  // what it read counted, the slots of what it did not freed.
  void finish_read_ahead(const int32_t* ids, int64_t count);

  Model& model_;
  MemoryTier tier_;
  bool repack_ = false;
  int fd_ = -1;
  bool direct_ = false;
  std::vector<std::vector<Expert>> experts_;  // per layer (empty for dense layers), per expert
  std::vector<const MoeWeights*> layer_of_;   // per layer: its MoeWeights, to find a call's layer
  AlignedBuffer<uint8_t> memory_;             // the slots
  uint8_t* slots_ = nullptr;                  // the first, at a page boundary in memory_
  std::array<size_t, 3> region_sizes_{};      // the largest gate, up, down: their regions in a slot
  std::vector<Expert*> slot_owner_;
  ThreadPool io_;                              // the reading threads (kIoDepth in expert_cache.cpp)
  std::vector<AlignedBuffer<uint8_t>> scratch_;  // per reading thread: one matrix repacked
  std::vector<Expert*> missing_;               // ensure()'s, kept between calls
  std::vector<std::string> errors_;            // per matrix read
  uint64_t clock_ = 0;
  ExpertCacheStats stats_;
  // Read-ahead: per layer the last guess (until its layer runs) and its decaying score; the
  // guessed experts under way, the router's input and outputs, the thread.
  ReadAhead read_ahead_ = ReadAhead::automatic;
  std::vector<std::vector<int32_t>> guess_;
  std::vector<double> guess_made_, guess_chosen_;
  // Decaying means of the window between read_ahead() and the next ensure() (w above) and of an
  // expert's read when chosen (t); the window's start.
  double window_ = 0, expert_read_ = 0;
  double window_start_ = -1;
  std::vector<Expert*> ahead_;
  size_t ahead_layer_ = 0;
  std::vector<uint8_t> ahead_cancel_;  // per expert of ahead_: set (atomically) once not wanted
  AlignedBuffer<float> ahead_x_, ahead_logits_;
  AlignedBuffer<uint8_t> ahead_scratch_;
  std::vector<int32_t> ahead_ids_, ahead_order_;
  std::vector<float> ahead_weights_;
  BackgroundJob reader_;  // last: joined before the members its jobs use go
};

}  // namespace ember
