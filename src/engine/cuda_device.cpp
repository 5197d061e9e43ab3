#include "engine/cuda_device.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"
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
  if (out_host_) cuda::free_host_pinned(out_host_);
  if (counters_host_) cuda::free_host_pinned(counters_host_);
  if (mask_host_) cuda::free_host_pinned(mask_host_);
  if (predicted_event_) cuda::event_destroy(predicted_event_);
  if (stream_) cuda::stream_destroy(stream_);
}

void CudaDevice::no_attention() {
  fail("CUDA device: attention blocks do not run on CUDA yet; plan without attention on the GPU");
}

void CudaDevice::load(const Model& model, const DeviceLoad& d) {
  EMBER_CHECK(!arena_, "CUDA device: load called twice");
  EMBER_CHECK(d.pm && d.opts && d.plan, "CUDA device: load needs the plan, its model and options");
  EMBER_CHECK(d.down_nm.size() == model.layers.size(), "CUDA device: {} neuron-major down matrices for {} layers",
              d.down_nm.size(), model.layers.size());
  const std::string why = device_refusal(caps(), model, *d.plan, d.down_nm);
  EMBER_CHECK(why.empty(), "CUDA device: {}", why);
  const PlanModel& pm = *d.pm;
  const Plan& plan = *d.plan;
  const std::vector<TensorView>& down_nm = d.down_nm;
  layout_ = device_arena_layout(model, pm, *d.opts, plan, d.kv_type);
  n_embd_ = pm.n_embd, n_ff_ = pm.n_ff, max_batch_ = d.opts->max_batch;
  types_.assign(model.layers.size(), {});
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const FfnWeights& w = model.layers[l].ffn;
    if (layout_.layers[l].n > 0) types_[l].gate = w.gate.type, types_[l].up = w.up.type, types_[l].down = down_nm[l].type;
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
    upload_rows(down_nm[l], ids, s.n, s.down);
    std::vector<int32_t> rows(static_cast<size_t>(s.n));
    for (int64_t i = 0; i < s.n; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    cuda::copy_to_device(arena_ + s.rows, rows.data(), rows.size() * sizeof(int32_t), stream_);
    cuda::stream_sync(stream_);
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
  EMBER_CHECK(!rule.predict || rule.predictor_input != ShareRule::Input::hidden,
              "CUDA device: the predictor of layer {} reads the hidden state, which CUDA does not hold (no attention "
              "blocks on CUDA yet)", layer);
  EMBER_CHECK(n >= 1 && n <= max_batch_, "CUDA device: batch of {} tokens (1 to {})", n, max_batch_);
  EMBER_CHECK(!pending_, "CUDA device: ffn_begin before the previous ffn_end");
  const auto& s = layout_.layers[l];
  const Share& t = types_[l];
  auto* xd = reinterpret_cast<float*>(arena_ + layout_.x);
  auto* out = reinterpret_cast<float*>(arena_ + layout_.out);
  auto* a = reinterpret_cast<float*>(arena_ + layout_.act);
  auto* h = reinterpret_cast<float*>(arena_ + layout_.h);
  auto* active = reinterpret_cast<int32_t*>(arena_ + layout_.active);
  auto* pos = reinterpret_cast<int32_t*>(arena_ + layout_.pos);
  auto* partial = reinterpret_cast<float*>(arena_ + layout_.partial);
  int32_t* counters = pos + n_ff_;
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  std::memcpy(x_host_, x, bytes);
  cuda::copy_to_device(xd, x_host_, bytes, stream_);
  const int32_t* rows = reinterpret_cast<const int32_t*>(arena_ + s.rows);  // 0..k-1
  const int32_t* n_rows = nullptr;                                           // all k of them
  if (rule.predict) {
    // The predictor over all the layer's neurons (scores into h, fc2 in predictor_row_order),
    // the CPU's part of the prediction copied back behind an event, the share's part as rows.
    const float* px = xd;
    if (rule.predictor_input == ShareRule::Input::host) {
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
    cuda::matvec(t.fc1, arena_ + P.fc1, n_embd_, t.rank, px, n, hid, stream_);
    cuda::relu(hid, n * t.rank, stream_);
    cuda::matvec(t.fc2, arena_ + P.fc2, t.rank, n_ff_, hid, n, h, stream_);
    cuda::predict_select(h, n_ff_, n, rule.predictor_threshold, s.n, mask, cand, cand + n_ff_, stream_);
    cuda::copy_to_host(mask_host_, mask, static_cast<size_t>(n_ff_ - s.n), stream_);
    cuda::event_record(predicted_event_, stream_);
    rows = cand;
    n_rows = cand + n_ff_;
  }
  if (s.n > 0) {
    // Firing values of the share's rows (all, or the predicted ones), then the firing test.
    cuda::gather_matvec(t.gate, arena_ + s.gate, n_embd_, rows, n_rows, s.n, xd, n, a, s.n, stream_);
    cuda::ffn_fire(rule.act, rule.threshold, a, s.n, n, rows, active, pos, counters, stream_, n_rows);
    cuda::gather_matvec(t.up, arena_ + s.up, n_embd_, active, counters, s.n, xd, n, h, s.n, stream_);
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

}  // namespace ember
