#include "device/cuda/cuda_device.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"
#include "device/arena_load.hpp"
#include "device/cuda/cuda_scratch.hpp"
#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace ember {

namespace {
// A norm's or bias's floats in the arena; null for a tensor the layer does not have.
const float* dev_floats(const TensorView& t) { return t.valid() ? reinterpret_cast<const float*>(t.data) : nullptr; }
constexpr size_t kMaxGraphs = 64;  // graphs kept (a decode step's shapes); more: all dropped
}  // namespace

CudaDevice::CudaDevice() {
  std::string why;
  EMBER_CHECK(cuda::available(&why), "no usable CUDA device ({}); run without --vram-budget/--plan, or on a machine "
              "with an NVIDIA GPU", why);
  stream_ = cuda::stream_create();
  predicted_event_ = cuda::event_create();
  input_event_ = cuda::event_create();
  const char* env = std::getenv("EMBER_CUDA_GRAPHS");
  graphs_ = cuda::graphs_supported() && !(env && std::string(env) == "0");
  launches0_ = cuda::launches();
}

CudaDevice::~CudaDevice() {
  try {
    if (mode_ == Mode::capture) {
      size_t nodes = 0;
      cuda::graph_destroy(cuda::capture_end(stream_, &nodes));
    }
    cuda::stream_sync(stream_);
  } catch (const Error&) {
  }
  for (auto& [key, g] : graph_cache_) cuda::graph_destroy(g.exec);
  if (arena_) cuda::free_device(arena_);
  for (float* p : {x_host_, out_host_, hidden_host_, hidden_out_host_, ffn_in_host_, ffn_out_host_, logits_host_,
                   ex_x_host_, ex_out_host_})
    if (p) cuda::free_host_pinned(p);
  if (positions_host_) cuda::free_host_pinned(positions_host_);
  if (mask_host_) cuda::free_host_pinned(mask_host_);
  for (void* e : {predicted_event_, input_event_})
    if (e) cuda::event_destroy(e);
  if (stream_) cuda::stream_destroy(stream_);
}

cuda::Activations CudaDevice::activations(const float* x, int64_t n, int64_t cols, uint64_t xq,
                                         std::initializer_list<DType> types) {
  cuda::Activations a{x, nullptr};
  for (DType t : types)
    if (cuda::takes_q8(t)) {
      cuda::quantize_q8(x, n, cols, arena_ + xq, stream_);
      a.q8 = arena_ + xq;
      break;
    }
  return a;
}

DeviceMemory CudaDevice::memory() const {
  size_t free = 0, total = 0;
  cuda::mem_info(&free, &total);
  return {free, total, kCudaContextReserve};
}

void CudaDevice::load(const Model& model, const DeviceLoad& d) {
  EMBER_CHECK(!arena_, "CUDA device: load called twice");
  layout_ = load_layout(caps(), model, d);
  own_ = cuda_scratch_layout(layout_, *d.pm, *d.opts, *d.plan);
  const PlanModel& pm = *d.pm;
  const Plan& plan = *d.plan;
  model_ = &model;
  n_embd_ = pm.n_embd, n_ff_ = pm.n_ff, max_batch_ = d.opts->max_batch;
  types_.assign(model.layers.size(), {});
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const FfnWeights& w = model.layers[l].ffn;
    if (layout_.layers[l].n > 0) types_[l].gate = w.gate.type, types_[l].up = w.up.type, types_[l].down = d.down_rows[l].type;
    if (layout_.pred[l].on) {
      EMBER_CHECK(cuda::supports(w.fc1.type) && cuda::supports(w.fc2.type) &&
                      w.fc2.cols() % info(w.fc2.type).block_size == 0,
                  "CUDA device: layer {}'s predictor is {} / {} of rank {}; the CUDA kernels read F32, F16, Q8_0 and "
                  "Q4_0 rows of whole blocks", l, dtype_name(w.fc1.type), dtype_name(w.fc2.type), w.fc1.rows());
      types_[l].fc1 = w.fc1.type, types_[l].fc2 = w.fc2.type, types_[l].rank = w.fc1.rows();
    }
  }
  size_t free0 = 0, total = 0;
  cuda::mem_info(&free0, &total);
  log_info("CUDA device {}: {:.1f} MiB free of {:.1f} MiB before load; the plan's arena {:.1f} MiB", cuda::device_name(),
           free0 / 1048576.0, total / 1048576.0, layout_.total / 1048576.0);
  arena_ = static_cast<uint8_t*>(cuda::malloc_device(layout_.total));
  const size_t io = static_cast<size_t>(max_batch_ * n_embd_) * sizeof(float);
  for (float** p : {&x_host_, &out_host_, &hidden_host_, &hidden_out_host_, &ffn_in_host_, &ffn_out_host_})
    *p = static_cast<float*>(cuda::malloc_host_pinned(io));
  positions_host_ = static_cast<int32_t*>(cuda::malloc_host_pinned(static_cast<size_t>(max_batch_) * sizeof(int32_t)));
  mask_host_ = static_cast<uint8_t*>(cuda::malloc_host_pinned(static_cast<size_t>(max_batch_ * n_ff_)));
  // The arena written by the shared loader. Each matrix goes up in the device's layout
  // (cuda::pack_matrix): its rows gathered on the host, packed, one copy, on the device's own
  // stream and waited for before the staging buffers are reused (a blocking copy from pageable
  // memory is not ordered with a non-blocking stream).
  struct Writer final : ArenaWriter {
    uint8_t* arena;
    void* stream;
    std::vector<uint8_t> rows_buf, packed;
    Writer(uint8_t* a, void* s) : arena(a), stream(s) {}
    bool file_layout() const override { return true; }
    void rows(const TensorView& src, const int32_t* ids, int64_t n, uint64_t offset) override {
      const size_t rb = src.row_size();
      rows_buf.resize(rb * static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) std::memcpy(rows_buf.data() + i * rb, src.row(ids ? ids[i] : i), rb);
      packed.resize(rows_buf.size());
      cuda::pack_matrix(src.type, rows_buf.data(), n, src.cols(), packed.data());
      bytes(packed.data(), packed.size(), offset);
    }
    void bytes(const void* src, size_t n, uint64_t offset) override {
      cuda::copy_to_device(arena + offset, src, n, stream);
      cuda::stream_sync(stream);
    }
    uint8_t* at(uint64_t offset) override { return arena + offset; }
  } writer(arena_, stream_);
  // The kernels read the attention layers' vectors (norms, biases) and the output norm as F32.
  auto f32 = [](const TensorView& t, size_t l) {
    EMBER_CHECK(!t.valid() || t.type == DType::F32, "CUDA device: layer {}'s {} is {}, F32 expected", l, t.name,
                dtype_name(t.type));
  };
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (!layout_.attn[l].on) continue;
    const LayerWeights& F = model.file_layer(l);
    for (const TensorView* t : F.attention_tensors())
      if (t != &F.wq && t != &F.wk && t != &F.wv && t != &F.wo) f32(*t, l);
    for (const TensorView* t : F.ffn_block_tensors()) f32(*t, l);
  }
  EMBER_CHECK(!plan.output_gpu || (model.output_norm.type == DType::F32 &&
                                   (!model.output_norm_b.valid() || model.output_norm_b.type == DType::F32)),
              "CUDA device: the output norm is {}, F32 expected", dtype_name(model.output_norm.type));
  ArenaViews views = load_arena(model, d, layout_, writer, "CUDA");
  // A mixture's experts: the file's layout of their matrices (the CPU's may be repacked).
  experts_.assign(model.layers.size(), {});
  expert_index_.assign(model.layers.size(), {});
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& ids = plan.layers[l].gpu_experts;
    if (ids.empty()) continue;
    expert_index_[l].assign(static_cast<size_t>(model.layers[l].moe.n_expert()), -1);
    for (size_t i = 0; i < ids.size(); ++i) {
      const FfnWeights& w = views.experts[l][i];
      experts_[l].push_back({{w.gate.type, w.gate.data, w.gate.rows(), w.gate.cols()},
                             {w.up.type, w.up.data, w.up.rows(), w.up.cols()},
                             {w.down.type, w.down.data, w.down.rows(), w.down.cols()}});
      expert_index_[l][static_cast<size_t>(ids[i])] = static_cast<int32_t>(i);
    }
  }
  if (gpu_needs_expert_scratch(plan)) {
    const size_t slots = static_cast<size_t>(max_batch_ * pm.n_expert_used * n_embd_) * sizeof(float);
    ex_x_host_ = static_cast<float*>(cuda::malloc_host_pinned(slots));
    ex_out_host_ = static_cast<float*>(cuda::malloc_host_pinned(slots));
  }
  // Attention layers: the loader's views, a slot in the KV cache after the arena, the RoPE tables.
  const Hparams& hp = model.hp;
  attn_.assign(model.layers.size(), {});
  int64_t n_attn = 0;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (!layout_.attn[l].on) continue;
    attn_[l].slot = n_attn++;
    attn_[l].w = views.attn[l];
  }
  // The output head: its norm (F32) and the file's layout of its matrix.
  out_ = views.out;
  if (plan.output_gpu)
    logits_host_ = static_cast<float*>(
        cuda::malloc_host_pinned(static_cast<size_t>(max_batch_ * model.hp.n_vocab) * sizeof(float)));
  n_ctx_ = pm.n_ctx, n_attn_ = n_attn, n_seq_ = pm.n_seq, kv_layers_ = n_attn * pm.n_seq, kv_type_ = d.kv_type;
  kv_layer_bytes_ = KvCache::bytes_for(1, pm.n_ctx, pm.kv_dim, d.kv_type) / 2;
  EMBER_CHECK(2 * kv_layer_bytes_ * static_cast<uint64_t>(kv_layers_) == layout_.kv, "CUDA device: a KV cache of {} "
              "bytes, the layout counts {}", 2 * kv_layer_bytes_ * static_cast<uint64_t>(kv_layers_), layout_.kv);
  if (n_attn > 0) {
    auto table = [&](const cpu::RopeTable* t, uint64_t off) {
      if (!t) return;
      const auto& f = t->inv_freq();
      EMBER_CHECK(static_cast<int64_t>(f.size()) <= hp.head_dim / 2, "CUDA device: a RoPE table of {} frequencies "
                  "for heads of {}", f.size(), hp.head_dim);
      cuda::copy_to_device(arena_ + off, f.data(), f.size() * sizeof(double), stream_);
      cuda::stream_sync(stream_);
    };
    table(model.rope ? &model.rope_for_context(pm.n_ctx) : nullptr, own_.attn.rope);
    table(model.rope_local.get(), own_.attn.rope_local);
  }
  if (own_.ffn.counts) {  // the fired pairs' total starts at 0
    const uint64_t zero = 0;
    cuda::copy_to_device(arena_ + own_.ffn.counts, &zero, sizeof(zero), stream_);
    cuda::stream_sync(stream_);
  }
  size_t free1 = 0;
  cuda::mem_info(&free1, &total);
  log_info("CUDA device: {:.1f} MiB free after load: {:.1f} MiB taken (arena {:.1f} MiB, pinned buffers, the rest "
           "CUDA's own); graphs {}", free1 / 1048576.0, (free0 - std::min(free0, free1)) / 1048576.0,
           layout_.total / 1048576.0, graphs_ ? "on" : "off");
}

// ---- host results, waits and graphs -----------------------------------------------------------

void CudaDevice::to_host(void* pinned, const void* dev, size_t bytes, void* dst) {
  if (queue()) cuda::copy_to_host(pinned, dev, bytes, stream_);
  host_copies_.push_back({dst, pinned, bytes});
  counters_.bytes_out += bytes;
}

void CudaDevice::wait_event(void* event) {
  cuda::event_sync(event);
  ++counters_.host_waits;
}

void CudaDevice::capture_begin(uint64_t key) {
  EMBER_CHECK(mode_ == Mode::direct && !pending_ && block_layer_ < 0 && host_copies_.empty(),
              "CUDA device: capture_begin inside another sequence of calls");
  if (!graphs_ || key == 0) return;
  key_ = key, calls_ = 0;
  if (graph_cache_.count(key)) {
    mode_ = Mode::replay;
    return;
  }
  if (graph_cache_.size() >= kMaxGraphs) {
    for (auto& [k, g] : graph_cache_) cuda::graph_destroy(g.exec);
    graph_cache_.clear();
  }
  capture_launches0_ = cuda::launches();
  cuda::capture_begin(stream_);
  mode_ = Mode::capture;
}

void CudaDevice::sync() {
  EMBER_CHECK(!pending_ && block_layer_ < 0, "CUDA device: sync with an FFN share under way");
  if (mode_ == Mode::capture) {
    Graph g;
    mode_ = Mode::direct;
    g.exec = cuda::capture_end(stream_, &g.nodes);
    g.calls = calls_;
    captured_launches_ += cuda::launches() - capture_launches0_;
    graph_cache_[key_] = g;
  }
  if (key_ != 0) {  // the captured or replayed graph runs now
    const Graph& g = graph_cache_.at(key_);
    EMBER_CHECK(g.calls == calls_, "CUDA device: a replay of {} calls where {} were captured", calls_, g.calls);
    mode_ = Mode::direct;
    key_ = 0;
    cuda::graph_launch(g.exec, stream_);
    ++counters_.graphs;
    counters_.graph_nodes += g.nodes;
  }
  cuda::stream_sync(stream_);
  ++counters_.host_waits;
  for (const HostCopy& c : host_copies_) std::memcpy(c.dst, c.src, c.bytes);
  host_copies_.clear();
}

DeviceStats CudaDevice::stats() const {
  DeviceStats st{layout_.total, 0, crossings_, counters_};
  st.counters.launches = cuda::launches() - launches0_ - captured_launches_;
  if (own_.ffn.counts) {  // the fired pairs' total, on the device
    cuda::stream_sync(stream_);
    cuda::copy_to_host_sync(&st.fired, arena_ + own_.ffn.counts, sizeof(st.fired));
  }
  return st;
}

void CudaDevice::reset_stats() {
  EMBER_CHECK(mode_ == Mode::direct && !pending_, "CUDA device: reset_stats inside a sequence of calls");
  crossings_ = {};
  counters_ = {};
  launches0_ = cuda::launches();
  captured_launches_ = 0;
  if (own_.ffn.counts) {
    const uint64_t zero = 0;
    cuda::stream_sync(stream_);
    cuda::copy_to_device_sync(arena_ + own_.ffn.counts, &zero, sizeof(zero));
  }
}

// ---- a mixture's experts ----------------------------------------------------------------------

void CudaDevice::experts_begin(int64_t layer, const float* x, int64_t n, const int32_t* ids) {
  const size_t l = static_cast<size_t>(layer);
  EMBER_CHECK(layer >= 0 && l < experts_.size() && !experts_[l].empty(), "CUDA device: layer {} has no experts here",
              layer);
  EMBER_CHECK(n >= 1 && n <= max_batch_, "CUDA device: experts on {} tokens (1 to {})", n, max_batch_);
  EMBER_CHECK(mode_ == Mode::direct && !pending_ && ex_rows_ < 0, "CUDA device: experts_begin inside another call");
  const int64_t k = model_->layers[l].moe.n_used, ne = static_cast<int64_t>(experts_[l].size());
  const auto& index = expert_index_[l];
  // The slots of its experts, each expert's tokens ascending: first[i] .. first[i + 1]; next[i]
  // the filling position (capacity kept between calls: nothing allocated a token).
  expert_slots_.assign(static_cast<size_t>(2 * ne + 1 + n * k), 0);
  int32_t* first = expert_slots_.data();
  int32_t* next = first + ne + 1;
  int32_t* tokens = next + ne;
  for (int64_t s = 0; s < n * k; ++s)
    if (const int32_t i = index[static_cast<size_t>(ids[s])]; i >= 0) ++first[i + 1];
  for (int64_t i = 0; i < ne; ++i) first[i + 1] += first[i];
  std::copy(first, first + ne, next);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (const int32_t i = index[static_cast<size_t>(ids[t * k + j])]; i >= 0) tokens[next[i]++] = static_cast<int32_t>(t);
  const int64_t rows = first[ne];
  ex_rows_ = rows;
  if (rows == 0) return;
  const size_t rb = static_cast<size_t>(n_embd_) * sizeof(float);
  for (int64_t s = 0; s < rows; ++s) std::memcpy(ex_x_host_ + s * n_embd_, x + tokens[s] * n_embd_, rb);
  cuda::copy_to_device(at(layout_.ex_x), ex_x_host_, rb * static_cast<size_t>(rows), stream_);
  counters_.bytes_in += rb * static_cast<size_t>(rows);
  const cpu::Activation act = model_->hp.act;
  const Expert& e0 = experts_[l].front();
  const int64_t nf = e0.up.rows;
  int64_t most = 0;
  for (int64_t i = 0; i < ne; ++i) most = std::max<int64_t>(most, first[i + 1] - first[i]);
  if (most < cuda::kGemmMinTokens && e0.gate.type == e0.up.type) {
    // Few slots an expert (decode, small batches): every chosen expert in one launch a step,
    // the inputs and values rounded to 8 bits once for all slots.
    ex_runs_.clear();
    for (int64_t i = 0; i < ne; ++i)
      if (const int32_t m = first[i + 1] - first[i]; m > 0) {
        const Expert& e = experts_[l][static_cast<size_t>(i)];
        ex_runs_.push_back({e.gate.data, e.up.data, e.down.data, first[i], m});
      }
    const cuda::ExpertShape shape{e0.gate.type, e0.down.type, n_embd_, nf, act};
    const int n_runs = static_cast<int>(ex_runs_.size());
    float* h = at(own_.ex.ex_h);
    cuda::experts_gate_up(shape, ex_runs_.data(), n_runs, activations(at(layout_.ex_x), rows, n_embd_, own_.ex.ex_xq,
                                                                      {e0.gate.type}),
                          rows, h, stream_);
    cuda::experts_down(shape, ex_runs_.data(), n_runs, activations(h, rows, nf, own_.ex.ex_hq, {e0.down.type}), rows,
                       at(layout_.ex_out), stream_);
  } else {
    // A prompt: each expert's products on the tiles, its activations rounded with it.
    for (int64_t i = 0; i < ne; ++i) {
      const int64_t s0 = first[i], m = first[i + 1] - s0;
      if (m == 0) continue;
      const Expert& e = experts_[l][static_cast<size_t>(i)];
      float* h = at(own_.ex.ex_h) + s0 * nf;
      const cuda::Activations xa = activations(at(layout_.ex_x) + s0 * n_embd_, m, n_embd_,
                                               own_.ex.ex_xq + gpu_q8_bytes(n_embd_, s0), {e.gate.type, e.up.type});
      cuda::MatvecOut gate;  // act(gate x), then times up x in up's epilogue: the gated rule (model/ffn.hpp)
      gate.kind = cuda::Epilogue::act;
      gate.act = act;
      gate.y = h;
      cuda::matvec(e.gate, {}, xa, m, gate, stream_);
      cuda::MatvecOut up;
      up.kind = cuda::Epilogue::gate_mul;
      up.y = h;
      up.a = h;
      up.a_stride = nf;
      cuda::matvec(e.up, {}, xa, m, up, stream_);
      const cuda::Activations ha = activations(h, m, nf, own_.ex.ex_hq + gpu_q8_bytes(nf, s0), {e.down.type});
      cuda::MatvecOut down;
      down.y = at(layout_.ex_out) + s0 * n_embd_;
      cuda::matvec(e.down, {}, ha, m, down, stream_);
    }
  }
  cuda::copy_to_host(ex_out_host_, at(layout_.ex_out), rb * static_cast<size_t>(rows), stream_);
  counters_.bytes_out += rb * static_cast<size_t>(rows);
}

const float* CudaDevice::experts_end() {
  EMBER_CHECK(ex_rows_ >= 0, "CUDA device: experts_end without experts_begin");
  if (ex_rows_ > 0) {
    cuda::stream_sync(stream_);
    ++counters_.host_waits;
  }
  ex_rows_ = -1;
  return ex_out_host_;
}

// ---- FFN shares ---------------------------------------------------------------------------------

void CudaDevice::queue_share(size_t l, cuda::Activations xa, int64_t n, const ShareRule& rule, const float* px,
                             void* event) {
  const auto& s = layout_.layers[l];
  const Share& t = types_[l];
  auto* counts = reinterpret_cast<int32_t*>(arena_ + own_.ffn.counts + sizeof(uint64_t));
  auto* fired_total = reinterpret_cast<uint64_t*>(arena_ + own_.ffn.counts);
  const int32_t* rows = nullptr;     // the share's rows to test: all k of them,
  const int32_t* n_rows = nullptr;   // or the predicted ones (their count on the device)
  if (rule.predict) {
    // The predictor over all the layer's neurons (fc2 in predictor_row_order), its selection test
    // in fc2's pass: the share's predicted positions as rows, the CPU's into the mask.
    const auto& P = layout_.pred[l];
    auto* hid = at(own_.ffn.hid);
    auto* cand = reinterpret_cast<int32_t*>(arena_ + own_.ffn.cand);
    cuda::MatvecOut fc1;
    fc1.kind = cuda::Epilogue::relu;
    fc1.y = hid;
    cuda::matvec({t.fc1, arena_ + P.fc1, t.rank, n_embd_}, {}, activations(px, n, n_embd_, own_.ffn.pxq, {t.fc1}), n,
                 fc1, stream_);
    cuda::MatvecOut fc2;
    fc2.kind = cuda::Epilogue::select;
    fc2.threshold = rule.predictor_threshold;
    fc2.counts = counts;
    fc2.k = s.n;
    fc2.mask = arena_ + own_.ffn.mask;  // per token: the share's positions, then the CPU's
    fc2.mask_stride = n_ff_;
    cuda::matvec({t.fc2, arena_ + P.fc2, n_ff_, t.rank}, {}, activations(hid, n, t.rank, own_.ffn.hidq, {t.fc2}), n,
                 fc2, stream_);
    if (event) {
      if (n_ff_ > s.n) {
        const size_t mbytes = static_cast<size_t>(n * n_ff_);
        cuda::copy_to_host(mask_host_, arena_ + own_.ffn.mask, mbytes, stream_);
        counters_.bytes_out += mbytes;
      }
      predicted_layer_ = static_cast<int64_t>(l);
      cuda::event_record(event, stream_);
    }
    if (s.n == 0) return;
    cuda::compact(counts, s.n, nullptr, nullptr, cand, nullptr, cand + n_ff_, stream_);
    rows = cand;
    n_rows = cand + n_ff_;
  }
  if (s.n == 0) return;
  // Firing values of the share's rows (all, or the predicted ones) with the firing test in the
  // gate's pass, the firing rows compacted, up times the firing value in up's pass, the down.
  auto* a = at(layout_.act);
  auto* h = at(layout_.h);
  auto* active = reinterpret_cast<int32_t*>(arena_ + layout_.active);
  auto* pos = reinterpret_cast<int32_t*>(arena_ + own_.ffn.pos);
  int32_t* totals = pos + n_ff_;
  cuda::MatvecOut gate;
  gate.kind = cuda::Epilogue::fire;
  gate.y = a;
  gate.stride = s.n;
  gate.act = rule.act;
  gate.threshold = rule.threshold;
  gate.counts = counts;
  if (rule.predict && n > 1) {  // a batch: each row serves the tokens whose prediction names it
    gate.allowed = arena_ + own_.ffn.mask;
    gate.allowed_stride = n_ff_;
  }
  cuda::matvec({t.gate, arena_ + s.gate, s.n, n_embd_}, {rows, n_rows, s.n}, xa, n, gate, stream_);
  cuda::compact(counts, s.n, n_rows, rows, active, pos, totals, stream_, fired_total);
  cuda::MatvecOut up;
  up.kind = cuda::Epilogue::gate_mul;
  up.y = h;
  up.stride = s.n;
  up.a = a;
  up.a_stride = s.n;
  up.pos = pos;
  cuda::matvec({t.up, arena_ + s.up, s.n, n_embd_}, {active, totals, s.n}, xa, n, up, stream_);
  cuda::sparse_axpy_partial(t.down, arena_ + s.down, s.n, n_embd_, active, totals, h, s.n, n, at(own_.ffn.partial),
                            stream_);
}

void CudaDevice::ffn_begin(int64_t layer, const float* x, int64_t n, const ShareRule& rule) {
  const size_t l = static_cast<size_t>(layer);
  EMBER_CHECK(layer >= 0 && l < layout_.layers.size() && (layout_.layers[l].n > 0 || (rule.predict && layout_.pred[l].on)),
              "CUDA device: layer {} has no share", layer);
  EMBER_CHECK(!rule.predict || layout_.pred[l].on, "CUDA device: layer {}'s predictor is not here", layer);
  EMBER_CHECK(n >= 1 && n <= max_batch_, "CUDA device: batch of {} tokens (1 to {})", n, max_batch_);
  EMBER_CHECK(!pending_ && block_layer_ < 0 && mode_ == Mode::direct, "CUDA device: ffn_begin before the previous "
              "share's end");
  const auto& s = layout_.layers[l];
  const Share& t = types_[l];
  float* xd = at(layout_.x);
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  std::memcpy(x_host_, x, bytes);
  cuda::copy_to_device(xd, x_host_, bytes, stream_);
  counters_.bytes_in += bytes;
  const float* px = xd;  // the predictor's input
  if (rule.predict && rule.predictor_input == ShareRule::Input::hidden) {
    EMBER_CHECK(attn_[l].slot >= 0 && rule.hidden_row0 >= 0 && rule.hidden_row0 + n <= max_batch_,
                "CUDA device: the predictor of layer {} reads a hidden state this device does not hold", layer);
    px = at(own_.attn.x_hidden) + rule.hidden_row0 * n_embd_;
  } else if (rule.predict && rule.predictor_input == ShareRule::Input::host) {
    EMBER_CHECK(layout_.px != 0, "CUDA device: no predictor input buffer in the arena");
    // The pinned output buffer is free until this layer's partial comes back: stage the input there.
    std::memcpy(out_host_, rule.predictor_x, bytes);
    cuda::copy_to_device(at(layout_.px), out_host_, bytes, stream_);
    counters_.bytes_in += bytes;
    px = at(layout_.px);
  }
  const cuda::Activations xa =
      s.n > 0 ? activations(xd, n, n_embd_, own_.ffn.xq, {t.gate, t.up}) : cuda::Activations{xd, nullptr};
  queue_share(l, xa, n, rule, px, rule.predict ? predicted_event_ : nullptr);
  if (s.n > 0) {
    float* out = at(layout_.out);
    cuda::axpy_reduce(at(own_.ffn.partial), n_embd_, n, out, stream_);
    cuda::copy_to_host(out_host_, out, bytes, stream_);
    counters_.bytes_out += bytes;
  }
  pending_ = true;
  pending_predict_ = rule.predict;
  pending_share_ = s.n > 0;
  pending_n_ = n;
}

PredictedMask CudaDevice::ffn_predicted() {
  if (block_layer_ >= 0) {  // the FFN block's: behind the input's event
    EMBER_CHECK(pending_predict_, "CUDA device: ffn_predicted without a prediction");
    if (!input_waited_) wait_event(input_event_), input_waited_ = true;
  } else {
    EMBER_CHECK(pending_ && pending_predict_, "CUDA device: ffn_predicted without a predicted ffn_begin");
    wait_event(predicted_event_);
  }
  // Token t's row of n_ff bytes: the share's positions, then the CPU's neurons.
  const int64_t k = layout_.layers[static_cast<size_t>(predicted_layer_)].n;
  return {mask_host_ + k, n_ff_};
}

const float* CudaDevice::ffn_end() {
  EMBER_CHECK(pending_, "CUDA device: ffn_end without ffn_begin");
  cuda::stream_sync(stream_);
  ++counters_.host_waits;
  pending_ = false;
  if (!pending_share_) {  // a predictor alone: no partial output
    std::memset(out_host_, 0, static_cast<size_t>(pending_n_ * n_embd_) * sizeof(float));
    return out_host_;
  }
  return out_host_;
}

// ---- attention layers ------------------------------------------------------------------------

const CudaDevice::Attn& CudaDevice::attn_layer(int64_t layer) const {
  EMBER_CHECK(layer >= 0 && static_cast<size_t>(layer) < attn_.size() && attn_[static_cast<size_t>(layer)].slot >= 0,
              "CUDA device: layer {}'s attention is not here", layer);
  EMBER_CHECK(!pending_, "CUDA device: an attention step of layer {} while an FFN share is pending", layer);
  return attn_[static_cast<size_t>(layer)];
}

void CudaDevice::put_hidden(const float* x, int64_t n, std::span<const AttnSpan> spans) {
  EMBER_CHECK(n >= 1 && n <= max_batch_ && layout_.attn_scratch > 0, "CUDA device: a hidden state of {} tokens (1 to "
              "{}, with attention layers here)", n, max_batch_);
  ++calls_;
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  // The pinned buffers are reused only after a wait (sync, or an FFN input's event).
  std::memcpy(hidden_host_, x, bytes);
  if (queue()) cuda::copy_to_device(at(own_.attn.x_hidden), hidden_host_, bytes, stream_);
  if (!spans.empty()) {
    check_attn_spans(spans, n, max_batch_, n_seq_, "cuda");
    spans_.assign(spans.begin(), spans.end());
    for (size_t k = 0; k < spans.size(); ++k) positions_host_[k] = static_cast<int32_t>(spans[k].pos0);
    if (queue())
      cuda::copy_to_device(arena_ + own_.attn.positions, positions_host_, spans.size() * sizeof(int32_t), stream_);
    counters_.bytes_in += spans.size() * sizeof(int32_t);
  }
  ++crossings_.hidden_in;
  crossings_.bytes += bytes;
  counters_.bytes_in += bytes;
}

void CudaDevice::get_hidden(float* x, int64_t n) {
  EMBER_CHECK(n >= 1 && n <= max_batch_ && layout_.attn_scratch > 0, "CUDA device: a hidden state of {} tokens", n);
  ++calls_;
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  to_host(hidden_out_host_, at(own_.attn.x_hidden), bytes, x);
  ++crossings_.hidden_out;
  crossings_.bytes += bytes;
}

void CudaDevice::attention(int64_t layer, std::span<const AttnSpan> spans, int64_t n) {
  const Attn& A = attn_layer(layer);
  const LayerWeights& W = A.w;
  check_attn_spans(spans, n, max_batch_, n_seq_, "cuda");
  EMBER_CHECK(spans.size() == spans_.size(), "CUDA device: attention over other spans than put_hidden's");
  for (size_t k = 0; k < spans.size(); ++k)
    EMBER_CHECK(spans[k].seq == spans_[k].seq && spans[k].first == spans_[k].first && spans[k].n == spans_[k].n &&
                    spans[k].pos0 == spans_[k].pos0,
                "CUDA device: attention over other spans than put_hidden's");
  ++calls_;
  if (!queue()) return;
  const Hparams& hp = model_->hp;
  const int64_t d = hp.n_embd, hd = hp.head_dim, nq = hp.n_head * hd, nkv = hp.n_head_kv * hd;
  const bool ln = hp.norm == NormKind::layer;
  void* s = stream_;
  float *x = at(own_.attn.x_hidden), *xn = at(own_.attn.xn), *q = at(own_.attn.q), *k = at(own_.attn.k), *v = at(own_.attn.v),
        *att = at(own_.attn.att), *o = at(own_.attn.o);
  // As model/blocks.cpp's attention_block, step by step: the norm (rounded to 8 bits in its pass
  // where a projection takes that), Q/K/V with their biases in the matvecs' pass.
  const bool q8 = cuda::takes_q8(W.wq.type) || cuda::takes_q8(W.wk.type) || cuda::takes_q8(W.wv.type);
  cuda::norm_rows(x, dev_floats(W.attn_norm), dev_floats(W.attn_norm_b), xn, n, d, hp.norm_eps, ln, s,
                  q8 ? arena_ + own_.attn.aq : nullptr);
  const cuda::Activations xa{xn, q8 ? arena_ + own_.attn.aq : nullptr};
  for (auto [m, b, y] : {std::tuple{&W.wq, &W.bq, q}, std::tuple{&W.wk, &W.bk, k}, std::tuple{&W.wv, &W.bv, v}}) {
    cuda::MatvecOut mo;
    mo.y = y;
    mo.bias = dev_floats(*b);
    cuda::matvec(matrix(*m), {}, xa, n, mo, s);
  }
  if (W.q_norm.valid()) cuda::norm_rows(q, dev_floats(W.q_norm), nullptr, q, n * hp.n_head, hd, hp.norm_eps, false, s);
  if (W.k_norm.valid())
    cuda::norm_rows(k, dev_floats(W.k_norm), nullptr, k, n * hp.n_head_kv, hd, hp.norm_eps, false, s);
  // Per sequence: RoPE and the KV store in one launch, then attention, at the positions on the
  // device (a captured graph's attention covers the whole context: any later position).
  const AttentionRules rules = attention_rules(*model_, layer, n_ctx_);
  const bool f16 = kv_type_ == DType::F16;
  cuda::AttentionArgs args;
  args.n_head = hp.n_head, args.n_head_kv = hp.n_head_kv, args.head_dim = hd, args.n_ctx = n_ctx_;
  args.scale = rules.scale;
  args.window = rules.window;
  args.f16 = f16;
  cuda::RopeArgs rope;
  if (rules.rope) {  // none: learned positions (OPT)
    rope.inv_freq = reinterpret_cast<const double*>(arena_ + (rules.local_rope ? own_.attn.rope_local : own_.attn.rope));
    const cpu::RopeConfig& rc = rules.rope->config();
    rope.n_rot = rc.n_rot;
    rope.attn_factor = rc.attn_factor;
    rope.neox = rc.layout == cpu::RopeLayout::neox;
  }
  const auto* positions = reinterpret_cast<const int32_t*>(arena_ + own_.attn.positions);
  for (size_t i = 0; i < spans.size(); ++i) {
    const AttnSpan& sp = spans[i];
    float *qs = q + sp.first * nq, *ks = k + sp.first * nkv, *vs = v + sp.first * nkv;
    uint8_t* kc = arena_ + layout_.arena + static_cast<uint64_t>(sp.seq * n_attn_ + A.slot) * kv_layer_bytes_;
    uint8_t* vc = kc + static_cast<uint64_t>(kv_layers_) * kv_layer_bytes_;
    EMBER_CHECK(sp.pos0 + sp.n <= n_ctx_, "CUDA device: positions {}..{} of a context of {}", sp.pos0,
                sp.pos0 + sp.n - 1, n_ctx_);
    cuda::rope_store(qs, ks, vs, sp.n, hp.n_head, hp.n_head_kv, hd, positions + i, rope, kc, vc, f16, s);
    const int64_t max_positions = mode_ == Mode::capture ? n_ctx_ : sp.pos0 + sp.n;
    cuda::attention(args, qs, sp.n, positions + i, max_positions, kc, vc, att + sp.first * nq, at(own_.attn.scores),
                    at(own_.attn.attn_partial), s);
  }
  // The output projection: added to the residual in its pass (with a post-norm: kept, normed,
  // then added).
  const cuda::Activations aa = activations(att, n, nq, own_.attn.aq, {W.wo.type});
  cuda::MatvecOut mo;
  mo.bias = dev_floats(W.bo);
  if (W.attn_post_norm.valid()) {
    mo.y = o;
    cuda::matvec(matrix(W.wo), {}, aa, n, mo, s);
    cuda::norm_rows(o, dev_floats(W.attn_post_norm), nullptr, o, n, d, hp.norm_eps, false, s);
    cuda::add_inplace(x, o, n * d, s);
  } else {
    mo.kind = cuda::Epilogue::add;
    mo.y = x;
    cuda::matvec(matrix(W.wo), {}, aa, n, mo, s);
  }
}

void CudaDevice::ffn_block_begin(int64_t layer, int64_t n, const ShareRule& rule, bool host_input) {
  const Attn& A = attn_layer(layer);
  EMBER_CHECK(n >= 1 && n <= max_batch_, "CUDA device: an FFN block of {} tokens (1 to {})", n, max_batch_);
  EMBER_CHECK(block_layer_ < 0, "CUDA device: ffn_block_begin of layer {} before the previous ffn_block_end", layer);
  EMBER_CHECK(!host_input || mode_ == Mode::direct, "CUDA device: a captured FFN block with host input");
  const size_t l = static_cast<size_t>(layer);
  EMBER_CHECK(!rule.predict || layout_.pred[l].on, "CUDA device: layer {}'s predictor is not here", layer);
  block_layer_ = layer;
  pending_predict_ = rule.predict;
  input_waited_ = false;
  pending_n_ = n;
  ++calls_;
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  if (host_input) crossings_.bytes += bytes, counters_.bytes_out += bytes;
  if (!queue()) return;
  const Hparams& hp = model_->hp;
  const auto& s = layout_.layers[l];
  const Share& t = types_[l];
  float* xn = at(own_.attn.xn);
  // The norm, rounded to 8 bits in its pass where the share's gate or up takes that.
  const bool q8 = s.n > 0 && (cuda::takes_q8(t.gate) || cuda::takes_q8(t.up));
  cuda::norm_rows(at(own_.attn.x_hidden), dev_floats(A.w.ffn.norm), dev_floats(A.w.ffn.norm_b), xn, n, n_embd_,
                  hp.norm_eps, hp.norm == NormKind::layer, stream_, q8 ? arena_ + own_.ffn.xq : nullptr);
  if (host_input) {
    cuda::copy_to_host(ffn_in_host_, xn, bytes, stream_);
    if (!rule.predict) cuda::event_record(input_event_, stream_);
  }
  const float* px = xn;
  if (rule.predict && rule.predictor_input == ShareRule::Input::hidden) {
    EMBER_CHECK(rule.hidden_row0 >= 0 && rule.hidden_row0 + n <= max_batch_,
                "CUDA device: the predictor of layer {} reads rows {}.. of its hidden state", layer, rule.hidden_row0);
    px = at(own_.attn.x_hidden) + rule.hidden_row0 * n_embd_;
  }
  EMBER_CHECK(!rule.predict || rule.predictor_input != ShareRule::Input::host, "CUDA device: layer {}'s predictor "
              "reads a host input while its attention is here", layer);
  queue_share(l, {xn, q8 ? arena_ + own_.ffn.xq : nullptr}, n, rule, px, host_input && rule.predict ? input_event_ : nullptr);
}

const float* CudaDevice::ffn_host_input() {
  EMBER_CHECK(block_layer_ >= 0 && mode_ == Mode::direct, "CUDA device: ffn_host_input outside an FFN block");
  if (!input_waited_) wait_event(input_event_), input_waited_ = true;
  return ffn_in_host_;
}

void CudaDevice::ffn_block_end(int64_t layer, const float* cpu_out, int64_t n) {
  const Attn& A = attn_layer(layer);
  EMBER_CHECK(block_layer_ == layer && n == pending_n_, "CUDA device: ffn_block_end of layer {} ({} rows) after "
              "ffn_block_begin of layer {} ({} rows)", layer, n, block_layer_, pending_n_);
  EMBER_CHECK(!cpu_out || input_waited_, "CUDA device: the CPU's partial output before its input was taken");
  block_layer_ = -1;
  ++calls_;
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  float* o = at(own_.attn.o);
  if (cpu_out) {
    // The pinned buffer's last copy ran before this layer's input event, which was waited for.
    std::memcpy(ffn_out_host_, cpu_out, bytes);
    crossings_.bytes += bytes, counters_.bytes_in += bytes;
  }
  if (!queue()) return;
  if (cpu_out) cuda::copy_to_device(o, ffn_out_host_, bytes, stream_);
  const bool share = layout_.layers[static_cast<size_t>(layer)].n > 0;
  const bool post = A.w.ffn_post_norm.valid();
  float* x = at(own_.attn.x_hidden);
  // o = CPU + device + down bias (ffn_merge_partials' rule), then the residual.
  cuda::ffn_merge(x, o, cpu_out ? o : nullptr, share ? at(own_.ffn.partial) : nullptr, dev_floats(A.w.ffn.down_b),
                  n_embd_, n, post, stream_);
  if (post) {
    cuda::norm_rows(o, dev_floats(A.w.ffn_post_norm), nullptr, o, n, n_embd_, model_->hp.norm_eps, false, stream_);
    cuda::add_inplace(x, o, n * n_embd_, stream_);
  }
}

void CudaDevice::output(int64_t n, float* logits) {
  EMBER_CHECK(out_.output.valid(), "CUDA device: the output head is not here");
  EMBER_CHECK(!pending_ && block_layer_ < 0, "CUDA device: the output head while an FFN share is pending");
  EMBER_CHECK(n >= 1 && n <= max_batch_, "CUDA device: the output head on {} rows (1 to {})", n, max_batch_);
  ++calls_;
  const Hparams& hp = model_->hp;
  const size_t bytes = static_cast<size_t>(n * hp.n_vocab) * sizeof(float);
  float* dev_logits = at(layout_.logits);
  if (queue()) {
    float* xn = at(own_.attn.xn);
    const bool q8 = cuda::takes_q8(out_.output.type);
    cuda::norm_rows(at(own_.attn.x_hidden), dev_floats(out_.norm), dev_floats(out_.norm_b), xn, n, n_embd_, hp.norm_eps,
                    hp.norm == NormKind::layer, stream_, q8 ? arena_ + own_.attn.aq : nullptr);
    cuda::MatvecOut mo;
    mo.y = dev_logits;
    cuda::matvec(matrix(out_.output), {}, {xn, q8 ? arena_ + own_.attn.aq : nullptr}, n, mo, stream_);
    if (hp.final_softcap > 0) cuda::softcap(dev_logits, n * hp.n_vocab, hp.final_softcap, stream_);
  }
  to_host(logits_host_, dev_logits, bytes, logits);
  crossings_.bytes += bytes;
}

}  // namespace ember
