// The CUDA backend against the CPU (the test-backend-ops idea): every CUDA op on random data of
// awkward shapes against a double-precision reference over the dequantized weights, and the
// hybrid engine with the CUDA device against the CPU stand-in on a synth model. Each test skips,
// saying why, in a build without CUDA or on a machine without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/session.hpp"
#include "model/synth.hpp"
#include "support/plans.hpp"
#include "support/session_logits.hpp"
#include "support/synth_files.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

#include "ops/cpu/attention.hpp"
#include "ops/cpu/norm.hpp"
#include "ops/cpu/rope.hpp"
#include "ops/cpu/vec.hpp"

#ifdef EMBER_HAS_CUDA
#include "engine/cuda_device.hpp"
#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_ops.hpp"
#endif

using namespace ember;

namespace {

#ifdef EMBER_HAS_CUDA
#define SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                       \
    std::string why;                                                                         \
    if (!cuda::available(&why)) GTEST_SKIP() << "no CUDA device (" << why << "): CUDA tests skipped"; \
  } while (0)
#else
#define SKIP_WITHOUT_GPU() GTEST_SKIP() << "built without CUDA (EMBER_CUDA=OFF, or no CUDA toolkit at configure time)"
#endif

#ifdef EMBER_HAS_CUDA
// A device buffer holding a copy of host data, freed at scope end.
template <class T>
struct DeviceVec {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceVec(const std::vector<T>& host) : n(host.size()) {
    p = static_cast<T*>(cuda::malloc_device(n * sizeof(T)));
    if (n) cuda::copy_to_device_sync(p, host.data(), n * sizeof(T));
  }
  explicit DeviceVec(size_t count) : DeviceVec(std::vector<T>(count)) {}
  ~DeviceVec() { cuda::free_device(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n) cuda::copy_to_host_sync(h.data(), p, n * sizeof(T));
    return h;
  }
};

struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // rows x cols, dequantized
};

Weights random_weights(DType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (auto& x : v) x = nd(rng);
  Weights w;
  const size_t rb = row_bytes(type, cols);
  w.bytes.resize(rb * static_cast<size_t>(rows));
  w.deq.resize(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, v.data() + r * cols, w.bytes.data() + r * rb, cols);
    dequantize_row(type, w.bytes.data() + r * rb, w.deq.data() + r * cols, cols);
  }
  return w;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

const DType kTypes[] = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1};
#endif

}  // namespace

#ifdef EMBER_HAS_CUDA
// One block's share of a row's dot product as the CUDA kernels define it for quantized rows
// against Q8_1 activations (the CPU's quantize_row): d_w d_x sum(q_w q_x) over the block's integer
// codes (Q4_0: q_w - 8), plus m_w s_x for Q4_1; in double. `mag` receives its magnitude.
static double q8_block_dot(DType type, const uint8_t* w, const BlockQ8_1& x, double* mag) {
  const double dx = fp16_to_fp32(x.d);
  int64_t isum = 0;
  double dw = 0, extra = 0;
  if (type == DType::Q8_0) {
    const auto& b = *reinterpret_cast<const BlockQ8_0*>(w);
    dw = fp16_to_fp32(b.d);
    for (int j = 0; j < 32; ++j) isum += b.qs[j] * x.qs[j];
  } else if (type == DType::Q4_0) {
    const auto& b = *reinterpret_cast<const BlockQ4_0*>(w);
    dw = fp16_to_fp32(b.d);
    for (int j = 0; j < 16; ++j) isum += ((b.qs[j] & 15) - 8) * x.qs[j] + ((b.qs[j] >> 4) - 8) * x.qs[j + 16];
  } else {
    const auto& b = *reinterpret_cast<const BlockQ4_1*>(w);
    dw = fp16_to_fp32(b.d);
    for (int j = 0; j < 16; ++j) isum += (b.qs[j] & 15) * x.qs[j] + (b.qs[j] >> 4) * x.qs[j + 16];
    extra = static_cast<double>(fp16_to_fp32(b.m)) * fp16_to_fp32(x.s);
  }
  const double v = dw * dx * static_cast<double>(isum);
  *mag += std::fabs(v) + std::fabs(extra);
  return v + extra;
}
#endif

// Matvec and gather-matvec: float rows against float activations, quantized rows against the
// activations rounded to 8 bits on the device, which must be the CPU's Q8_1 blocks byte for byte,
// multiplied in integers as the CPU multiplies them (so the only difference left is the order of
// float sums over blocks).
TEST(CudaOps, MatvecAndGatherMatchReference) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(1);
  void* stream = cuda::stream_create();
  for (DType type : kTypes) {
    for (auto [rows, cols, nt] : {std::tuple<int64_t, int64_t, int64_t>{1, 32, 1}, {37, 96, 3}, {301, 4096, 2}}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
      const Weights w = random_weights(type, rows, cols, rng);
      std::vector<float> x = random_floats(static_cast<size_t>(nt * cols), rng);
      x[3] = 0.5f * x[2];  // and a block of zeros: the scale 0 path
      if (cols >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
      DeviceVec<uint8_t> dw(w.bytes);
      DeviceVec<float> dx(x), dy(std::vector<float>(static_cast<size_t>(nt * rows), std::nanf("")));
      const bool q8 = cuda::takes_q8(type);
      const size_t xq_bytes = static_cast<size_t>(nt * cols / 32) * sizeof(BlockQ8_1);
      DeviceVec<uint8_t> dxq(std::vector<uint8_t>(xq_bytes, 0xee));
      if (q8) cuda::quantize_q8(dx.p, nt, cols, dxq.p, stream);
      const cuda::Activations a{dx.p, q8 ? dxq.p : nullptr};
      cuda::matvec(type, dw.p, cols, rows, a, nt, dy.p, stream);
      cuda::stream_sync(stream);
      const auto y = dy.get();
      // The device's Q8_1 blocks are the CPU's.
      std::vector<BlockQ8_1> xq(static_cast<size_t>(nt * cols / 32));
      quantize_row(DType::Q8_1, x.data(), xq.data(), nt * cols);
      if (q8) {
        const auto got = dxq.get();
        ASSERT_EQ(std::memcmp(got.data(), xq.data(), xq_bytes), 0) << "Q8_1 activations differ from the CPU's";
      }
      // Gather: every third row, backwards, stride rows + 1.
      std::vector<int32_t> ids;
      for (int64_t r = rows - 1; r >= 0; r -= 3) ids.push_back(static_cast<int32_t>(r));
      const int64_t ng = static_cast<int64_t>(ids.size());
      DeviceVec<int32_t> dids(ids), dn(std::vector<int32_t>{static_cast<int32_t>(ng)});
      DeviceVec<float> dg(static_cast<size_t>(nt * (rows + 1)));
      cuda::gather_matvec(type, dw.p, cols, dids.p, dn.p, ng, a, nt, dg.p, rows + 1, stream);
      cuda::stream_sync(stream);
      const auto g = dg.get();
      const size_t rb = row_bytes(type, cols);
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double ref = 0, mag = 0;
          if (q8) {
            const size_t bb = rb / static_cast<size_t>(cols / 32);
            for (int64_t b = 0; b < cols / 32; ++b)
              ref += q8_block_dot(type, w.bytes.data() + r * rb + b * bb, xq[static_cast<size_t>(t * cols / 32 + b)], &mag);
          } else {
            for (int64_t c = 0; c < cols; ++c) {
              ref += static_cast<double>(w.deq[r * cols + c]) * x[t * cols + c];
              mag += std::fabs(static_cast<double>(w.deq[r * cols + c]) * x[t * cols + c]);
            }
          }
          // Float sums of up to 4096 products (or 128 block terms): a bound well above their
          // rounding, far below a wrong value or activations rounded otherwise than the CPU's.
          ASSERT_NEAR(y[t * rows + r], ref, 5e-6 * mag + 1e-6) << "t " << t << " r " << r;
        }
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t i = 0; i < ng; ++i) ASSERT_EQ(g[t * (rows + 1) + i], y[t * rows + ids[i]]);
    }
  }
  cuda::stream_destroy(stream);
#endif
}

TEST(CudaOps, FireGateMulAxpyAndAddMatchReference) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(2);
  void* stream = cuda::stream_create();
  for (DType type : kTypes) {
    for (auto [n, cols, nt] : {std::tuple<int64_t, int64_t, int64_t>{1, 32, 1}, {1500, 160, 3}, {4097, 4096, 2}}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " n " + std::to_string(n));
      for (cpu::Activation act : {cpu::Activation::relu, cpu::Activation::silu}) {
        const float thr = act == cpu::Activation::relu ? 0.0f : 0.2f;
        std::vector<float> pre = random_floats(static_cast<size_t>(nt * n), rng);
        std::vector<int32_t> rows(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(n - 1 - i);
        DeviceVec<float> dy(pre);
        DeviceVec<int32_t> drows(rows), dactive(static_cast<size_t>(n)), dpos(static_cast<size_t>(n)), dcount(2);
        cuda::ffn_fire(act, thr, dy.p, n, nt, drows.p, dactive.p, dpos.p, dcount.p, stream);
        cuda::stream_sync(stream);
        const std::vector<float> y = dy.get();
        const std::vector<int32_t> active = dactive.get(), pos = dpos.get(), count = dcount.get();
        // Reference: the CPU activation, threshold, union over tokens, in order.
        std::vector<float> ref = pre;
        cpu::activation_inplace(act, ref.data(), nt * n);
        std::vector<int32_t> want_pos;
        int64_t fired = 0;
        for (int64_t i = 0; i < n; ++i) {
          bool any = false;
          for (int64_t t = 0; t < nt; ++t) {
            float& v = ref[t * n + i];
            if (std::fabs(v) > thr) any = true, ++fired;
            else v = 0.0f;
          }
          if (any) want_pos.push_back(static_cast<int32_t>(i));
        }
        ASSERT_EQ(count[0], static_cast<int32_t>(want_pos.size()));
        ASSERT_EQ(static_cast<int64_t>(count[1]), fired);
        for (size_t k = 0; k < want_pos.size(); ++k) {
          ASSERT_EQ(pos[k], want_pos[k]);
          ASSERT_EQ(active[k], rows[static_cast<size_t>(want_pos[k])]);
        }
        for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1e-6f * (1 + std::fabs(ref[i])));

        // gate_mul then sparse_axpy over the active rows of a random neuron-major D.
        const int64_t na = count[0];
        std::vector<float> h = random_floats(static_cast<size_t>(nt * n), rng);
        DeviceVec<float> dh(h);
        cuda::gate_mul(dh.p, dy.p, n, dpos.p, dcount.p, n, nt, stream);
        const Weights d = random_weights(type, n, cols, rng);
        DeviceVec<uint8_t> dd(d.bytes);
        DeviceVec<float> dout(std::vector<float>(static_cast<size_t>(nt * cols), std::nanf("")));  // poisoned
        DeviceVec<float> dpartial(std::vector<float>(static_cast<size_t>(cuda::kAxpyChunks * cols), std::nanf("")));
        cuda::sparse_axpy(type, dd.p, cols, dactive.p, dcount.p, dh.p, n, nt, dout.p, dpartial.p, stream);
        cuda::stream_sync(stream);
        const auto hm = dh.get(), out = dout.get();
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t k = 0; k < na; ++k)
            ASSERT_EQ(hm[t * n + k], h[t * n + k] * y[t * n + pos[k]]);
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t j = 0; j < cols; ++j) {
            double ref_o = 0, mag = 0;
            for (int64_t k = 0; k < na; ++k) {
              const double term = static_cast<double>(hm[t * n + k]) * d.deq[active[k] * cols + j];
              ref_o += term;
              mag += std::fabs(term);
            }
            ASSERT_NEAR(out[t * cols + j], ref_o, 2e-4 * mag + 1e-6) << "t " << t << " j " << j;
          }
      }
    }
  }
  // The merge.
  const auto a = random_floats(1000, rng), b = random_floats(1000, rng);
  DeviceVec<float> da(a), db(b), dc(1000);
  cuda::add(da.p, db.p, dc.p, 1000, stream);
  cuda::stream_sync(stream);
  const auto c = dc.get();
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], a[i] + b[i]);
  cuda::stream_destroy(stream);
#endif
}

// The predictor's steps: relu, predict_select (the share's positions compacted, the CPU's
// masked), and ffn_fire over a device-counted prefix of candidate rows, against the CPU.
TEST(CudaOps, PredictorSelectionAndCountedFireMatchTheCpu) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(11);
  void* stream = cuda::stream_create();
  for (int64_t n_ff : {1, 33, 1000, 2049}) {
    for (int64_t nt : {1, 3}) {
      for (int64_t k : {int64_t{0}, n_ff / 3, n_ff}) {
        const float thr = 0.3f;
        std::vector<float> scores = random_floats(static_cast<size_t>(nt * n_ff), rng);
        DeviceVec<float> ds(scores);
        cuda::relu(ds.p, nt * n_ff, stream);
        DeviceVec<uint8_t> dmask(std::vector<uint8_t>(static_cast<size_t>(n_ff), 7));
        DeviceVec<int32_t> dcand(std::vector<int32_t>(static_cast<size_t>(n_ff + 1), -1));
        cuda::predict_select(ds.p, n_ff, nt, thr, k, dmask.p, dcand.p, dcand.p + n_ff, stream);
        cuda::stream_sync(stream);
        const auto relu = ds.get();
        for (size_t i = 0; i < scores.size(); ++i) ASSERT_EQ(relu[i], std::max(scores[i], 0.0f));
        const auto mask = dmask.get();
        const auto cand = dcand.get();
        std::vector<int32_t> want;
        for (int64_t i = 0; i < n_ff; ++i) {
          bool any = false;
          for (int64_t t = 0; t < nt; ++t) any |= relu[t * n_ff + i] >= thr;
          if (i < k && any) want.push_back(static_cast<int32_t>(i));
          if (i >= k) {
            ASSERT_EQ(mask[i - k], any ? 1 : 0) << "position " << i;
          }
        }
        ASSERT_EQ(cand[n_ff], static_cast<int32_t>(want.size()));
        for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(cand[i], want[i]);
        if (k == 0) continue;
        // ffn_fire over the candidates' prefix of rows of length k (stride k), counted on the device.
        std::vector<float> y = random_floats(static_cast<size_t>(nt * k), rng);
        DeviceVec<float> dy(y);
        DeviceVec<int32_t> dactive(static_cast<size_t>(k)), dpos(static_cast<size_t>(k)), dcount(2);
        cuda::ffn_fire(cpu::Activation::relu, 0.0f, dy.p, k, nt, dcand.p, dactive.p, dpos.p, dcount.p, stream,
                       dcand.p + n_ff);
        cuda::stream_sync(stream);
        const auto active = dactive.get(), pos = dpos.get(), count = dcount.get();
        std::vector<int32_t> want_pos;
        for (size_t i = 0; i < want.size(); ++i) {
          bool any = false;
          for (int64_t t = 0; t < nt; ++t) any |= y[t * k + static_cast<int64_t>(i)] > 0.0f;
          if (any) want_pos.push_back(static_cast<int32_t>(i));
        }
        ASSERT_EQ(count[0], static_cast<int32_t>(want_pos.size()));
        for (size_t i = 0; i < want_pos.size(); ++i) {
          ASSERT_EQ(pos[i], want_pos[i]);
          ASSERT_EQ(active[i], want[static_cast<size_t>(want_pos[i])]);
        }
      }
    }
  }
  cuda::stream_destroy(stream);
#endif
}

// The attention block's kernels against the CPU's functions: norms (RMS and Layer, with and
// without weight and bias, in place), biases, the residual add, RoPE (both layouts, partial
// rotation, frequency factors and an attention factor), the KV store (F16 rounding as the CPU's),
// and attention (grouped heads, sliding windows, several tokens at pos0 > 0, F16 and F32 caches,
// head sizes 40 to 256) against the double-precision reference. Outputs are poisoned first.
TEST(CudaOps, AttentionBlockKernelsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(21);
  void* stream = cuda::stream_create();
  const float nan = std::nanf("");
  // Norms over rows of awkward widths.
  for (int64_t width : {1, 40, 257, 4096}) {
    for (bool layer : {false, true}) {
      SCOPED_TRACE(std::string(layer ? "layer" : "rms") + " norm, width " + std::to_string(width));
      const int64_t rows = 3;
      std::vector<float> x = random_floats(static_cast<size_t>(rows * width), rng);
      for (auto& v : x) v = v * 3 + 0.5f;  // a mean away from 0
      const std::vector<float> w = random_floats(static_cast<size_t>(width), rng);
      const std::vector<float> b = random_floats(static_cast<size_t>(width), rng);
      for (int with = 0; with < 3; ++with) {  // weight and bias, weight only, neither
        const float* hw = with < 2 ? w.data() : nullptr;
        const float* hb = with == 0 && layer ? b.data() : nullptr;
        std::vector<float> ref(x.size());
        if (layer) cpu::layer_norm(x.data(), hw, hb, ref.data(), rows, width, 1e-5f);
        else cpu::rms_norm(x.data(), hw, ref.data(), rows, width, 1e-5f);
        DeviceVec<float> dx(x), dw(w), db(b), dout(std::vector<float>(x.size(), nan));
        cuda::norm_rows(dx.p, hw ? dw.p : nullptr, hb ? db.p : nullptr, dout.p, rows, width, 1e-5f, layer, stream);
        cuda::norm_rows(dx.p, hw ? dw.p : nullptr, hb ? db.p : nullptr, dx.p, rows, width, 1e-5f, layer, stream);
        cuda::stream_sync(stream);
        const auto got = dout.get(), in_place = dx.get();
        for (size_t i = 0; i < ref.size(); ++i) {
          // Float sums of up to 4096 squares in another order: relative 1e-5 of the row's scale.
          ASSERT_NEAR(got[i], ref[i], 2e-5f * (1 + std::fabs(ref[i]))) << i;
          ASSERT_EQ(in_place[i], got[i]) << i;
        }
      }
    }
  }
  // Biases, the residual add and the output head's soft-cap.
  {
    const std::vector<float> y = random_floats(3 * 70, rng), b = random_floats(70, rng);
    DeviceVec<float> dy(y), db(b), dz(y), dc(y);
    cuda::add_bias(dy.p, db.p, 3, 70, stream);
    cuda::add_inplace(dz.p, dy.p, 3 * 70, stream);
    cuda::softcap(dc.p, 3 * 70, 0.3f, stream);
    cuda::stream_sync(stream);
    const auto got = dy.get(), sum = dz.get(), capped = dc.get();
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(got[i], y[i] + b[i % 70]);
      ASSERT_EQ(sum[i], y[i] + got[i]);
      ASSERT_NEAR(capped[i], 0.3f * std::tanh(y[i] / 0.3f), 1e-6f);
    }
  }
  // RoPE.
  for (auto layout : {cpu::RopeLayout::normal, cpu::RopeLayout::neox}) {
    for (auto [head_dim, n_rot] : {std::pair<int64_t, int>{64, 64}, {80, 32}, {128, 128}, {256, 256}}) {
      SCOPED_TRACE("rope head " + std::to_string(head_dim) + " rotating " + std::to_string(n_rot));
      cpu::RopeConfig rc;
      rc.n_rot = n_rot;
      rc.base = 10000.0;
      rc.layout = layout;
      if (head_dim == 80) {
        rc.linear_scale = 2.0;
        rc.attn_factor = 1.19;
        for (int i = 0; i < n_rot / 2; ++i) rc.freq_factors.push_back(1.0f + 0.1f * static_cast<float>(i));
      }
      const cpu::RopeTable table(rc);
      const int64_t n_tokens = 3, n_heads = 5, pos0 = 1000;
      std::vector<float> x = random_floats(static_cast<size_t>(n_tokens * n_heads * head_dim), rng);
      std::vector<float> ref = x;
      std::vector<float> cs(static_cast<size_t>(n_rot));
      for (int64_t t = 0; t < n_tokens; ++t) {
        table.angles(pos0 + t, cs.data());
        table.apply(ref.data() + t * n_heads * head_dim, n_heads, head_dim, cs.data());
      }
      DeviceVec<float> dx(x);
      DeviceVec<double> dinv(table.inv_freq());
      cuda::rope(dx.p, n_tokens, n_heads, head_dim, pos0, dinv.p, n_rot, rc.attn_factor,
                 layout == cpu::RopeLayout::neox, stream);
      cuda::stream_sync(stream);
      const auto got = dx.get();
      // The same angles in double; cos and sin may differ by an ulp from the host's libm.
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-6f * (1 + std::fabs(ref[i]))) << i;
    }
  }
  // The KV store and attention: one chunk of positions, and several (kAttnChunk = 256) merged,
  // with sliding windows that leave early chunks empty.
  for (bool f16 : {true, false}) {
    for (auto [n_head, n_head_kv, head_dim] :
         {std::tuple<int64_t, int64_t, int64_t>{4, 2, 40}, {8, 8, 64}, {6, 2, 128}, {2, 1, 256}}) {
      for (auto [n_ctx, pos0, n_tokens, window] :
           {std::tuple<int64_t, int64_t, int64_t, int64_t>{40, 17, 4, 0}, {40, 17, 4, 5}, {700, 500, 3, 0},
            {700, 500, 3, 300}, {1100, 1024, 2, 5}}) {
        SCOPED_TRACE(fmt::format("{} cache, {}/{} heads of {}, tokens {}..{}, window {}", f16 ? "F16" : "F32", n_head,
                                 n_head_kv, head_dim, pos0, pos0 + n_tokens - 1, window));
        const int64_t kvd = n_head_kv * head_dim, qd = n_head * head_dim;
        // The cache's earlier positions, then the new tokens' rows stored by kv_store.
        std::vector<float> k = random_floats(static_cast<size_t>(n_ctx * kvd), rng);
        std::vector<float> v = random_floats(static_cast<size_t>(n_ctx * kvd), rng);
        const std::vector<float> q = random_floats(static_cast<size_t>(n_tokens * qd), rng);
        const size_t vb = f16 ? 2 : 4;
        std::vector<uint8_t> kc(static_cast<size_t>(n_ctx * kvd) * vb), vc(kc.size());
        std::vector<float> kr = k, vr = v;  // the values the cache holds, as floats
        if (f16) {
          cpu::to_f16(k.data(), reinterpret_cast<uint16_t*>(kc.data()), n_ctx * kvd);
          cpu::to_f16(v.data(), reinterpret_cast<uint16_t*>(vc.data()), n_ctx * kvd);
          cpu::from_f16(reinterpret_cast<const uint16_t*>(kc.data()), kr.data(), n_ctx * kvd);
          cpu::from_f16(reinterpret_cast<const uint16_t*>(vc.data()), vr.data(), n_ctx * kvd);
        } else {
          std::memcpy(kc.data(), k.data(), kc.size());
          std::memcpy(vc.data(), v.data(), vc.size());
        }
        // Poison the new tokens' positions in the device's cache: kv_store must write them.
        std::vector<uint8_t> kc_dev = kc, vc_dev = vc;
        std::memset(kc_dev.data() + pos0 * kvd * vb, 0xff, static_cast<size_t>(n_tokens * kvd) * vb);
        std::memset(vc_dev.data() + pos0 * kvd * vb, 0xff, static_cast<size_t>(n_tokens * kvd) * vb);
        DeviceVec<uint8_t> dk(kc_dev), dv(vc_dev);
        const std::vector<float> k_new(k.begin() + pos0 * kvd, k.begin() + (pos0 + n_tokens) * kvd);
        const std::vector<float> v_new(v.begin() + pos0 * kvd, v.begin() + (pos0 + n_tokens) * kvd);
        DeviceVec<float> dkn(k_new), dvn(v_new), dq(q);
        cuda::kv_store(dkn.p, n_tokens, kvd, dk.p, pos0, f16, stream);
        cuda::kv_store(dvn.p, n_tokens, kvd, dv.p, pos0, f16, stream);
        cuda::AttentionArgs a;
        a.n_head = n_head, a.n_head_kv = n_head_kv, a.head_dim = head_dim, a.n_ctx = n_ctx;
        a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        a.window = window;
        a.f16 = f16;
        DeviceVec<float> dout(std::vector<float>(q.size(), nan));
        DeviceVec<float> dscores(std::vector<float>(static_cast<size_t>(n_tokens * n_head * n_ctx), nan));
        DeviceVec<float> dpartial(std::vector<float>(
            static_cast<size_t>(cuda::attention_partial_floats(n_tokens, n_head, head_dim, n_ctx)), nan));
        cuda::attention(a, dq.p, n_tokens, pos0, dk.p, dv.p, dout.p, dscores.p, dpartial.p, stream);
        cuda::stream_sync(stream);
        ASSERT_EQ(dk.get(), kc);  // the stored rows are the CPU's (F16: rounded as cpu::to_f16)
        ASSERT_EQ(dv.get(), vc);
        cpu::AttentionShape sh;
        sh.n_head = n_head, sh.n_head_kv = n_head_kv, sh.head_dim = head_dim, sh.scale = a.scale, sh.window = window;
        std::vector<float> ref(q.size());
        cpu::attention_reference(sh, q.data(), n_tokens, pos0, kr.data(), vr.data(), kvd, ref.data());
        const auto got = dout.get();
        for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 2e-5f * (1 + std::fabs(ref[i]))) << i;
      }
    }
  }
  cuda::stream_destroy(stream);
#endif
}

#ifdef EMBER_HAS_CUDA
// The same session on the CPU stand-in and on CUDA: logits and what each device counted.
struct OnBothDevices {
  test_support::Logits cpu, gpu;
  HybridStats gpu_stats;
  CrossingStats cpu_crossings, gpu_crossings;
  uint64_t cpu_bytes = 0, gpu_bytes = 0;
};
static OnBothDevices on_both_devices(const Model& model, SessionParams p) {
  OnBothDevices r;
  p.hybrid.device_kind = "cpu";
  Session s_cpu(model, p);
  r.cpu = test_support::session_logits(s_cpu);
  r.cpu_crossings = s_cpu.hybrid_ffn()->device().crossings();
  r.cpu_bytes = s_cpu.hybrid_ffn()->device().bytes();
  p.hybrid.device_kind = "cuda";
  Session s_gpu(model, p);
  r.gpu = test_support::session_logits(s_gpu);
  r.gpu_stats = s_gpu.hybrid_ffn()->stats();
  r.gpu_crossings = s_gpu.hybrid_ffn()->device().crossings();
  r.gpu_bytes = s_gpu.hybrid_ffn()->device().bytes();
  return r;
}

// Three sequences at once (test_support::session_logits_seqs), attention on every layer and half
// the neurons on the device, its chunks of 5 rows cutting through the sequences: CUDA's caches
// per sequence give each sequence's logits as a CUDA session of that sequence alone does (to
// float sums), twice the same, the stand-in's bytes, and the stand-in's logits to 1e-2. (Not 1e-4:
// CUDA's norms and attention sum in another order, the FFN input differs at 1e-8, and on the
// llama Q4_0 synth sequence 2's prompt then rounds one 8-bit activation the other way: 6e-3, in a
// session of one sequence as well; docs/hybrid.md.)
TEST(CudaOps, SeveralSequencesOnCudaEqualTheStandIn) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  for (const std::string arch : {"llama", "gemma3"}) {
    SCOPED_TRACE(arch);
    auto model = test_support::load_synth_in(test_support::test_temp_dir("cuda"),
                                             test_support::small_attention_synth(arch, 9, 2), "seqs-" + arch + ".gguf");
    const Plan plan = test_support::odd_neurons_plan(*model, [](size_t) { return true; });
    SessionParams p;
    p.n_threads = 2;
    p.n_ctx = 64;
    p.n_seq = 3;
    p.n_batch = 16;
    p.kv_type = DType::F16;
    p.hybrid.given = &plan;
    p.hybrid.plan.min_gpu_neurons = 0;
    p.hybrid.plan.max_batch = 5;
    test_support::Logits cpu, gpu, again;
    uint64_t cpu_bytes = 0, gpu_bytes = 0;
    for (const char* kind : {"cpu", "cuda", "cuda"}) {
      p.hybrid.device_kind = kind;
      Session s(*model, p);
      const test_support::Logits l = test_support::session_logits_seqs(s);
      (std::string(kind) == "cpu" ? cpu : gpu.empty() ? gpu : again) = l;
      (std::string(kind) == "cpu" ? cpu_bytes : gpu_bytes) = s.hybrid_ffn()->device().bytes();
    }
    EXPECT_EQ(again, gpu) << "two CUDA runs differ";
    EXPECT_EQ(cpu_bytes, gpu_bytes);
    p.hybrid.device_kind = "cuda";
    const test_support::Logits alone = test_support::session_logits_seqs_alone(*model, p);
    EXPECT_LT(test_support::max_rel_diff(alone, gpu), 1e-5);
    EXPECT_LT(test_support::max_rel_diff(cpu, gpu), 1e-2);
    std::filesystem::remove(model->file->path());
  }
#endif
}

// The hybrid engine with the CUDA device against the CPU stand-in and the all-CPU session, on a
// ReLU synth model of `type`: the oracle rule, or (powerinfer) the model's predictors.
static void expect_cuda_hybrid_equals_standin(DType type, bool predictors) {
  SCOPED_TRACE(std::string(dtype_name(type)) + (predictors ? " with predictors" : " oracle"));
  SynthOptions o;
  o.type = type;
  o.act = FfnActivation::relu;
  o.sparsity = 0.8f;
  o.powerinfer = predictors;  // predictors: F16 in an F32 file, Q4_0 in a Q4_0 file
  o.n_embd = 256, o.n_ff = 704, o.n_layer = 3, o.n_head = 4, o.n_head_kv = 2, o.seed = 6, o.n_threads = 2;
  const auto dir = std::filesystem::temp_directory_path() / "ember-test-cuda";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / ((predictors ? "pred-" : "relu-") + std::string(dtype_name(type)) + ".gguf")).string();
  synth_write(o, path);
  auto model = load_model(path);
  SessionParams p;
  p.n_threads = 2;
  p.n_ctx = 64;
  if (predictors) p.sparse.mode = FfnMode::predictor, p.sparse.mirrored_predictors = false;
  const auto all_cpu = [&] {
    Session s(*model, p);
    return test_support::session_logits(s);
  }();
  // About half the FFN on the device (a Q4_0 model is 7 times smaller than an F32 one).
  p.hybrid.vram_budget = type == DType::Q4_0 ? 3 << 18 : 3 << 20;
  p.hybrid.vram_reserve = 0;  // the same plan on both devices: no context taken out of the budget
  p.hybrid.cache = false;
  p.hybrid.method = PlanMethod::greedy;
  p.hybrid.device.sync_seconds = 0;
  p.hybrid.plan.min_gpu_neurons = 32;
  p.hybrid.plan.max_batch = 64;  // no chunks: predictions are the union over a batch, as all-CPU takes it
  p.hybrid.plan.attention = false;  // FFN shares only here (AttentionOnCudaEqualsTheStandIn: attention)
  const OnBothDevices r = on_both_devices(*model, p);
  const HybridStats& st = r.gpu_stats;
  EXPECT_GT(st.device_fired, 0u);
  EXPECT_GT(st.cpu_fired, 0u);
  if (predictors) {
    EXPECT_GT(st.cpu_predicted, 0u);
  }
  EXPECT_EQ(r.gpu_bytes, r.cpu_bytes);
  // Both devices round activations to the same 8 bits for quantized rows and multiply them in
  // integers: only the order of float sums differs. (Before the GPU rounded them so, a Q4_0 model
  // differed by 3e-2.) The all-CPU oracle holds a Q4_0 down as its shared-scale copy, the
  // hybrid's devices as Q8_0 rows (rounded a second time): 3e-2 apart.
  EXPECT_LT(test_support::max_rel_diff(r.cpu, r.gpu), 1e-4);
  EXPECT_LT(test_support::max_rel_diff(all_cpu, r.gpu), type == DType::Q4_0 ? 3e-2 : 1e-4);
  std::filesystem::remove(path);
}
#endif

TEST(CudaOps, HybridCudaEqualsCpuStandIn) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  for (DType type : {DType::F32, DType::Q4_0}) expect_cuda_hybrid_equals_standin(type, false);
#endif
}

// With predictors: CUDA runs the predictors of its layers and hands the CPU its part of the
// prediction.
TEST(CudaOps, HybridCudaWithPredictorsEqualsCpuStandIn) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  for (DType type : {DType::F32, DType::Q4_0}) expect_cuda_hybrid_equals_standin(type, true);
#endif
}

// Attention blocks on CUDA (the hidden state held there across consecutive layers, the FFN's
// input handed out once, the merged output taken back) against the CPU stand-in running the
// CPU's own blocks, over the families whose blocks differ: llama (F32 and Q4_0), qwen2 (biases),
// qwen3 (q/k norms), gemma3 (sliding windows, the local RoPE table, post-norms), phi3 (fused QKV,
// neox RoPE) and opt (LayerNorm, biases, no RoPE; its ungated FFN stays on the CPU); prompts in
// one device batch and in chunks; with every layer there, the output head too. Two CUDA runs are
// bit-identical.
TEST(CudaOps, AttentionOnCudaEqualsTheStandIn) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  for (const std::string variant : {"llama", "llama-q4_0", "qwen2", "qwen3", "gemma3", "phi3", "opt"}) {
    SCOPED_TRACE(variant);
    const std::string arch = variant == "llama-q4_0" ? "llama" : variant;
    SynthOptions o;
    o.arch = arch;
    o.act = arch == "llama" || arch == "opt" ? FfnActivation::relu : FfnActivation::silu;
    if (o.act == FfnActivation::relu) o.sparsity = 0.7f;
    o.type = variant == "llama-q4_0" ? DType::Q4_0 : DType::F32;
    o.n_embd = 128, o.n_ff = 288, o.n_layer = 3, o.n_head = 4, o.n_head_kv = arch == "opt" ? 4 : 2;
    o.tied = arch == "opt";
    o.seed = 8, o.n_threads = 2;
    const auto dir = std::filesystem::temp_directory_path() / "ember-test-cuda";
    std::filesystem::create_directories(dir);
    const std::string path = (dir / ("attn-" + variant + ".gguf")).string();
    synth_write(o, path);
    auto model = load_model(path);
    for (int64_t max_batch : {16, 5}) {
      for (int placement = 1; placement < 3; ++placement) {  // attention on layers 0 and 2, on all
        SCOPED_TRACE(fmt::format("batches of {}, placement {}", max_batch, placement));
        Plan plan;
        plan.method = PlanMethod::greedy;
        plan.vram_budget = uint64_t{1} << 40;
        plan.layers.resize(3);
        for (size_t l = 0; l < 3; ++l) {
          if (arch != "opt")
            for (int32_t j = 1; j < model->hp.n_ff; j += 2) plan.layers[l].gpu_neurons.push_back(j);
          plan.layers[l].attn_gpu = placement == 2 || l != 1;
        }
        plan.output_gpu = placement == 2;  // and the output head
        SessionParams p;
        p.n_threads = 2;
        p.n_ctx = 64;
        p.kv_type = DType::F16;
        p.hybrid.given = &plan;
        p.hybrid.plan.min_gpu_neurons = 0;
        p.hybrid.plan.max_batch = max_batch;
        const OnBothDevices r = on_both_devices(*model, p);
        const OnBothDevices again = on_both_devices(*model, p);
        EXPECT_EQ(again.gpu, r.gpu) << "two CUDA runs differ";
        EXPECT_EQ(r.cpu_crossings.hidden_in, r.gpu_crossings.hidden_in);
        EXPECT_EQ(r.cpu_crossings.hidden_out, r.gpu_crossings.hidden_out);
        EXPECT_EQ(r.gpu_bytes, r.cpu_bytes);
        // Activations of quantized rows rounded to the same 8 bits on both: float sums apart.
        EXPECT_LT(test_support::max_rel_diff(r.cpu, r.gpu), 1e-4);
      }
    }
    std::filesystem::remove(path);
  }
#endif
}
