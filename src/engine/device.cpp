#include "engine/device.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "ops/cpu/activation.hpp"

namespace ember {

FfnArenaLayout ffn_arena_layout(const PlanModel& m, const PlanOptions& opts, const Plan& plan) {
  EMBER_CHECK(plan.layers.size() == m.layers.size(), "device: plan has {} layers, the model {}", plan.layers.size(),
              m.layers.size());
  FfnArenaLayout a;
  uint64_t off = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t at = off;
    off += gpu_pad(bytes);
    return at;
  };
  a.layers.resize(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const PlanLayer& L = m.layers[l];
    auto& s = a.layers[l];
    s.n = static_cast<int64_t>(plan.layers[l].gpu_neurons.size());
    if (s.n == 0) continue;
    const uint64_t k = static_cast<uint64_t>(s.n);
    s.gate = take(k * L.gate_row);
    s.up = take(k * L.up_row);
    s.down = take(k * L.down_row);
    s.rows = take(k * sizeof(int32_t));
  }
  if (off > 0) {  // the scratch, when any layer has a share (gpu_ffn_scratch_bytes)
    const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
    a.x = take(b * m.n_embd * f);
    a.out = take(b * m.n_embd * f);
    a.act = take(b * m.n_ff * f);
    a.h = take(b * m.n_ff * f);
    a.active = take(m.n_ff * sizeof(int32_t));
    a.pos = take((m.n_ff + 2) * sizeof(int32_t));  // positions, then the counters (CUDA)
  }
  a.total = off;
  // The layout and the solvers' accounting are two spellings of one sum: they must agree.
  EMBER_CHECK(a.total == gpu_ffn_bytes(m, opts, plan), "device: arena layout ({} bytes) disagrees with the plan's "
              "accounting ({} bytes)", a.total, gpu_ffn_bytes(m, opts, plan));
  return a;
}

uint64_t ffn_share_partial(ThreadPool& pool, const FfnShareWeights& w, const int32_t* rows, int64_t n_rows,
                           cpu::Activation act, float threshold, const float* x, int64_t n, float* out,
                           const FfnShareScratch& s) {
  const int64_t n_embd = w.down_nm.cols();
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n * n_embd));
  if (n_rows == 0) return 0;
  float* a = s.act;  // [n][n_rows]
  cpu::gather_matmul(pool, w.gate, x, n, rows, n_rows, a, n_rows, s.mm);
  cpu::activation_inplace(act, a, n * n_rows);
  int64_t na = 0;
  uint64_t fired = 0;
  for (int64_t i = 0; i < n_rows; ++i) {
    bool any = false;
    for (int64_t t = 0; t < n; ++t) {
      float& v = a[t * n_rows + i];
      if (std::fabs(v) > threshold) {
        any = true;
        ++fired;
      } else {
        v = 0.0f;
      }
    }
    if (any) {
      s.active[na] = rows[i];
      s.pos[na++] = static_cast<int32_t>(i);
    }
  }
  if (na == 0) return fired;
  float* h = s.h;  // [n][na]
  cpu::gather_matmul(pool, w.up, x, n, s.active, na, h, na, s.mm);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < na; ++k) h[t * na + k] *= a[t * n_rows + s.pos[k]];
  cpu::sparse_axpy(pool, w.down_nm, s.active, na, h, n, na, out, n_embd, s.axpy, cpu::AxpySplit::columns);
  return fired;
}

// ---- CpuDevice -----------------------------------------------------------------------------

CpuDevice::CpuDevice(int n_threads) : n_threads_(n_threads) {
  EMBER_CHECK(n_threads >= 1 && n_threads <= 1024, "device threads must be in [1, 1024], got {}", n_threads);
  pool_ = std::make_unique<ThreadPool>(n_threads);
  thread_ = std::thread([this] { driver(); });
}

CpuDevice::~CpuDevice() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

namespace {

TensorView rows_view(const TensorView& like, const uint8_t* data, int64_t n) {
  TensorView v;
  v.name = like.name;
  v.type = like.type;
  v.n_dims = 2;
  v.ne[0] = like.ne[0];
  v.ne[1] = n;
  v.data = data;
  v.nbytes = row_bytes(like.type, like.ne[0]) * static_cast<size_t>(n);
  return v;
}

}  // namespace

void CpuDevice::load(const Model& model, const std::vector<TensorView>& down_nm, const PlanModel& pm,
                     const PlanOptions& opts, const Plan& plan) {
  EMBER_CHECK(down_nm.size() == model.layers.size(), "device: {} neuron-major down matrices for {} layers",
              down_nm.size(), model.layers.size());
  layout_ = ffn_arena_layout(pm, opts, plan);
  arena_ = AlignedBuffer<uint8_t>(layout_.total);
  n_embd_ = pm.n_embd;
  max_batch_ = opts.max_batch;
  shares_.assign(model.layers.size(), {});
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const auto& s = layout_.layers[l];
    if (s.n == 0) continue;
    const FfnWeights& w = model.layers[l].ffn;
    const auto& ids = plan.layers[l].gpu_neurons;
    uint8_t* base = arena_.data();
    FfnShareWeights& sh = shares_[l];
    sh.gate = rows_view(w.gate, base + s.gate, s.n);
    sh.up = rows_view(w.up, base + s.up, s.n);
    sh.down_nm = rows_view(down_nm[l], base + s.down, s.n);
    EMBER_CHECK(sh.gate.row_stride() == pm.layers[l].gate_row && sh.up.row_stride() == pm.layers[l].up_row &&
                    sh.down_nm.row_stride() == pm.layers[l].down_row,
                "device: layer {} row sizes differ from the plan's model (was the plan made for other weights?)", l);
    auto* rows = reinterpret_cast<int32_t*>(base + s.rows);
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t j = ids[static_cast<size_t>(i)];
      std::memcpy(base + s.gate + i * sh.gate.row_stride(), w.gate.row(j), sh.gate.row_stride());
      std::memcpy(base + s.up + i * sh.up.row_stride(), w.up.row(j), sh.up.row_stride());
      std::memcpy(base + s.down + i * sh.down_nm.row_stride(), down_nm[l].row(j), sh.down_nm.row_stride());
      rows[i] = static_cast<int32_t>(i);
    }
  }
  // Kernel scratch (CPU kernels only: quantized activations, axpy rows); not device memory.
  mm_bytes_ = 0;
  for (size_t l = 0; l < model.layers.size(); ++l)
    if (layout_.layers[l].n > 0)
      mm_bytes_ = std::max({mm_bytes_, cpu::gather_matmul_scratch_bytes(model.layers[l].ffn.gate.type, n_embd_, max_batch_),
                            cpu::gather_matmul_scratch_bytes(model.layers[l].ffn.up.type, n_embd_, max_batch_)});
  mm_bytes_ = (mm_bytes_ + 63) / 64 * 64;
  kernel_scratch_ = AlignedBuffer<uint8_t>(
      mm_bytes_ + cpu::sparse_axpy_scratch_floats(n_embd_, max_batch_, n_threads_, cpu::AxpySplit::columns) * sizeof(float));
}

void CpuDevice::ffn_begin(int64_t layer, const float* x, int64_t n, cpu::Activation act, float threshold) {
  EMBER_CHECK(layer >= 0 && static_cast<size_t>(layer) < shares_.size() && layout_.layers[layer].n > 0,
              "device: layer {} has no share on {}", layer, name());
  EMBER_CHECK(n >= 1 && n <= max_batch_, "device: batch of {} tokens (1 to {})", n, max_batch_);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  // The "upload": the layer input into the device's own buffer.
  std::memcpy(arena_.data() + layout_.x, x, sizeof(float) * static_cast<size_t>(n * n_embd_));
  job_layer_ = layer, job_n_ = n, job_act_ = act, job_threshold_ = threshold;
  pending_ = true;
  done_ = false;
  lock.unlock();
  cv_.notify_all();
}

const float* CpuDevice::ffn_end() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return reinterpret_cast<const float*>(arena_.data() + layout_.out);
}

void CpuDevice::driver() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return pending_ || stop_; });
      if (stop_) return;
      pending_ = false;
    }
    compute();
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }
}

void CpuDevice::compute() {
  const auto& s = layout_.layers[static_cast<size_t>(job_layer_)];
  uint8_t* base = arena_.data();
  FfnShareScratch sc;
  sc.act = reinterpret_cast<float*>(base + layout_.act);
  sc.h = reinterpret_cast<float*>(base + layout_.h);
  sc.active = reinterpret_cast<int32_t*>(base + layout_.active);
  sc.pos = reinterpret_cast<int32_t*>(base + layout_.pos);
  sc.mm = kernel_scratch_.data();
  sc.axpy = reinterpret_cast<float*>(kernel_scratch_.data() + mm_bytes_);
  fired_ += ffn_share_partial(*pool_, shares_[static_cast<size_t>(job_layer_)],
                              reinterpret_cast<const int32_t*>(base + s.rows), s.n, job_act_, job_threshold_,
                              reinterpret_cast<const float*>(base + layout_.x), job_n_,
                              reinterpret_cast<float*>(base + layout_.out), sc);
}

}  // namespace ember
