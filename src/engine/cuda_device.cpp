#include "engine/cuda_device.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"
#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace ember {

CudaDevice::CudaDevice() {
  std::string why;
  EMBER_CHECK(cuda::available(&why), "no usable CUDA device ({}); run without --vram-budget/--plan, or on a machine "
              "with an NVIDIA GPU", why);
  stream_ = cuda::stream_create();
  predicted_event_ = cuda::event_create();
}

CudaDevice::~CudaDevice() {
  if (pending_) {
    try {
      cuda::stream_sync(stream_);
    } catch (const Error&) {
    }
  }
  if (arena_) cuda::free_device(arena_);
  if (x_host_) cuda::free_host_pinned(x_host_);
  for (float* p : {out_host_, hidden_host_, ffn_in_host_, ffn_out_host_, logits_host_})
    if (p) cuda::free_host_pinned(p);
  if (counters_host_) cuda::free_host_pinned(counters_host_);
  if (mask_host_) cuda::free_host_pinned(mask_host_);
  if (predicted_event_) cuda::event_destroy(predicted_event_);
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
  EMBER_CHECK(d.pm && d.opts && d.plan, "CUDA device: load needs the plan, its model and options");
  const std::string why = device_refusal(caps(), model, *d.plan);
  EMBER_CHECK(why.empty(), "CUDA device: {}", why);
  check_down_rows(model, d);
  const PlanModel& pm = *d.pm;
  const Plan& plan = *d.plan;
  const std::vector<TensorView>& down_rows = d.down_rows;
  model_ = &model;
  layout_ = device_arena_layout(model, pm, *d.opts, plan, d.kv_type);
  n_embd_ = pm.n_embd, n_ff_ = pm.n_ff, max_batch_ = d.opts->max_batch;
  types_.assign(model.layers.size(), {});
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const FfnWeights& w = model.layers[l].ffn;
    if (layout_.layers[l].n > 0) types_[l].gate = w.gate.type, types_[l].up = w.up.type, types_[l].down = down_rows[l].type;
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
  x_host_ = static_cast<float*>(cuda::malloc_host_pinned(io));
  out_host_ = static_cast<float*>(cuda::malloc_host_pinned(io));
  hidden_host_ = static_cast<float*>(cuda::malloc_host_pinned(io));
  ffn_in_host_ = static_cast<float*>(cuda::malloc_host_pinned(io));
  ffn_out_host_ = static_cast<float*>(cuda::malloc_host_pinned(io));
  counters_host_ = static_cast<int32_t*>(cuda::malloc_host_pinned(2 * sizeof(int32_t)));
  mask_host_ = static_cast<uint8_t*>(cuda::malloc_host_pinned(static_cast<size_t>(n_ff_)));
  // Upload each share: its rows gathered on the host, one copy per buffer, on the device's own
  // stream and waited for before the staging buffer is reused: a blocking copy from pageable
  // memory is not ordered with the kernels of a non-blocking stream.
  std::vector<uint8_t> staging;
  auto upload_rows = [&](const TensorView& src, const int32_t* ids, int64_t n, uint64_t offset) {
    const size_t rb = src.row_size();
    staging.resize(rb * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) std::memcpy(staging.data() + i * rb, src.row(ids ? ids[i] : i), rb);
    cuda::copy_to_device(arena_ + offset, staging.data(), staging.size(), stream_);
    cuda::stream_sync(stream_);
  };
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (!layout_.pred[l].on) continue;
    const FfnWeights& w = model.layers[l].ffn;
    upload_rows(w.fc1, nullptr, w.fc1.rows(), layout_.pred[l].fc1);
    const std::vector<int32_t> order = predictor_row_order(plan, l, pm.n_ff);
    upload_rows(w.fc2, order.data(), w.fc2.rows(), layout_.pred[l].fc2);
  }
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& s = layout_.layers[l];
    if (s.n == 0) continue;
    const int32_t* ids = plan.layers[l].gpu_neurons.data();
    upload_rows(model.layers[l].ffn.gate, ids, s.n, s.gate);
    upload_rows(model.layers[l].ffn.up, ids, s.n, s.up);
    upload_rows(down_rows[l], nullptr, s.n, s.down);  // already in the share's order
    std::vector<int32_t> rows(static_cast<size_t>(s.n));
    for (int64_t i = 0; i < s.n; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    cuda::copy_to_device(arena_ + s.rows, rows.data(), rows.size() * sizeof(int32_t), stream_);
    cuda::stream_sync(stream_);
  }
  // A tensor uploaded into the arena at `off` and its view there (an empty view stays empty).
  auto placed = [&](const TensorView& from, uint64_t off) {
    TensorView v = from;
    if (!from.valid()) return v;
    EMBER_CHECK(from.contiguous(), "CUDA device: {} is not contiguous", from.name);
    cuda::copy_to_device(arena_ + off, from.data, from.nbytes, stream_);
    cuda::stream_sync(stream_);  // the source is the file's map: no pinned staging to keep
    v.stride = 0;
    v.data = arena_ + off;
    return v;
  };
  // Attention layers: the file's layout of their tensors (the CPU's may be repacked for its own
  // kernels), a slot in the KV cache after the arena, the RoPE tables.
  const Hparams& hp = model.hp;
  attn_.assign(model.layers.size(), {});
  int64_t n_attn = 0;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& at = layout_.attn[l];
    if (!at.on) continue;
    const LayerWeights& F = model.file_layer(l);
    Attn& A = attn_[l];
    A.slot = n_attn++;
    // A copy of the layer's views pointing into the arena, in the layout's order (as CpuDevice).
    auto src = F.attention_tensors();
    auto dst = A.w.attention_tensors();
    auto fsrc = F.ffn_block_tensors();
    auto fdst = A.w.ffn_block_tensors();
    size_t k = 0;
    for (size_t i = 0; i < src.size(); ++i) {
      const TensorView* from = src[i];
      const bool matrix = from == &F.wq || from == &F.wk || from == &F.wv || from == &F.wo;
      EMBER_CHECK(!from->valid() || matrix || from->type == DType::F32, "CUDA device: layer {}'s {} is {}, F32 "
                  "expected", l, from->name, dtype_name(from->type));
      *dst[i] = placed(*from, at.tensors[k++]);
    }
    for (size_t i = 0; i < fsrc.size(); ++i) {
      EMBER_CHECK(!fsrc[i]->valid() || fsrc[i]->type == DType::F32, "CUDA device: layer {}'s {} is {}, F32 expected",
                  l, fsrc[i]->name, dtype_name(fsrc[i]->type));
      *fdst[i] = placed(*fsrc[i], at.tensors[k++]);
    }
  }
  // The output head: its norm (F32) and the file's layout of its matrix.
  out_ = {};
  if (plan.output_gpu) {
    EMBER_CHECK(model.output_norm.type == DType::F32 && (!model.output_norm_b.valid() || model.output_norm_b.type == DType::F32),
                "CUDA device: the output norm is {}, F32 expected", dtype_name(model.output_norm.type));
    out_.norm = placed(model.output_norm, layout_.out_norm);
    out_.norm_b = placed(model.output_norm_b, layout_.out_norm_b);
    out_.output = placed(model.output_in_file(), layout_.out_w);
    logits_host_ = static_cast<float*>(
        cuda::malloc_host_pinned(static_cast<size_t>(max_batch_ * model.hp.n_vocab) * sizeof(float)));
  }
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
    table(model.rope ? &model.rope_for_context(pm.n_ctx) : nullptr, layout_.rope);
    table(model.rope_local.get(), layout_.rope_local);
  }
  size_t free1 = 0;
  cuda::mem_info(&free1, &total);
  log_info("CUDA device: {:.1f} MiB free after load: {:.1f} MiB taken (arena {:.1f} MiB, pinned buffers, the rest "
           "CUDA's own)", free1 / 1048576.0, (free0 - std::min(free0, free1)) / 1048576.0,
           layout_.total / 1048576.0);
}

void CudaDevice::ffn_begin(int64_t layer, const float* x, int64_t n, const ShareRule& rule) {
  const size_t l = static_cast<size_t>(layer);
  EMBER_CHECK(layer >= 0 && l < layout_.layers.size() && (layout_.layers[l].n > 0 || (rule.predict && layout_.pred[l].on)),
              "CUDA device: layer {} has no share", layer);
  EMBER_CHECK(!rule.predict || layout_.pred[l].on, "CUDA device: layer {}'s predictor is not here", layer);
  EMBER_CHECK(n >= 1 && n <= max_batch_, "CUDA device: batch of {} tokens (1 to {})", n, max_batch_);
  EMBER_CHECK(!pending_, "CUDA device: ffn_begin before the previous ffn_end");
  const auto& s = layout_.layers[l];
  const Share& t = types_[l];
  float* xd = at(layout_.x);
  auto* out = reinterpret_cast<float*>(arena_ + layout_.out);
  auto* a = reinterpret_cast<float*>(arena_ + layout_.act);
  auto* h = reinterpret_cast<float*>(arena_ + layout_.h);
  auto* active = reinterpret_cast<int32_t*>(arena_ + layout_.active);
  auto* pos = reinterpret_cast<int32_t*>(arena_ + layout_.pos);
  auto* partial = reinterpret_cast<float*>(arena_ + layout_.partial);
  int32_t* counters = pos + n_ff_;
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  if (x == ffn_in_host_ && layer == ffn_in_layer_ && n == ffn_in_n_) {
    xd = at(layout_.xn);  // the FFN input ffn_input made here: no copy back
  } else {
    std::memcpy(x_host_, x, bytes);
    cuda::copy_to_device(xd, x_host_, bytes, stream_);
  }
  const int32_t* rows = reinterpret_cast<const int32_t*>(arena_ + s.rows);  // 0..k-1
  const int32_t* n_rows = nullptr;                                           // all k of them
  if (rule.predict) {
    // The predictor over all the layer's neurons (scores into h, fc2 in predictor_row_order),
    // the CPU's part of the prediction copied back behind an event, the share's part as rows.
    const float* px = xd;
    if (rule.predictor_input == ShareRule::Input::hidden) {
      EMBER_CHECK(attn_[l].slot >= 0 && rule.hidden_row0 >= 0 && rule.hidden_row0 + n <= max_batch_,
                  "CUDA device: the predictor of layer {} reads a hidden state this device does not hold", layer);
      px = at(layout_.x_hidden) + rule.hidden_row0 * n_embd_;
    } else if (rule.predictor_input == ShareRule::Input::host) {
      EMBER_CHECK(layout_.px != 0, "CUDA device: no predictor input buffer in the arena");
      // The pinned output buffer is free until this layer's partial comes back: stage the input there.
      std::memcpy(out_host_, rule.predictor_x, bytes);
      auto* pxd = reinterpret_cast<float*>(arena_ + layout_.px);
      cuda::copy_to_device(pxd, out_host_, bytes, stream_);
      px = pxd;
    }
    auto* hid = reinterpret_cast<float*>(arena_ + layout_.hid);
    auto* mask = arena_ + layout_.mask;
    auto* cand = reinterpret_cast<int32_t*>(arena_ + layout_.cand);
    const auto& P = layout_.pred[l];
    cuda::matvec(t.fc1, arena_ + P.fc1, n_embd_, t.rank, activations(px, n, n_embd_, layout_.pxq, {t.fc1}), n, hid,
                 stream_);
    cuda::relu(hid, n * t.rank, stream_);
    cuda::matvec(t.fc2, arena_ + P.fc2, t.rank, n_ff_, activations(hid, n, t.rank, layout_.hidq, {t.fc2}), n, h,
                 stream_);
    cuda::predict_select(h, n_ff_, n, rule.predictor_threshold, s.n, mask, cand, cand + n_ff_, stream_);
    cuda::copy_to_host(mask_host_, mask, static_cast<size_t>(n_ff_ - s.n), stream_);
    cuda::event_record(predicted_event_, stream_);
    rows = cand;
    n_rows = cand + n_ff_;
  }
  if (s.n > 0) {
    // Firing values of the share's rows (all, or the predicted ones), then the firing test.
    const cuda::Activations xa = activations(xd, n, n_embd_, layout_.xq, {t.gate, t.up});
    cuda::gather_matvec(t.gate, arena_ + s.gate, n_embd_, rows, n_rows, s.n, xa, n, a, s.n, stream_);
    cuda::ffn_fire(rule.act, rule.threshold, a, s.n, n, rows, active, pos, counters, stream_, n_rows);
    cuda::gather_matvec(t.up, arena_ + s.up, n_embd_, active, counters, s.n, xa, n, h, s.n, stream_);
    cuda::gate_mul(h, a, s.n, pos, counters, s.n, n, stream_);
    cuda::sparse_axpy(t.down, arena_ + s.down, n_embd_, active, counters, h, s.n, n, out, partial, stream_);
    cuda::copy_to_host(out_host_, out, bytes, stream_);
    cuda::copy_to_host(counters_host_, counters, 2 * sizeof(int32_t), stream_);
  }
  pending_ = true;
  pending_predict_ = rule.predict;
  pending_share_ = s.n > 0;
  pending_n_ = n;
}

const uint8_t* CudaDevice::ffn_predicted() {
  EMBER_CHECK(pending_ && pending_predict_, "CUDA device: ffn_predicted without a predicted ffn_begin");
  cuda::event_sync(predicted_event_);
  return mask_host_;
}

const float* CudaDevice::ffn_end() {
  EMBER_CHECK(pending_, "CUDA device: ffn_end without ffn_begin");
  cuda::stream_sync(stream_);
  pending_ = false;
  if (!pending_share_) {  // a predictor alone: no partial output
    std::memset(out_host_, 0, static_cast<size_t>(pending_n_ * n_embd_) * sizeof(float));
    return out_host_;
  }
  fired_ += static_cast<uint64_t>(counters_host_[1]);
  return out_host_;
}

// ---- attention layers ------------------------------------------------------------------------

const CudaDevice::Attn& CudaDevice::attn_layer(int64_t layer) const {
  EMBER_CHECK(layer >= 0 && static_cast<size_t>(layer) < attn_.size() && attn_[static_cast<size_t>(layer)].slot >= 0,
              "CUDA device: layer {}'s attention is not here", layer);
  EMBER_CHECK(!pending_, "CUDA device: an attention step of layer {} while an FFN share is pending", layer);
  return attn_[static_cast<size_t>(layer)];
}

void CudaDevice::put_hidden(const float* x, int64_t n) {
  EMBER_CHECK(n >= 1 && n <= max_batch_ && layout_.attn_scratch > 0, "CUDA device: a hidden state of {} tokens (1 to "
              "{}, with attention layers here)", n, max_batch_);
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  // The pinned buffer is reused only after a synchronizing call (ffn_input or get_hidden).
  std::memcpy(hidden_host_, x, bytes);
  cuda::copy_to_device(at(layout_.x_hidden), hidden_host_, bytes, stream_);
  ++crossings_.hidden_in;
  crossings_.bytes += bytes;
}

void CudaDevice::get_hidden(float* x, int64_t n) {
  EMBER_CHECK(n >= 1 && n <= max_batch_ && layout_.attn_scratch > 0, "CUDA device: a hidden state of {} tokens", n);
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  cuda::copy_to_host(hidden_host_, at(layout_.x_hidden), bytes, stream_);
  cuda::stream_sync(stream_);
  std::memcpy(x, hidden_host_, bytes);
  ++crossings_.hidden_out;
  crossings_.bytes += bytes;
}

namespace {
// A norm's or bias's floats in the arena; null for a tensor the layer does not have.
const float* dev_floats(const TensorView& t) { return t.valid() ? reinterpret_cast<const float*>(t.data) : nullptr; }
}  // namespace

void CudaDevice::attention(int64_t layer, std::span<const AttnSpan> spans, int64_t n) {
  const Attn& A = attn_layer(layer);
  const LayerWeights& W = A.w;
  check_attn_spans(spans, n, max_batch_, n_seq_, "cuda");
  const Hparams& hp = model_->hp;
  const int64_t d = hp.n_embd, hd = hp.head_dim, nq = hp.n_head * hd, nkv = hp.n_head_kv * hd;
  const bool ln = hp.norm == NormKind::layer;
  void* s = stream_;
  float *x = at(layout_.x_hidden), *xn = at(layout_.xn), *q = at(layout_.q), *k = at(layout_.k), *v = at(layout_.v),
        *att = at(layout_.att), *o = at(layout_.o);
  // As model/blocks.cpp's attention_block, step by step.
  cuda::norm_rows(x, dev_floats(W.attn_norm), dev_floats(W.attn_norm_b), xn, n, d, hp.norm_eps, ln, s);
  const cuda::Activations xa = activations(xn, n, d, layout_.aq, {W.wq.type, W.wk.type, W.wv.type});
  cuda::matvec(W.wq.type, W.wq.data, d, nq, xa, n, q, s);
  cuda::matvec(W.wk.type, W.wk.data, d, nkv, xa, n, k, s);
  cuda::matvec(W.wv.type, W.wv.data, d, nkv, xa, n, v, s);
  if (W.bq.valid()) cuda::add_bias(q, dev_floats(W.bq), n, nq, s);
  if (W.bk.valid()) cuda::add_bias(k, dev_floats(W.bk), n, nkv, s);
  if (W.bv.valid()) cuda::add_bias(v, dev_floats(W.bv), n, nkv, s);
  if (W.q_norm.valid()) cuda::norm_rows(q, dev_floats(W.q_norm), nullptr, q, n * hp.n_head, hd, hp.norm_eps, false, s);
  if (W.k_norm.valid())
    cuda::norm_rows(k, dev_floats(W.k_norm), nullptr, k, n * hp.n_head_kv, hd, hp.norm_eps, false, s);
  // Positions, the cache and attention per sequence; the projections above and below on all rows.
  const AttentionRules rules = attention_rules(*model_, layer, n_ctx_);
  const bool f16 = kv_type_ == DType::F16;
  cuda::AttentionArgs args;
  args.n_head = hp.n_head, args.n_head_kv = hp.n_head_kv, args.head_dim = hd, args.n_ctx = n_ctx_;
  args.scale = rules.scale;
  args.window = rules.window;
  args.f16 = f16;
  for (const AttnSpan& sp : spans) {
    float *qs = q + sp.first * nq, *ks = k + sp.first * nkv, *vs = v + sp.first * nkv;
    if (rules.rope) {  // none: learned positions (OPT)
      const auto* inv = reinterpret_cast<const double*>(arena_ + (rules.local_rope ? layout_.rope_local : layout_.rope));
      const cpu::RopeConfig& rc = rules.rope->config();
      const bool neox = rc.layout == cpu::RopeLayout::neox;
      cuda::rope(qs, sp.n, hp.n_head, hd, sp.pos0, inv, rc.n_rot, rc.attn_factor, neox, s);
      cuda::rope(ks, sp.n, hp.n_head_kv, hd, sp.pos0, inv, rc.n_rot, rc.attn_factor, neox, s);
    }
    uint8_t* kc = arena_ + layout_.arena + static_cast<uint64_t>(sp.seq * n_attn_ + A.slot) * kv_layer_bytes_;
    uint8_t* vc = kc + static_cast<uint64_t>(kv_layers_) * kv_layer_bytes_;
    EMBER_CHECK(sp.pos0 + sp.n <= n_ctx_, "CUDA device: positions {}..{} of a context of {}", sp.pos0,
                sp.pos0 + sp.n - 1, n_ctx_);
    cuda::kv_store(ks, sp.n, nkv, kc, sp.pos0, f16, s);
    cuda::kv_store(vs, sp.n, nkv, vc, sp.pos0, f16, s);
    cuda::attention(args, qs, sp.n, sp.pos0, kc, vc, att + sp.first * nq, at(layout_.scores), at(layout_.attn_partial),
                    s);
  }
  cuda::matvec(W.wo.type, W.wo.data, nq, d, activations(att, n, nq, layout_.aq, {W.wo.type}), n, o, s);
  if (W.bo.valid()) cuda::add_bias(o, dev_floats(W.bo), n, d, s);
  if (W.attn_post_norm.valid())
    cuda::norm_rows(o, dev_floats(W.attn_post_norm), nullptr, o, n, d, hp.norm_eps, false, s);
  cuda::add_inplace(x, o, n * d, s);
  ffn_in_layer_ = -1;
}

const float* CudaDevice::ffn_input(int64_t layer, int64_t n) {
  const Attn& A = attn_layer(layer);
  EMBER_CHECK(n >= 1 && n <= max_batch_, "CUDA device: an FFN input of {} tokens (1 to {})", n, max_batch_);
  const Hparams& hp = model_->hp;
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  cuda::norm_rows(at(layout_.x_hidden), dev_floats(A.w.ffn.norm), dev_floats(A.w.ffn.norm_b), at(layout_.xn), n,
                  n_embd_, hp.norm_eps, hp.norm == NormKind::layer, stream_);
  cuda::copy_to_host(ffn_in_host_, at(layout_.xn), bytes, stream_);
  cuda::stream_sync(stream_);
  ffn_in_layer_ = layer, ffn_in_n_ = n;  // ffn_begin takes it from layout_.xn
  crossings_.bytes += bytes;
  return ffn_in_host_;
}

void CudaDevice::ffn_finish(int64_t layer, const float* out, int64_t n) {
  const Attn& A = attn_layer(layer);
  EMBER_CHECK(n >= 1 && n <= max_batch_, "CUDA device: an FFN output of {} tokens (1 to {})", n, max_batch_);
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  // The pinned buffer is reused only after the next ffn_input's synchronization.
  std::memcpy(ffn_out_host_, out, bytes);
  float* o = at(layout_.o);
  cuda::copy_to_device(o, ffn_out_host_, bytes, stream_);
  if (A.w.ffn_post_norm.valid())
    cuda::norm_rows(o, dev_floats(A.w.ffn_post_norm), nullptr, o, n, n_embd_, model_->hp.norm_eps, false, stream_);
  cuda::add_inplace(at(layout_.x_hidden), o, n * n_embd_, stream_);
  ffn_in_layer_ = -1;
  crossings_.bytes += bytes;
}

void CudaDevice::output(int64_t n, float* logits) {
  EMBER_CHECK(out_.output.valid(), "CUDA device: the output head is not here");
  EMBER_CHECK(!pending_, "CUDA device: the output head while an FFN share is pending");
  EMBER_CHECK(n >= 1 && n <= max_batch_, "CUDA device: the output head on {} rows (1 to {})", n, max_batch_);
  const Hparams& hp = model_->hp;
  float* xn = at(layout_.xn);
  float* dev_logits = at(layout_.logits);
  cuda::norm_rows(at(layout_.x_hidden), dev_floats(out_.norm), dev_floats(out_.norm_b), xn, n, n_embd_, hp.norm_eps,
                  hp.norm == NormKind::layer, stream_);
  cuda::matvec(out_.output.type, out_.output.data, n_embd_, hp.n_vocab,
               activations(xn, n, n_embd_, layout_.aq, {out_.output.type}), n, dev_logits, stream_);
  if (hp.final_softcap > 0) cuda::softcap(dev_logits, n * hp.n_vocab, hp.final_softcap, stream_);
  const size_t bytes = static_cast<size_t>(n * hp.n_vocab) * sizeof(float);
  cuda::copy_to_host(logits_host_, dev_logits, bytes, stream_);
  cuda::stream_sync(stream_);
  std::memcpy(logits, logits_host_, bytes);
  crossings_.bytes += bytes;
}

}  // namespace ember
