#include "model/expert_cache.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <cmath>
#include <sstream>

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "core/huge_pages.hpp"
#include "core/timer.hpp"
#include "model/blocks.hpp"
#include "model/moe.hpp"
#include "model/repack.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/r16/r16.hpp"

namespace ember {
namespace {

constexpr size_t kPage = 4096;
// read_all's mark of a matrix it skipped because its expert's read-ahead was cancelled.
const std::string kCancelled = "cancelled";
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
// The first page boundary at or after p (O_DIRECT reads into page-aligned memory).
uint8_t* aligned_page(uint8_t* p) {
  return p + (kPage - reinterpret_cast<uintptr_t>(p) % kPage) % kPage;
}

// The three matrices of an expert, in slot order.
std::array<TensorView*, 3> matrices(FfnWeights& f) { return {&f.gate, &f.up, &f.down}; }

// A matrix's region in a slot: the whole file pages around it (read there with O_DIRECT, which
// takes page-aligned offsets, sizes and memory), wherever in its first page it starts.
size_t region_bytes(size_t nbytes) { return round_up(nbytes, kPage) + kPage; }
// Bytes of the slot an expert of these matrices takes: their regions one after another.
size_t slot_bytes_of(const FfnWeights& f) {
  return region_bytes(f.gate.nbytes) + region_bytes(f.up.nbytes) + region_bytes(f.down.nbytes);
}
// Threads that read (and repack) a call's missing matrices at once: on 2 Sapphire Rapids cores
// with a virtual disk (1.5-1.9 GB/s sequential), the Qwen3-MoE shape under a third of its size
// decoded 48 / 51 / 45 tok/s with 2 / 4 / 8 (docs/benchmarks.md).
constexpr size_t kIoDepth = 4;

// A cgroup's memory limit from its control file, or 0 where none is set ("max", or v1's
// "unlimited" near 2^63).
size_t read_limit(const std::string& path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v) || v == "max") return 0;
  try {
    const unsigned long long n = std::stoull(v);
    return n >= (1ull << 60) ? 0 : static_cast<size_t>(n);
  } catch (const std::exception&) {
    return 0;
  }
}

constexpr EnumName<ReadAhead> kReadAheadNames[] = {
    {ReadAhead::off, "off"}, {ReadAhead::automatic, "auto"}, {ReadAhead::always, "always"}};

}  // namespace

ReadAhead parse_read_ahead(const std::string& s) { return parse_enum(kReadAheadNames, s, "read-ahead mode"); }

size_t detect_memory_budget() {
  size_t limit = 0;
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {  // "id:controllers:path"
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    size_t l = 0;
    if (controllers.empty()) l = read_limit("/sys/fs/cgroup" + path + "/memory.max");  // v2
    else if ((',' + controllers + ',').find(",memory,") != std::string::npos)
      l = read_limit("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");  // v1
    if (l > 0) limit = limit == 0 ? l : std::min(limit, l);
  }
  const size_t avail = available_memory_bytes();
  if (limit == 0) return avail;
  return avail == 0 ? limit : std::min(limit, avail);
}

size_t parse_memory_budget(const std::string& s) {
  if (s == "auto") return SIZE_MAX;
  if (s == "off" || s == "0") return 0;
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    fail("--mem-budget '{}': expected auto, off, or a size such as 6G, 512M", s);
  }
  const std::string unit = s.substr(pos);
  double scale = 1;
  if (unit == "K" || unit == "KiB" || unit == "k") scale = 1024.0;
  else if (unit == "M" || unit == "MiB") scale = 1048576.0;
  else if (unit == "G" || unit == "GiB") scale = 1073741824.0;
  else EMBER_CHECK(unit.empty(), "--mem-budget '{}': unknown unit '{}' (K, M or G)", s, unit);
  EMBER_CHECK(v > 0 && v * scale < 1e18, "--mem-budget '{}' must be a positive size", s);
  return static_cast<size_t>(v * scale);
}

MemoryTier plan_memory_tier(const Model& model, size_t budget, size_t kv_bytes, size_t work_bytes) {
  MemoryTier t;
  t.budget = budget;
  for (const LayerWeights& L : model.layers) {
    t.min_slots = std::max(t.min_slots, L.moe.n_used);
    for (const FfnWeights& e : L.moe.experts) {
      t.expert_bytes += e.gate.nbytes + e.up.nbytes + e.down.nbytes;
      t.slot_bytes = std::max(t.slot_bytes, slot_bytes_of(e));
      ++t.experts;
    }
  }
  const size_t file = model.file_bytes();
  t.resident = (file > t.expert_bytes ? file - t.expert_bytes : 0) + kv_bytes + work_bytes + kMemoryTierReserve;
  t.needed = t.experts > 0 && t.resident + t.expert_bytes > budget;
  if (!t.needed) return t;
  const size_t least = t.resident + static_cast<size_t>(t.min_slots) * t.slot_bytes;
  EMBER_CHECK(budget >= least,
              "a memory budget of {:.1f} MiB cannot run {}: what stays resident (every tensor but the experts', "
              "{:.1f} MiB, the KV cache, {:.1f} MiB, the working buffers, {:.1f} MiB, and {:.0f} MiB for the "
              "process) and the {} experts a token runs ({:.1f} MiB) need {:.1f} MiB: give --mem-budget {:.0f}M or "
              "more, or a shorter context (-c) or batch (-b)",
              budget / 1048576.0, model.file->path(), (file - t.expert_bytes) / 1048576.0, kv_bytes / 1048576.0,
              work_bytes / 1048576.0, kMemoryTierReserve / 1048576.0, t.min_slots, t.min_slots * t.slot_bytes / 1048576.0,
              least / 1048576.0, std::ceil(least / 1048576.0));
  t.slots = std::min<int64_t>(t.experts, static_cast<int64_t>((budget - t.resident) / t.slot_bytes));
  return t;
}

ExpertCache::ExpertCache(Model& model, const MemoryTier& tier, bool repack, ReadAhead read_ahead)
    : model_(model), tier_(tier), repack_(repack), io_(static_cast<int>(kIoDepth)), read_ahead_(read_ahead) {
  EMBER_CHECK(tier.slots >= tier.min_slots && tier.slot_bytes > 0, "expert cache: {} slots for layers of {} experts",
              tier.slots, tier.min_slots);
  const std::string& path = model.file->path();
  fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd_ >= 0) {  // a file system may take the flag at open and refuse the reads (EINVAL)
    AlignedBuffer<uint8_t> probe(2 * kPage);
    if (::pread(fd_, aligned_page(probe.data()), kPage, 0) < 0) ::close(fd_), fd_ = -1;
  }
  direct_ = fd_ >= 0;
  if (fd_ < 0) fd_ = ::open(path.c_str(), O_RDONLY);  // a file system without O_DIRECT (tmpfs)
  EMBER_CHECK(fd_ >= 0, "expert cache: cannot open '{}': {}", path, std::strerror(errno));
  const uint8_t* base = model.file->data();
  experts_.resize(model.layers.size());
  layer_of_.resize(model.layers.size(), nullptr);
  size_t widest = 0;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    MoeWeights& moe = model.layers[l].moe;
    if (!moe.valid()) continue;
    layer_of_[l] = &moe;
    moe.cache = this;
    for (FfnWeights& f : moe.experts) {
      Expert x;
      x.weights = &f;
      const auto m = matrices(f);
      for (size_t i = 0; i < 3; ++i) {
        EMBER_CHECK(m[i]->data >= base && m[i]->data + m[i]->nbytes <= base + model.file_bytes() && m[i]->contiguous(),
                    "expert cache: layer {}'s expert matrix {} is not the file's (repacked before the cache?)", l,
                    m[i]->name);
        x.file[i] = *m[i];
        x.offset[i] = static_cast<uint64_t>(m[i]->data - base);
        widest = std::max(widest, m[i]->nbytes);
        region_sizes_[i] = std::max(region_sizes_[i], m[i]->nbytes);
      }
      experts_[l].push_back(x);
    }
  }
  // Touched now, while the budget is free: slots first faulted in later, as the cache fills,
  // made the kernel reclaim and compact for each huge page under a cgroup's limit (the reads of a
  // nearly full cache slowed to 0.36 GB/s).
  memory_ = AlignedBuffer<uint8_t>(static_cast<size_t>(tier.slots) * tier.slot_bytes + kPage);
  slots_ = aligned_page(memory_.data());
  EMBER_CHECK(region_bytes(region_sizes_[0]) + region_bytes(region_sizes_[1]) + region_bytes(region_sizes_[2]) <=
                  tier.slot_bytes,
              "expert cache: slots of {} bytes for experts of up to {} + {} + {}", tier.slot_bytes, region_sizes_[0],
              region_sizes_[1], region_sizes_[2]);
  slot_owner_.assign(static_cast<size_t>(tier.slots), nullptr);
  for (int t = 0; t < io_.size(); ++t) scratch_.emplace_back(widest, AlignedBuffer<uint8_t>::Untouched{});
  // The read-ahead's router buffers, for the widest router.
  int64_t n_embd = 0, n_expert = 0;
  size_t mm = 0;
  for (const MoeWeights* m : layer_of_)
    if (m) {
      n_embd = std::max(n_embd, m->router.cols());
      n_expert = std::max(n_expert, m->n_expert());
      mm = std::max(mm, cpu::matmul_scratch_bytes(m->router.type, m->router.cols(), 1));
      EMBER_CHECK(m->n_used > 0 && m->n_used <= m->n_expert(), "expert cache: a layer choosing {} of {} experts",
                  m->n_used, m->n_expert());
    }
  ahead_x_ = AlignedBuffer<float>(static_cast<size_t>(n_embd));
  ahead_logits_ = AlignedBuffer<float>(static_cast<size_t>(n_expert));
  ahead_scratch_ = AlignedBuffer<uint8_t>(std::max<size_t>(mm, 64));
  ahead_ids_.resize(static_cast<size_t>(n_expert));
  ahead_order_.resize(static_cast<size_t>(n_expert));
  ahead_weights_.resize(static_cast<size_t>(n_expert));
  guess_.resize(layer_of_.size());
  guess_made_.assign(layer_of_.size(), 0.0);
  guess_chosen_.assign(layer_of_.size(), 0.0);
}

ExpertCache::~ExpertCache() {
  for (uint8_t& c : ahead_cancel_) std::atomic_ref<uint8_t>(c).store(1, std::memory_order_relaxed);  // not started
  try {
    reader_.wait();
  } catch (const std::exception&) {  // its slots are unbound below
  }
  for (Expert* x : slot_owner_)
    if (x) unbind(*x);
  for (size_t l = 0; l < layer_of_.size(); ++l)
    if (layer_of_[l]) model_.layers[l].moe.cache = nullptr;
  if (fd_ >= 0) ::close(fd_);
}

void ExpertCache::unbind(Expert& x) {
  const auto m = matrices(*x.weights);
  for (size_t i = 0; i < 3; ++i) *m[i] = x.file[i];
  x.slot = -1;
  x.ahead_at = 0;
}

std::string ExpertCache::read(const Expert& x, size_t i) {
  const TensorView& f = x.file[i];
  uint8_t* region = region_of(x.slot, i);
  const uint64_t first = x.offset[i] / kPage * kPage, end = round_up(x.offset[i] + f.nbytes, kPage);
  const size_t want = static_cast<size_t>(end - first);
  size_t done = 0;
  while (done < want) {
    const ssize_t r = ::pread(fd_, region + done, want - done, static_cast<off_t>(first + done));
    if (r == 0) break;  // the file's end inside the last page
    if (r < 0 && errno != EINTR)
      return fmt::format("expert cache: reading '{}' at {}: {}", model_.file->path(), first + done, std::strerror(errno));
    if (r > 0) done += static_cast<size_t>(r);
  }
  if (done < x.offset[i] - first + f.nbytes)
    return fmt::format("expert cache: '{}' ended at {} inside a tensor", model_.file->path(), first + done);
  return {};
}

void ExpertCache::bind(Expert& x, size_t i, uint8_t* scratch) {
  const TensorView& f = x.file[i];
  uint8_t* region = region_of(x.slot, i);
  const uint8_t* src = region + x.offset[i] % kPage;
  TensorView v = f;
  if (repack_ && repack_pays(f)) {  // repacked through the scratch to the region's start
    cpu::repack_r16(f.type, src, f.rows(), f.cols(), scratch);
    std::memcpy(region, scratch, f.nbytes);
    v.type = cpu::r16_type(f.type);
    v.data = region;
  } else {
    v.data = src;  // where the file's bytes landed
  }
  *matrices(*x.weights)[i] = v;
}

uint8_t* ExpertCache::region_of(int32_t slot, size_t i) const {
  uint8_t* p = slots_ + static_cast<size_t>(slot) * tier_.slot_bytes;
  for (size_t j = 0; j < i; ++j) p += region_bytes(region_sizes_[j]);
  return p;
}

size_t ExpertCache::layer_index(const MoeWeights& moe) const {
  size_t l = 0;
  while (l < layer_of_.size() && layer_of_[l] != &moe) ++l;
  EMBER_CHECK(l < layer_of_.size(), "expert cache: a mixture that is not one of the model's layers");
  return l;
}

int32_t ExpertCache::take_slot(Expert& x) {
  int32_t best = -1;
  for (size_t s = 0; s < slot_owner_.size(); ++s) {
    const Expert* o = slot_owner_[s];
    if (!o) {
      best = static_cast<int32_t>(s);
      break;
    }
    if (o->last == clock_ || o->ahead_at == clock_) continue;
    const Expert* b = best < 0 ? nullptr : slot_owner_[static_cast<size_t>(best)];
    if (!b || o->uses < b->uses || (o->uses == b->uses && o->last < b->last)) best = static_cast<int32_t>(s);
  }
  if (best < 0) return -1;
  if (Expert* o = slot_owner_[static_cast<size_t>(best)]) unbind(*o);
  slot_owner_[static_cast<size_t>(best)] = &x;
  x.slot = best;  // taken (read by the caller)
  return best;
}

void ExpertCache::read_all(const std::vector<Expert*>& xs, const uint8_t* cancel) {
  // kIoDepth threads each read a matrix and then repack it (or bind it where it landed), so that
  // one thread's repacking runs while the others wait on the disk. A read-ahead's experts are
  // taken in the order of the guess, and those cancelled meanwhile are skipped.
  const size_t jobs = xs.size() * 3;
  errors_.assign(jobs, std::string());
  io_.parallel_for(static_cast<int64_t>(jobs), 1, [&](int64_t j0, int64_t j1, int ith) {
    for (auto j = static_cast<size_t>(j0); j < static_cast<size_t>(j1); ++j) {
      if (cancel && std::atomic_ref<const uint8_t>(cancel[j / 3]).load(std::memory_order_relaxed)) {
        errors_[j] = kCancelled;
        continue;
      }
      errors_[j] = read(*xs[j / 3], j % 3);
      if (errors_[j].empty()) bind(*xs[j / 3], j % 3, scratch_[static_cast<size_t>(ith)].data());
    }
  });
}

void ExpertCache::release(const std::vector<Expert*>& xs) {
  for (const std::string& e : errors_)
    if (!e.empty()) {  // free every slot of these reads, their views back to the file
      for (Expert* x : xs) slot_owner_[static_cast<size_t>(x->slot)] = nullptr, unbind(*x);
      fail("{}", e);
    }
}

void ExpertCache::finish_read_ahead(const int32_t* ids, int64_t count) {
  if (ahead_.empty()) return;
  // The guesses the router did not choose: not read if not started.
  for (size_t a = 0; a < ahead_.size(); ++a) {
    const int32_t id = static_cast<int32_t>(ahead_[a] - experts_[ahead_layer_].data());
    if (std::find(ids, ids + count, id) == ids + count)
      std::atomic_ref<uint8_t>(ahead_cancel_[a]).store(1, std::memory_order_relaxed);
  }
  Timer timer;
  bool thrown = false;
  try {
    reader_.wait();
  } catch (const std::exception&) {  // as a failed read: the call that needs the expert reads it again
    thrown = true;
  }
  stats_.read_seconds += timer.seconds();  // what the forward pass waited for
  for (size_t a = 0; a < ahead_.size(); ++a) {
    Expert& x = *ahead_[a];
    bool read = !thrown && errors_.size() == 3 * ahead_.size();
    for (size_t i = 0; i < 3; ++i) read = read && errors_[3 * a + i].empty();
    if (read) {
      for (const TensorView& f : x.file) stats_.bytes_read += f.nbytes;
      ++stats_.read_ahead;
    } else {  // cancelled, or a read that failed (the call that needs it reads it again, and says why)
      slot_owner_[static_cast<size_t>(x.slot)] = nullptr;
      unbind(x);
    }
  }
  ahead_.clear();
}

namespace {
void decay_into(double& mean, double sample) { mean = mean > 0 ? 0.9 * mean + 0.1 * sample : sample; }
}  // namespace

void ExpertCache::ensure(const MoeWeights& moe, const int32_t* ids, int64_t count) {
  if (window_start_ >= 0) decay_into(window_, now_seconds() - window_start_), window_start_ = -1;
  const size_t l = layer_index(moe);
  finish_read_ahead(ids, l == ahead_layer_ ? count : 0);  // (another layer's call: a pass cut short)
  std::vector<Expert>& xs = experts_[l];
  ++clock_;
  ++stats_.calls;
  if (!guess_[l].empty()) {  // the read-ahead's guess for this call, scored
    int64_t chosen = 0;
    for (int32_t g : guess_[l]) chosen += std::find(ids, ids + count, g) != ids + count ? 1 : 0;
    constexpr double kDecay = 0.97;  // about the last 30 tokens
    guess_made_[l] = kDecay * guess_made_[l] + static_cast<double>(guess_[l].size());
    guess_chosen_[l] = kDecay * guess_chosen_[l] + static_cast<double>(chosen);
    stats_.guesses += guess_[l].size();
    stats_.guesses_chosen += static_cast<uint64_t>(chosen);
    guess_[l].clear();
  }
  std::vector<Expert*>& missing = missing_;  // kept between calls: no allocation a token
  missing.clear();
  for (int64_t i = 0; i < count; ++i) {
    EMBER_CHECK(ids[i] >= 0 && static_cast<size_t>(ids[i]) < xs.size(), "expert cache: no expert {} in layer {}",
                ids[i], l);
    Expert& x = xs[static_cast<size_t>(ids[i])];
    if (x.last == clock_) continue;  // named twice in this call
    x.last = clock_;
    ++x.uses;
    if (x.ahead_at) ++stats_.read_ahead_used, x.ahead_at = 0;
    if (x.slot >= 0) {
      ++stats_.hits;
    } else {
      ++stats_.misses;
      missing.push_back(&x);
    }
  }
  if (missing.empty()) return;
  // Slots for the missing: free ones first, then those of the experts used least (the least
  // recently used among equals), never one this call asked for.
  for (Expert* x : missing)
    EMBER_CHECK(take_slot(*x) >= 0, "expert cache: {} slots cannot hold the {} experts one call needs",
                slot_owner_.size(), missing.size());
  Timer timer;
  read_all(missing);
  release(missing);
  const double seconds = timer.seconds();
  stats_.read_seconds += seconds;
  decay_into(expert_read_, seconds / static_cast<double>(missing.size()));
  for (const Expert* x : missing)
    for (const TensorView& f : x->file) stats_.bytes_read += f.nbytes;
}

void ExpertCache::read_ahead(ThreadPool& pool, const MoeWeights& moe, const float* residual) {
  if (read_ahead_ == ReadAhead::off) return;
  finish_read_ahead(nullptr, 0);
  size_t next = layer_index(moe) + 1;
  while (next < layer_of_.size() && !layer_of_[next]) ++next;
  if (next == layer_of_.size()) return;  // the last mixture layer: the next token's first is not known yet
  const MoeWeights& m = *layer_of_[next];
  const LayerWeights& L = model_.layers[next];
  apply_norm(model_, L.ffn.norm, L.ffn.norm_b, residual, ahead_x_.data(), 1);
  cpu::matmul(pool, m.router, ahead_x_.data(), 1, ahead_logits_.data(), ahead_scratch_.data());
  moe_route(m, ahead_logits_.data(), 1, ahead_ids_.data(), ahead_weights_.data(), ahead_order_.data());
  guess_[next].assign(ahead_ids_.begin(), ahead_ids_.begin() + m.n_used);
  window_start_ = now_seconds();
  std::vector<Expert>& xs = experts_[next];
  if (read_ahead_ == ReadAhead::automatic) {  // where it pays (the top of expert_cache.hpp), after 8 tokens' scores
    int64_t missing = 0;
    for (int32_t g : guess_[next]) missing += xs[static_cast<size_t>(g)].slot < 0 ? 1 : 0;
    if (missing == 0 || guess_made_[next] < 8.0 * static_cast<double>(m.n_used) || window_ <= 0 || expert_read_ <= 0)
      return;
    const double p = guess_chosen_[next] / guess_made_[next];
    const double r = std::max(1.0, expert_read_ * static_cast<double>(missing) / window_);
    if (p < r * (1 - p)) return;
  }
  for (int64_t i = 0; i < m.n_used; ++i) {
    Expert& x = xs[static_cast<size_t>(ahead_ids_[static_cast<size_t>(i)])];
    if (x.slot >= 0) continue;
    if (take_slot(x) < 0) break;  // every slot is this layer's or read ahead
    x.ahead_at = clock_;
    ahead_.push_back(&x);
  }
  if (ahead_.empty()) return;
  ahead_layer_ = next;
  ahead_cancel_.assign(ahead_.size(), 0);
  reader_.start([this] { read_all(ahead_, ahead_cancel_.data()); });
}

}  // namespace ember
