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
    if (layout_.layers[l].n == 0) continue;
    const FfnWeights& w = model.layers[l].ffn;
    types_[l] = {w.gate.type, w.up.type, down_nm[l].type};
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
  // Upload each share: its rows gathered on the host, one copy per buffer, on the device's own
  // stream and waited for before the staging buffer is reused: a blocking copy from pageable
  // memory is not ordered with the kernels of a non-blocking stream.
  std::vector<uint8_t> staging;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& s = layout_.layers[l];
    if (s.n == 0) continue;
    const auto& ids = plan.layers[l].gpu_neurons;
    auto upload = [&](const TensorView& src, uint64_t offset) {
      const size_t rb = src.row_size();
      staging.resize(rb * static_cast<size_t>(s.n));
      for (int64_t i = 0; i < s.n; ++i) std::memcpy(staging.data() + i * rb, src.row(ids[static_cast<size_t>(i)]), rb);
      cuda::copy_to_device(arena_ + offset, staging.data(), staging.size(), stream_);
      cuda::stream_sync(stream_);
    };
    upload(model.layers[l].ffn.gate, s.gate);
    upload(model.layers[l].ffn.up, s.up);
    upload(down_nm[l], s.down);
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

void CudaDevice::ffn_begin(int64_t layer, const float* x, int64_t n, cpu::Activation act, float threshold) {
  EMBER_CHECK(layer >= 0 && static_cast<size_t>(layer) < layout_.layers.size() && layout_.layers[layer].n > 0,
              "CUDA device: layer {} has no share", layer);
  EMBER_CHECK(n >= 1 && n <= max_batch_, "CUDA device: batch of {} tokens (1 to {})", n, max_batch_);
  EMBER_CHECK(!pending_, "CUDA device: ffn_begin before the previous ffn_end");
  const auto& s = layout_.layers[static_cast<size_t>(layer)];
  const Share& t = types_[static_cast<size_t>(layer)];
  auto* xd = reinterpret_cast<float*>(arena_ + layout_.x);
  auto* out = reinterpret_cast<float*>(arena_ + layout_.out);
  auto* a = reinterpret_cast<float*>(arena_ + layout_.act);
  auto* h = reinterpret_cast<float*>(arena_ + layout_.h);
  auto* active = reinterpret_cast<int32_t*>(arena_ + layout_.active);
  auto* pos = reinterpret_cast<int32_t*>(arena_ + layout_.pos);
  int32_t* counters = pos + n_ff_;
  const auto* rows = reinterpret_cast<const int32_t*>(arena_ + s.rows);
  const size_t bytes = static_cast<size_t>(n * n_embd_) * sizeof(float);
  std::memcpy(x_host_, x, bytes);
  cuda::copy_to_device(xd, x_host_, bytes, stream_);
  cuda::matvec(t.gate, arena_ + s.gate, n_embd_, s.n, xd, n, a, stream_);
  cuda::ffn_fire(act, threshold, a, s.n, n, rows, active, pos, counters, stream_);
  cuda::gather_matvec(t.up, arena_ + s.up, n_embd_, active, counters, s.n, xd, n, h, s.n, stream_);
  cuda::gate_mul(h, a, s.n, pos, counters, s.n, n, stream_);
  cuda::sparse_axpy(t.down, arena_ + s.down, n_embd_, active, counters, h, s.n, n, out, stream_);
  cuda::copy_to_host(out_host_, out, bytes, stream_);
  cuda::copy_to_host(counters_host_, counters, 2 * sizeof(int32_t), stream_);
  pending_ = true;
  pending_n_ = n;
}

const float* CudaDevice::ffn_end() {
  EMBER_CHECK(pending_, "CUDA device: ffn_end without ffn_begin");
  cuda::stream_sync(stream_);
  pending_ = false;
  fired_ += static_cast<uint64_t>(counters_host_[1]);
  return out_host_;
}

}  // namespace ember
