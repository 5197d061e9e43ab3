// The CUDA backend against the CPU (the test-backend-ops idea): every CUDA op on random data of
// awkward shapes against a double-precision reference over the dequantized weights, and the
// hybrid engine with the CUDA device against the CPU stand-in on a synth model. Each test skips,
// saying why, in a build without CUDA or on a machine without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/session.hpp"
#include "synth/synth.hpp"
#include "support/plans.hpp"
#include "support/session_logits.hpp"
#include "support/synth_files.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"
#include "sparse/plan.hpp"
#include "ops/cpu/activation.hpp"

#include "ops/cpu/attention/attention.hpp"
#include "ops/cpu/norm.hpp"
#include "ops/cpu/rope.hpp"
#include "ops/cpu/vec.hpp"

#ifdef EMBER_HAS_CUDA
#include "device/cuda/cuda_device.hpp"
#include "device/cuda/cuda_scratch.hpp"
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

const DType kTypes[] = {DType::F32,  DType::F16,  DType::Q8_0, DType::Q4_0, DType::Q4_1,
                        DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};
// The types a neuron's row of the sparse down takes (a Q4_K down's neuron-major copy is Q8_0).
const DType kAxpyTypes[] = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1};
// Whether `type` holds rows of `cols` values (Q4_K: whole super-blocks of 256).
bool fits(DType type, int64_t cols) { return cols % info(type).block_size == 0; }
#endif

}  // namespace

#ifdef EMBER_HAS_CUDA
// One block's share of a row's dot product as the CUDA kernels define it for quantized rows
// against Q8_1 activations (the CPU's quantize_row): d_w d_x sum(q_w q_x) over the block's integer
// codes (Q4_0: q_w - 8, Q5_0: q_w - 16), plus m_w s_x for Q4_1, Q5_1, Q4_K and Q5_K (for block j
// of a K-quant super-block at w: d_w = d sc, m_w = -dmin m), Q6_K's halves each with their scale
// d sc; in double. `mag` receives its magnitude.
static double q8_block_dot(DType type, const uint8_t* w, const BlockQ8_1& x, double* mag, int j = 0) {
  const double dx = fp16_to_fp32(x.d);
  int64_t isum = 0;
  double dw = 0, extra = 0;
  if (type == DType::Q4_K || type == DType::Q5_K) {
    const auto& b4 = *reinterpret_cast<const BlockQ4_K*>(w);
    const auto& b5 = *reinterpret_cast<const BlockQ5_K*>(w);
    uint8_t sc, m;
    kquant_scale_min(type == DType::Q4_K ? b4.scales : b5.scales, j, sc, m);
    dw = static_cast<double>(fp16_to_fp32(type == DType::Q4_K ? b4.d : b5.d)) * sc;
    for (int i = 0; i < 32; ++i)
      isum += (type == DType::Q4_K ? q4_k_code(b4, 32 * j + i) : q5_k_code(b5, 32 * j + i)) * x.qs[i];
    extra = -static_cast<double>(fp16_to_fp32(type == DType::Q4_K ? b4.dmin : b5.dmin)) * m * fp16_to_fp32(x.s);
  } else if (type == DType::Q6_K) {
    const auto& b = *reinterpret_cast<const BlockQ6_K*>(w);
    int64_t half[2] = {0, 0};
    for (int i = 0; i < 32; ++i) half[i / 16] += q6_k_code(b, 32 * j + i) * x.qs[i];
    const double d = fp16_to_fp32(b.d);
    const double v = dx * (d * b.scales[2 * j] * static_cast<double>(half[0]) +
                           d * b.scales[2 * j + 1] * static_cast<double>(half[1]));
    *mag += std::fabs(dx * d * b.scales[2 * j] * static_cast<double>(half[0])) +
            std::fabs(dx * d * b.scales[2 * j + 1] * static_cast<double>(half[1]));
    return v;
  } else if (type == DType::Q5_0 || type == DType::Q5_1) {
    const bool m1 = type == DType::Q5_1;
    const auto& b0 = *reinterpret_cast<const BlockQ5_0*>(w);
    const auto& b1 = *reinterpret_cast<const BlockQ5_1*>(w);
    const uint8_t* qs = m1 ? b1.qs : b0.qs;
    uint32_t qh;
    std::memcpy(&qh, m1 ? b1.qh : b0.qh, 4);
    dw = fp16_to_fp32(m1 ? b1.d : b0.d);
    for (int i = 0; i < 32; ++i) {
      const int q = ((i < 16 ? qs[i] : qs[i - 16] >> 4) & 15) | ((qh >> i) & 1) << 4;
      isum += (m1 ? q : q - 16) * x.qs[i];
    }
    if (m1) extra = static_cast<double>(fp16_to_fp32(b1.m)) * fp16_to_fp32(x.s);
  } else if (type == DType::Q8_0) {
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

#ifdef EMBER_HAS_CUDA
// A matrix of random weights on the device, in its layout (cuda::pack_matrix).
struct DeviceMatrix {
  Weights w;
  std::unique_ptr<DeviceVec<uint8_t>> d;
  cuda::Matrix m;
  DeviceMatrix(DType type, int64_t rows, int64_t cols, std::mt19937& rng) : w(random_weights(type, rows, cols, rng)) {
    std::vector<uint8_t> packed(w.bytes.size());
    cuda::pack_matrix(type, w.bytes.data(), rows, cols, packed.data());
    d = std::make_unique<DeviceVec<uint8_t>>(packed);
    m = {type, d->p, rows, cols};
  }
};

// x's activations on the device as the matvecs of `type` read them: floats, and for quantized
// rows their 8-bit form made there. xq (host) receives the CPU's Q8_1 blocks of x.
struct DeviceActs {
  std::unique_ptr<DeviceVec<float>> f;
  std::unique_ptr<DeviceVec<uint8_t>> q;
  cuda::Activations a;
  DeviceActs(DType type, const std::vector<float>& x, int64_t nt, int64_t cols, void* stream) {
    f = std::make_unique<DeviceVec<float>>(x);
    a.f = f->p;
    if (!cuda::takes_q8(type)) return;
    q = std::make_unique<DeviceVec<uint8_t>>(std::vector<uint8_t>(gpu_q8_bytes(cols, nt), 0xee));
    cuda::quantize_q8(f->p, nt, cols, q->p, stream);
    a.q8 = q->p;
  }
};

// dot(W row r, x[t]) as the device defines it, in double, with its magnitude: the integer dot of
// the 8-bit activations for quantized rows (q8_block_dot), else the float dot.
static double device_dot(const Weights& w, DType type, int64_t r, int64_t cols, const std::vector<float>& x,
                         const std::vector<BlockQ8_1>& xq, int64_t t, double* mag) {
  double ref = 0;
  *mag = 0;
  if (type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K) {
    const size_t rb = row_bytes(type, cols), sb = row_bytes(type, 256);
    for (int64_t b = 0; b < cols / 32; ++b)
      ref += q8_block_dot(type, w.bytes.data() + r * rb + (b / 8) * sb, xq[static_cast<size_t>(t * cols / 32 + b)],
                          mag, static_cast<int>(b % 8));
  } else if (cuda::takes_q8(type)) {
    const size_t rb = row_bytes(type, cols), bb = rb / static_cast<size_t>(cols / 32);
    for (int64_t b = 0; b < cols / 32; ++b)
      ref += q8_block_dot(type, w.bytes.data() + r * rb + b * bb, xq[static_cast<size_t>(t * cols / 32 + b)], mag);
  } else {
    for (int64_t c = 0; c < cols; ++c) {
      const double p = static_cast<double>(w.deq[r * cols + c]) * x[t * cols + c];
      ref += p;
      *mag += std::fabs(p);
    }
  }
  return ref;
}
#endif

#ifdef EMBER_HAS_CUDA
// The down's sum at (token t, column j) in double, with its magnitude: h[t * h_stride + k] times
// row active[k] of D (dequantized) over the na active rows.
static double axpy_ref(const std::vector<float>& h, int64_t h_stride, const Weights& D, const int32_t* active,
                       int64_t na, int64_t cols, int64_t t, int64_t j, double* mag) {
  double ref = 0;
  *mag = 0;
  for (int64_t k = 0; k < na; ++k) {
    const double term = static_cast<double>(h[static_cast<size_t>(t * h_stride + k)]) *
                        D.deq[static_cast<size_t>(active[k] * cols + j)];
    ref += term;
    *mag += std::fabs(term);
  }
  return ref;
}
#endif

// Matvecs: float rows against float activations, quantized rows (in the device's split layout)
// against the activations rounded to 8 bits on the device, which must be the CPU's Q8_1 blocks
// byte for byte, multiplied in integers as the CPU multiplies them (so the only difference left
// is the order of float sums over blocks). One to 20 tokens (several passes of kMvTokens over a
// row, slices of tokens over blocks), the store / add / relu epilogues with a bias, a gather of
// rows by a device-counted list; outputs poisoned first.
TEST(CudaOps, MatvecAndGatherMatchReference) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(1);
  void* stream = cuda::stream_create();
  const float nan = std::nanf("");
  for (DType type : kTypes) {
    // Prompts (kGemmMinTokens tokens or more) take the tiled kernel: tiles cut at both ends.
    for (auto [rows, cols, nt] : {std::tuple<int64_t, int64_t, int64_t>{1, 32, 1}, {37, 96, 3}, {301, 4096, 2},
                                  {45, 160, 9}, {9, 64, 20}, {130, 40 * 32, 5}, {70, 96, 17}, {131, 288, 70},
                                  {64, 128, 64}, {45, 256, 9}, {131, 512, 70}}) {
      if (!fits(type, cols)) continue;
      SCOPED_TRACE(fmt::format("{} {}x{}, {} tokens", dtype_name(type), rows, cols, nt));
      const DeviceMatrix W(type, rows, cols, rng);
      std::vector<float> x = random_floats(static_cast<size_t>(nt * cols), rng);
      x[3] = 0.5f * x[2];  // and a block of zeros: the scale 0 path
      if (cols >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
      const DeviceActs xa(type, x, nt, cols, stream);
      std::vector<BlockQ8_1> xq(static_cast<size_t>(nt * cols / 32));
      quantize_row(DType::Q8_1, x.data(), xq.data(), nt * cols);
      if (cuda::takes_q8(type)) {  // the device's 8-bit activations are the CPU's
        cuda::stream_sync(stream);
        std::vector<BlockQ8_1> got(xq.size());
        cuda::q8_to_blocks(xa.q->get().data(), nt, cols, got.data());
        ASSERT_EQ(std::memcmp(got.data(), xq.data(), xq.size() * sizeof(BlockQ8_1)), 0)
            << "8-bit activations differ from the CPU's";
      }
      const std::vector<float> bias = random_floats(static_cast<size_t>(rows), rng);
      const std::vector<float> base = random_floats(static_cast<size_t>(nt * rows), rng);
      DeviceVec<float> dbias(bias), dy(std::vector<float>(static_cast<size_t>(nt * rows), nan)), dadd(base),
          drelu(std::vector<float>(static_cast<size_t>(nt * rows), nan));
      cuda::matvec(type, W.m.data, cols, rows, xa.a, nt, dy.p, stream);
      cuda::MatvecOut add;
      add.kind = cuda::Epilogue::add;
      add.y = dadd.p;
      add.bias = dbias.p;
      cuda::matvec(W.m, {}, xa.a, nt, add, stream);
      cuda::MatvecOut relu;
      relu.kind = cuda::Epilogue::relu;
      relu.y = drelu.p;
      cuda::matvec(W.m, {}, xa.a, nt, relu, stream);
      // A mixture's expert: act(v) (SiLU), and v times the values in place (no position list).
      DeviceVec<float> dact(std::vector<float>(static_cast<size_t>(nt * rows), nan)), dmul(base);
      cuda::MatvecOut act;
      act.kind = cuda::Epilogue::act;
      act.act = cpu::Activation::silu;
      act.y = dact.p;
      cuda::matvec(W.m, {}, xa.a, nt, act, stream);
      cuda::MatvecOut mul;
      mul.kind = cuda::Epilogue::gate_mul;
      mul.y = dmul.p;
      mul.a = dmul.p;
      mul.a_stride = rows;
      cuda::matvec(W.m, {}, xa.a, nt, mul, stream);
      cuda::stream_sync(stream);
      const auto y = dy.get(), added = dadd.get(), relued = drelu.get(), acted = dact.get(), mulled = dmul.get();
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double mag = 0;
          const double ref = device_dot(W.w, type, r, cols, x, xq, t, &mag);
          const size_t i = static_cast<size_t>(t * rows + r);
          // Float sums of up to 4096 products (or 128 block terms): a bound well above their
          // rounding, far below a wrong value or activations rounded otherwise than the CPU's.
          ASSERT_NEAR(y[i], ref, 5e-6 * mag + 1e-6) << "t " << t << " r " << r;
          ASSERT_EQ(added[i], base[i] + (y[i] + bias[static_cast<size_t>(r)]));
          ASSERT_EQ(relued[i], std::max(y[i], 0.0f));
          ASSERT_NEAR(acted[i], y[i] / (1.0f + std::exp(-y[i])), 1e-6 * std::fabs(y[i]) + 1e-7);
          ASSERT_EQ(mulled[i], y[i] * base[i]);
        }
      // Gather: every third row, backwards, stride rows + 1, the count on the device.
      std::vector<int32_t> ids;
      for (int64_t r = rows - 1; r >= 0; r -= 3) ids.push_back(static_cast<int32_t>(r));
      const int64_t ng = static_cast<int64_t>(ids.size());
      DeviceVec<int32_t> dids(ids), dn(std::vector<int32_t>{static_cast<int32_t>(ng)});
      DeviceVec<float> dg(std::vector<float>(static_cast<size_t>(nt * (rows + 1)), nan));
      cuda::gather_matvec(type, W.m.data, rows, cols, dids.p, dn.p, rows, xa.a, nt, dg.p, rows + 1, stream);
      cuda::stream_sync(stream);
      const auto g = dg.get();
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t i = 0; i < rows + 1; ++i) {
          if (i < ng) ASSERT_EQ(g[t * (rows + 1) + i], y[t * rows + ids[i]]);
          else ASSERT_TRUE(std::isnan(g[t * (rows + 1) + i])) << "a row past the count was written";
        }
    }
  }
  cuda::stream_destroy(stream);
#endif
}

// A mixture's experts in one launch a step (experts_gate_up, experts_down) against three matvecs
// an expert (gate with the activation, up times it, down), each expert's slots rounded to 8 bits
// on their own: the same bits, for every type, with experts of one slot and of several (cut at
// kMvTokens), an expert with none, and more experts than one launch takes.
TEST(CudaOps, ExpertsInOneLaunchEqualMatvecsAnExpert) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(11);
  void* stream = cuda::stream_create();
  const float nan = std::nanf("");
  for (DType type : kTypes)
    for (const std::vector<int32_t>& slots :
         {std::vector<int32_t>{1, 3, 0, 7, 2, 5}, std::vector<int32_t>(cuda::kExpertsPerLaunch + 5, 1)}) {
      const int64_t n_embd = fits(type, 160) ? 160 : 512, n_ff = fits(type, 96) ? 96 : 256,
                    ne = static_cast<int64_t>(slots.size());
      SCOPED_TRACE(fmt::format("{}, {} experts", dtype_name(type), ne));
      std::vector<DeviceMatrix> gate, up, down;
      std::vector<cuda::ExpertRun> runs;
      int32_t n_slots = 0;
      for (int64_t e = 0; e < ne; ++e) {
        gate.emplace_back(type, n_ff, n_embd, rng);
        up.emplace_back(type, n_ff, n_embd, rng);
        down.emplace_back(type, n_embd, n_ff, rng);
      }
      for (int64_t e = 0; e < ne; ++e) {
        runs.push_back({gate[e].m.data, up[e].m.data, down[e].m.data, n_slots, slots[static_cast<size_t>(e)]});
        n_slots += slots[static_cast<size_t>(e)];
      }
      const std::vector<float> x = random_floats(static_cast<size_t>(n_slots * n_embd), rng);
      const DeviceActs xa(type, x, n_slots, n_embd, stream);
      DeviceVec<float> h(std::vector<float>(static_cast<size_t>(n_slots * n_ff), nan));
      DeviceVec<float> out(std::vector<float>(static_cast<size_t>(n_slots * n_embd), nan));
      DeviceVec<uint8_t> hq(std::vector<uint8_t>(gpu_q8_bytes(n_ff, n_slots), 0));
      const cuda::ExpertShape shape{type, type, n_embd, n_ff, cpu::Activation::silu};
      cuda::experts_gate_up(shape, runs.data(), static_cast<int>(ne), xa.a, n_slots, h.p, stream);
      cuda::Activations ha{h.p, nullptr};
      if (cuda::takes_q8(type)) cuda::quantize_q8(h.p, n_slots, n_ff, hq.p, stream), ha.q8 = hq.p;
      cuda::experts_down(shape, runs.data(), static_cast<int>(ne), ha, n_slots, out.p, stream);
      cuda::stream_sync(stream);
      const auto got_h = h.get(), got_out = out.get();
      for (int64_t e = 0; e < ne; ++e) {
        const int32_t s0 = runs[e].first, m = runs[e].n;
        if (m == 0) continue;
        const std::vector<float> xe(x.begin() + s0 * n_embd, x.begin() + (s0 + m) * n_embd);
        const DeviceActs xea(type, xe, m, n_embd, stream);
        DeviceVec<float> he(std::vector<float>(static_cast<size_t>(m * n_ff), nan));
        DeviceVec<float> oe(std::vector<float>(static_cast<size_t>(m * n_embd), nan));
        cuda::MatvecOut g;
        g.kind = cuda::Epilogue::act;
        g.act = cpu::Activation::silu;
        g.y = he.p;
        cuda::matvec(gate[e].m, {}, xea.a, m, g, stream);
        cuda::MatvecOut u;
        u.kind = cuda::Epilogue::gate_mul;
        u.y = he.p;
        u.a = he.p;
        u.a_stride = n_ff;
        cuda::matvec(up[e].m, {}, xea.a, m, u, stream);
        cuda::stream_sync(stream);
        const DeviceActs hea(type, he.get(), m, n_ff, stream);
        cuda::matvec(type, down[e].m.data, n_ff, n_embd, hea.a, m, oe.p, stream);
        cuda::stream_sync(stream);
        const auto want_h = he.get(), want_out = oe.get();
        for (size_t i = 0; i < want_h.size(); ++i)
          ASSERT_EQ(got_h[static_cast<size_t>(s0 * n_ff) + i], want_h[i]) << "expert " << e << " h " << i;
        for (size_t i = 0; i < want_out.size(); ++i)
          ASSERT_EQ(got_out[static_cast<size_t>(s0 * n_embd) + i], want_out[i]) << "expert " << e << " out " << i;
      }
    }
  cuda::stream_destroy(stream);
#endif
}

// The prompt tiles on tensor cores (mma.sync m16n8k32; on the HIP CPU runtime its definition in
// shuffles) against the dp4a tiles: the same integer sums and float terms, so the same bits, for
// every 8-bit weight type, tiles cut at both ends, all rows and a gathered list, and the store
// (with a bias), firing (with its counts) and selection (with its mask and counts) epilogues.
TEST(CudaOps, PromptTilesOnTensorCoresEqualDp4a) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(7);
  void* stream = cuda::stream_create();
  const cuda::TileMath before = cuda::tile_math();
  for (DType type : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K,
                     DType::Q6_K}) {
    for (auto [rows, cols, nt] : {std::tuple<int64_t, int64_t, int64_t>{64, 128, 64}, {131, 288, 70}, {17, 64, 16},
                                  {200, 1024, 33}, {90, 96, 130}, {70, 256, 65}}) {
      if (!fits(type, cols)) continue;
      SCOPED_TRACE(fmt::format("{} {}x{}, {} tokens", dtype_name(type), rows, cols, nt));
      const DeviceMatrix W(type, rows, cols, rng);
      const std::vector<float> x = random_floats(static_cast<size_t>(nt * cols), rng);
      const DeviceActs xa(type, x, nt, cols, stream);
      std::vector<int32_t> ids;  // every other row, backwards
      for (int64_t r = rows - 1; r >= 0; r -= 2) ids.push_back(static_cast<int32_t>(r));
      const int64_t ng = static_cast<int64_t>(ids.size());
      DeviceVec<int32_t> dids(ids), dn(std::vector<int32_t>{static_cast<int32_t>(ng)});
      const DeviceVec<float> dbias(random_floats(static_cast<size_t>(rows), rng));
      struct Out {
        std::vector<float> y, fired_y;
        std::vector<int32_t> counts, sel_counts;
        std::vector<uint8_t> mask;
      };
      auto run = [&](cuda::TileMath m) {
        cuda::set_tile_math(m);
        DeviceVec<float> dy(static_cast<size_t>(nt * rows)), df(static_cast<size_t>(nt * ng));
        DeviceVec<int32_t> dc(static_cast<size_t>(ng)), ds(static_cast<size_t>(ng));
        DeviceVec<uint8_t> dm(static_cast<size_t>(nt * ng));
        cuda::MatvecOut store;
        store.y = dy.p;
        store.bias = dbias.p;
        cuda::matvec(W.m, {}, xa.a, nt, store, stream);
        cuda::MatvecOut fire;
        fire.kind = cuda::Epilogue::fire;
        fire.act = cpu::Activation::silu;
        fire.threshold = 0.05f;
        fire.y = df.p;
        fire.counts = dc.p;
        cuda::matvec(W.m, {dids.p, dn.p, ng}, xa.a, nt, fire, stream);
        cuda::MatvecOut sel;
        sel.kind = cuda::Epilogue::select;
        sel.threshold = 0.0f;
        sel.mask = dm.p;
        sel.mask_stride = ng;
        sel.counts = ds.p;
        sel.k = ng - 3;
        cuda::matvec(W.m, {dids.p, dn.p, ng}, xa.a, nt, sel, stream);
        cuda::stream_sync(stream);
        return Out{dy.get(), df.get(), dc.get(), ds.get(), dm.get()};
      };
      const Out dp4a = run(cuda::TileMath::dp4a), mma = run(cuda::TileMath::mma);
      ASSERT_EQ(std::memcmp(dp4a.y.data(), mma.y.data(), dp4a.y.size() * sizeof(float)), 0) << "store";
      ASSERT_EQ(std::memcmp(dp4a.fired_y.data(), mma.fired_y.data(), dp4a.fired_y.size() * sizeof(float)), 0)
          << "fire";
      ASSERT_EQ(dp4a.counts, mma.counts) << "fire counts";
      ASSERT_EQ(dp4a.sel_counts, mma.sel_counts) << "select counts";
      ASSERT_EQ(dp4a.mask, mma.mask) << "select mask";
      int64_t fired = 0;  // the firing test did fire, and not everywhere: the epilogue was exercised
      for (int32_t c : dp4a.counts) fired += c;
      ASSERT_GT(fired, 0);
      ASSERT_LT(fired, nt * ng);
    }
  }
  cuda::set_tile_math(before);
  cuda::stream_destroy(stream);
#endif
}

// A long prompt's down on tensor cores (bf16 mma over the exact codes and h d in three bf16
// parts; on the HIP CPU runtime the instruction's definition in shuffles) and the axpy it replaces,
// both against the double-precision sums over the dequantized rows: every 8-bit weight type, a
// column tile cut in half (160 = 2.5 tiles of 64), an active list in random order that ends
// inside a step, tokens past the last full tile, h with zeros.
TEST(CudaOps, PromptDownOnTensorCoresMatchesTheSums) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(11);
  void* stream = cuda::stream_create();
  const cuda::TileMath before = cuda::tile_math();
  const float nan = std::nanf("");
  for (DType type : {DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    for (auto [n_rows, cols, nt, na] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{64, 64, 64, 64},
                                        {300, 160, 70, 217}, {90, 96, 130, 9}}) {
      SCOPED_TRACE(fmt::format("{} {} rows of {}, {} tokens, {} active", dtype_name(type), n_rows, cols, nt, na));
      const DeviceMatrix D(type, n_rows, cols, rng);
      std::vector<int32_t> order(static_cast<size_t>(n_rows));
      for (int64_t r = 0; r < n_rows; ++r) order[static_cast<size_t>(r)] = static_cast<int32_t>(r);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int32_t> active(order.begin(), order.begin() + na);
      active.push_back(static_cast<int32_t>(na));  // the count, on the device after the list
      std::vector<float> h = random_floats(static_cast<size_t>(nt * na), rng);
      for (size_t i = 0; i < h.size(); i += 7) h[i] = 0.0f;
      DeviceVec<int32_t> dactive(active);
      DeviceVec<float> dh(h);
      std::vector<std::vector<float>> got;
      for (cuda::TileMath m : {cuda::TileMath::dp4a, cuda::TileMath::mma}) {
        cuda::set_tile_math(m);
        DeviceVec<float> dpart(std::vector<float>(static_cast<size_t>(nt * cols), nan));
        cuda::sparse_axpy_partial(type, D.m.data, n_rows, cols, dactive.p, dactive.p + na, dh.p, na, nt, dpart.p,
                                  stream);
        cuda::stream_sync(stream);
        got.push_back(dpart.get());
      }
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t j = 0; j < cols; ++j) {
          double mag = 0;
          const double ref = axpy_ref(h, na, D.w, active.data(), na, cols, t, j, &mag);
          const size_t i = static_cast<size_t>(t * cols + j);
          // Float sums of up to 217 terms (h d in parts of 24 bits): their rounding is below
          // 217 x 2^-24 of the magnitude, a wrong or missing term 1/217 of it.
          ASSERT_NEAR(got[0][i], ref, 1.5e-5 * mag + 1e-6) << "axpy, t " << t << " j " << j;
          ASSERT_NEAR(got[1][i], ref, 1.5e-5 * mag + 1e-6) << "tensor cores, t " << t << " j " << j;
        }
    }
  }
  cuda::set_tile_math(before);
  cuda::stream_destroy(stream);
#endif
}

#ifdef EMBER_HAS_CUDA
// The positions i < n with counts[i] > 0, in order, as cuda::compact lists them.
static std::vector<int32_t> flagged(const std::vector<int32_t>& counts, int64_t n) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i)
    if (counts[static_cast<size_t>(i)] > 0) v.push_back(static_cast<int32_t>(i));
  return v;
}
#endif

// An FFN share as the device computes it: the gate's matvec with the firing test in its pass
// (all rows, or a device-counted list of them), the firing positions compacted over several
// blocks (and the fired pairs counted, and added to a running total), up times the firing value
// in up's pass, the down's partial sums and their reduction, and the merge with a CPU part and
// a down bias into the residual; against the CPU's rule (model/ffn.hpp) on the same values.
TEST(CudaOps, FiringShareMatchesTheCpuRule) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(2);
  void* stream = cuda::stream_create();
  const float nan = std::nanf("");
  for (DType type : kAxpyTypes) {
    for (auto [n, cols, nt] : {std::tuple<int64_t, int64_t, int64_t>{1, 32, 1}, {1500, 160, 3}, {2500, 4096, 2},
                               {300, 64, 6}, {150, 96, 19}}) {
      SCOPED_TRACE(fmt::format("{}: {} neurons of {}, {} tokens", dtype_name(type), n, cols, nt));
      for (cpu::Activation act : {cpu::Activation::relu, cpu::Activation::silu}) {
        for (int variant = 0; variant < 3; ++variant) {
          // All rows; a device-counted list of them (a predictor's); the list with each row
          // serving only some tokens (per-token predictions).
          const bool listed = variant > 0, per_token = variant == 2;
          const float thr = act == cpu::Activation::relu ? 0.0f : 0.2f;
          const DeviceMatrix gate(type, n, cols, rng), up(type, n, cols, rng), down(type, n, cols, rng);
          const std::vector<float> x = random_floats(static_cast<size_t>(nt * cols), rng);
          const DeviceActs xa(type, x, nt, cols, stream);
          std::vector<BlockQ8_1> xq(static_cast<size_t>(nt * cols / 32));
          quantize_row(DType::Q8_1, x.data(), xq.data(), nt * cols);
          // The rows to test: all, or every other one backwards (a predictor's list).
          std::vector<int32_t> rows;
          for (int64_t i = n - 1; i >= 0; i -= 2) rows.push_back(static_cast<int32_t>(i));
          const int64_t nr = listed ? static_cast<int64_t>(rows.size()) : n;
          DeviceVec<int32_t> drows(rows), dnr(std::vector<int32_t>{static_cast<int32_t>(nr)});
          DeviceVec<float> da(std::vector<float>(static_cast<size_t>(nt * n), nan));
          DeviceVec<int32_t> dcounts(std::vector<int32_t>(static_cast<size_t>(n), -7));
          cuda::MatvecOut fire;
          fire.kind = cuda::Epilogue::fire;
          fire.y = da.p;
          fire.stride = n;
          fire.act = act;
          fire.threshold = thr;
          fire.counts = dcounts.p;
          std::vector<uint8_t> allowed(static_cast<size_t>(nt * n));
          for (size_t i = 0; i < allowed.size(); ++i) allowed[i] = (i * 7 + 3) % 5 != 0;
          DeviceVec<uint8_t> dallowed(allowed);
          if (per_token) fire.allowed = dallowed.p, fire.allowed_stride = n;
          const cuda::RowSet rs = listed ? cuda::RowSet{drows.p, dnr.p, n} : cuda::RowSet{nullptr, nullptr, n};
          cuda::matvec(gate.m, rs, xa.a, nt, fire, stream);
          DeviceVec<int32_t> dactive(std::vector<int32_t>(static_cast<size_t>(n), -1)),
              dpos(std::vector<int32_t>(static_cast<size_t>(n), -1)), dtot(std::vector<int32_t>{-1, -1});
          DeviceVec<uint64_t> dfired(std::vector<uint64_t>{5});
          cuda::compact(dcounts.p, n, listed ? dnr.p : nullptr, listed ? drows.p : nullptr, dactive.p, dpos.p, dtot.p,
                        stream, dfired.p);
          cuda::stream_sync(stream);
          const std::vector<float> a = da.get();
          const std::vector<int32_t> counts = dcounts.get(), active = dactive.get(), pos = dpos.get(), tot = dtot.get();
          // The CPU's rule on the device's pre-activations: activation, threshold, union over tokens.
          int64_t fired = 0;
          for (int64_t i = 0; i < nr; ++i) {
            const int64_t r = listed ? rows[static_cast<size_t>(i)] : i;
            int cnt = 0;
            for (int64_t t = 0; t < nt; ++t) {
              double mag = 0;
              const double pre = device_dot(gate.w, type, r, cols, x, xq, t, &mag);
              float want = cpu::activate(act, static_cast<float>(pre));
              const float got = a[static_cast<size_t>(t * n + i)];
              if (std::fabs(want) > thr && (!per_token || allowed[static_cast<size_t>(t * n + r)])) ++cnt;
              else want = 0.0f;
              // Near the threshold the two sums' last bits may decide differently: skip those.
              if (std::fabs(std::fabs(want) - thr) < 1e-4 * (1 + mag)) continue;
              ASSERT_NEAR(got, want, 1e-5 * (1 + mag)) << "t " << t << " i " << i;
            }
            (void)cnt;
          }
          const std::vector<int32_t> want_pos = flagged(counts, nr);
          for (int64_t i = 0; i < nr; ++i) {
            int cnt = 0;
            for (int64_t t = 0; t < nt; ++t) cnt += a[static_cast<size_t>(t * n + i)] != 0.0f;
            ASSERT_EQ(counts[static_cast<size_t>(i)], cnt) << "position " << i;
            fired += cnt;
          }
          ASSERT_EQ(tot[0], static_cast<int32_t>(want_pos.size()));
          ASSERT_EQ(tot[1], static_cast<int32_t>(fired));
          ASSERT_EQ(dfired.get()[0], 5u + static_cast<uint64_t>(fired));
          for (size_t k = 0; k < want_pos.size(); ++k) {
            ASSERT_EQ(pos[k], want_pos[k]);
            ASSERT_EQ(active[k], listed ? rows[static_cast<size_t>(want_pos[k])] : want_pos[k]);
          }
          // Up times the firing value, then the down over the active rows.
          const int64_t na = tot[0];
          DeviceVec<float> dh(std::vector<float>(static_cast<size_t>(nt * n), nan));
          cuda::MatvecOut um;
          um.kind = cuda::Epilogue::gate_mul;
          um.y = dh.p;
          um.stride = n;
          um.a = da.p;
          um.a_stride = n;
          um.pos = dpos.p;
          cuda::matvec(up.m, {dactive.p, dtot.p, n}, xa.a, nt, um, stream);
          DeviceVec<float> dout(std::vector<float>(static_cast<size_t>(nt * cols), nan));
          DeviceVec<float> dpartial(std::vector<float>(static_cast<size_t>(cuda::kAxpyChunks * cols), nan));
          cuda::sparse_axpy(type, down.m.data, n, cols, dactive.p, dtot.p, dh.p, n, nt, dout.p, dpartial.p, stream);
          cuda::stream_sync(stream);
          const auto h = dh.get(), out = dout.get();
          for (int64_t t = 0; t < nt; ++t)
            for (int64_t k = 0; k < na; ++k) {
              double mag = 0;
              const double u = device_dot(up.w, type, active[static_cast<size_t>(k)], cols, x, xq, t, &mag);
              const float av = a[static_cast<size_t>(t * n + pos[static_cast<size_t>(k)])];
              ASSERT_NEAR(h[static_cast<size_t>(t * n + k)], u * av, (5e-6 * mag + 1e-6) * std::fabs(av) + 1e-6);
            }
          for (int64_t t = 0; t < nt; ++t)
            for (int64_t j = 0; j < cols; ++j) {
              double mag = 0;
              const double ref_o = axpy_ref(h, n, down.w, active.data(), na, cols, t, j, &mag);
              ASSERT_NEAR(out[static_cast<size_t>(t * cols + j)], ref_o, 2e-5 * mag + 1e-6) << "t " << t << " j " << j;
            }
          // The FFN block's merge: x += cpu + the chunks + down_b, or o kept for a post-norm.
          const std::vector<float> xr = random_floats(static_cast<size_t>(nt * cols), rng),
                                   cpu = random_floats(static_cast<size_t>(nt * cols), rng),
                                   bias = random_floats(static_cast<size_t>(cols), rng);
          DeviceVec<float> dx(xr), dcpu(cpu), db(bias), dkeep(std::vector<float>(xr.size(), nan));
          cuda::ffn_merge(dx.p, dcpu.p, dcpu.p, dpartial.p, db.p, cols, nt, false, stream);
          cuda::ffn_merge(nullptr, dkeep.p, nullptr, dpartial.p, nullptr, cols, nt, true, stream);
          cuda::stream_sync(stream);
          const auto merged = dx.get(), kept = dkeep.get();
          for (size_t i = 0; i < xr.size(); ++i) {
            ASSERT_EQ(merged[i], xr[i] + ((cpu[i] + out[i]) + bias[i % static_cast<size_t>(cols)]));
            ASSERT_EQ(kept[i], 0.0f + out[i]);
          }
        }
      }
    }
  }
  // The merge's elementwise helpers.
  const auto a = random_floats(1000, rng), b = random_floats(1000, rng);
  DeviceVec<float> da(a), db(b), dc(1000);
  cuda::add(da.p, db.p, dc.p, 1000, stream);
  cuda::stream_sync(stream);
  const auto c = dc.get();
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], a[i] + b[i]);
  cuda::stream_destroy(stream);
#endif
}

// The predictor's steps: fc1 with ReLU in its pass, fc2 with the selection test in its pass (each
// token's verdict for every position, the share's positions counted over the batch), the share's
// predicted positions compacted over several blocks; against the CPU on the device's own scores.
TEST(CudaOps, PredictorSelectionMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(11);
  void* stream = cuda::stream_create();
  for (DType type : {DType::F16, DType::Q8_0}) {
    for (int64_t n_ff : {1, 33, 1000, 3000}) {
      for (int64_t nt : {1, 3, 6, 21}) {
        for (int64_t k : {int64_t{0}, n_ff / 3, n_ff}) {
          SCOPED_TRACE(fmt::format("{} n_ff {} tokens {} share {}", dtype_name(type), n_ff, nt, k));
          const int64_t rank = 64;
          const float thr = 0.3f;
          const DeviceMatrix fc2(type, n_ff, rank, rng);
          std::vector<float> hid = random_floats(static_cast<size_t>(nt * rank), rng);
          DeviceVec<float> dhid(hid);
          cuda::relu(dhid.p, nt * rank, stream);
          cuda::stream_sync(stream);
          const auto relu = dhid.get();
          for (size_t i = 0; i < hid.size(); ++i) ASSERT_EQ(relu[i], std::max(hid[i], 0.0f));
          const DeviceActs ha(type, relu, nt, rank, stream);
          DeviceVec<float> dscores(static_cast<size_t>(nt * n_ff));
          cuda::matvec(type, fc2.m.data, rank, n_ff, ha.a, nt, dscores.p, stream);
          DeviceVec<uint8_t> dmask(std::vector<uint8_t>(static_cast<size_t>(nt * n_ff), 7));
          DeviceVec<int32_t> dcounts(std::vector<int32_t>(static_cast<size_t>(n_ff), -1));
          cuda::MatvecOut sel;
          sel.kind = cuda::Epilogue::select;
          sel.threshold = thr;
          sel.counts = dcounts.p;
          sel.k = k;
          sel.mask = dmask.p;
          sel.mask_stride = n_ff;
          cuda::matvec(fc2.m, {}, ha.a, nt, sel, stream);
          DeviceVec<int32_t> dcand(std::vector<int32_t>(static_cast<size_t>(n_ff + 2), -1));
          cuda::compact(dcounts.p, k, nullptr, nullptr, dcand.p, nullptr, dcand.p + n_ff, stream);
          cuda::stream_sync(stream);
          const auto scores = dscores.get();
          const auto mask = dmask.get();
          const auto cand = dcand.get(), counts = dcounts.get();
          std::vector<int32_t> want;
          for (int64_t i = 0; i < n_ff; ++i) {
            bool any = false;
            for (int64_t t = 0; t < nt; ++t) {
              const bool on = scores[static_cast<size_t>(t * n_ff + i)] >= thr;
              ASSERT_EQ(mask[static_cast<size_t>(t * n_ff + i)], on ? 1 : 0) << "token " << t << " position " << i;
              any |= on;
            }
            if (i < k) {
              ASSERT_EQ(counts[static_cast<size_t>(i)], any ? 1 : 0) << "position " << i;
              if (any) want.push_back(static_cast<int32_t>(i));
            }
          }
          ASSERT_EQ(cand[static_cast<size_t>(n_ff)], static_cast<int32_t>(want.size()));
          for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(cand[i], want[i]);
        }
      }
    }
  }
  cuda::stream_destroy(stream);
#endif
}

// The attention block's kernels against the CPU's functions: norms (RMS and Layer, with and
// without weight and bias, in place, spread over blocks, rounded to 8 bits in the same pass as
// quantize_q8 rounds them), biases, the residual add, RoPE with the KV store in one launch (both
// layouts, partial rotation, frequency factors and an attention factor, F16 rounding as the
// CPU's, no rotation), and attention (grouped heads, sliding windows, several tokens at a
// device-held position > 0, F16 and F32 caches, head sizes 40 to 256) against the double-
// precision reference, the same bits over the whole context's chunks (a captured graph's
// launch). Outputs are poisoned first.
TEST(CudaOps, AttentionBlockKernelsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  std::mt19937 rng(21);
  void* stream = cuda::stream_create();
  const float nan = std::nanf("");
  // Norms over rows of awkward widths.
  for (int64_t width : {1, 40, 257, 4096, 96}) {
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
        const bool q8 = width % 32 == 0;
        DeviceVec<float> dx(x), dw(w), db(b), dout(std::vector<float>(x.size(), nan));
        DeviceVec<uint8_t> dq(std::vector<uint8_t>(gpu_q8_bytes(width, rows), 0xee));
        cuda::norm_rows(dx.p, hw ? dw.p : nullptr, hb ? db.p : nullptr, dout.p, rows, width, 1e-5f, layer, stream,
                        q8 ? dq.p : nullptr);
        cuda::norm_rows(dx.p, hw ? dw.p : nullptr, hb ? db.p : nullptr, dx.p, rows, width, 1e-5f, layer, stream);
        cuda::stream_sync(stream);
        const auto got = dout.get(), in_place = dx.get();
        for (size_t i = 0; i < ref.size(); ++i) {
          // Float sums of up to 4096 squares in another order: relative 1e-5 of the row's scale.
          ASSERT_NEAR(got[i], ref[i], 2e-5f * (1 + std::fabs(ref[i]))) << i;
          ASSERT_EQ(in_place[i], got[i]) << i;
        }
        if (q8) {  // the norm's 8-bit output is the CPU's rounding of its float output
          std::vector<BlockQ8_1> want(static_cast<size_t>(rows * width / 32)), have(want.size());
          quantize_row(DType::Q8_1, got.data(), want.data(), rows * width);
          cuda::q8_to_blocks(dq.get().data(), rows, width, have.data());
          ASSERT_EQ(std::memcmp(want.data(), have.data(), want.size() * sizeof(BlockQ8_1)), 0);
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
  // RoPE and the KV store in one launch.
  for (auto layout : {cpu::RopeLayout::normal, cpu::RopeLayout::neox}) {
    for (auto [head_dim, n_rot] : {std::pair<int64_t, int>{64, 64}, {80, 32}, {128, 128}, {256, 256}, {64, 0}}) {
      for (bool f16 : {true, false}) {
        SCOPED_TRACE(fmt::format("rope head {} rotating {}, {} cache", head_dim, n_rot, f16 ? "F16" : "F32"));
        cpu::RopeConfig rc;
        rc.n_rot = n_rot > 0 ? n_rot : static_cast<int>(head_dim);
        rc.base = 10000.0;
        rc.layout = layout;
        if (head_dim == 80) {
          rc.linear_scale = 2.0;
          rc.attn_factor = 1.19;
          for (int i = 0; i < n_rot / 2; ++i) rc.freq_factors.push_back(1.0f + 0.1f * static_cast<float>(i));
        }
        const cpu::RopeTable table(rc);
        const int64_t n_tokens = 3, n_head = 5, n_head_kv = 2, pos0 = 1000, n_ctx = 1010;
        const int64_t kvd = n_head_kv * head_dim;
        const std::vector<float> q = random_floats(static_cast<size_t>(n_tokens * n_head * head_dim), rng);
        const std::vector<float> k = random_floats(static_cast<size_t>(n_tokens * kvd), rng);
        const std::vector<float> v = random_floats(k.size(), rng);
        std::vector<float> qr = q, kr = k;
        if (n_rot > 0) {
          std::vector<float> cs(static_cast<size_t>(n_rot));
          for (int64_t t = 0; t < n_tokens; ++t) {
            table.angles(pos0 + t, cs.data());
            table.apply(qr.data() + t * n_head * head_dim, n_head, head_dim, cs.data());
            table.apply(kr.data() + t * kvd, n_head_kv, head_dim, cs.data());
          }
        }
        const size_t vb = f16 ? 2 : 4;
        DeviceVec<float> dq(q), dk(k), dv(v);
        DeviceVec<double> dinv(table.inv_freq());
        DeviceVec<int32_t> dpos(std::vector<int32_t>{static_cast<int32_t>(pos0)});
        DeviceVec<uint8_t> dkc(std::vector<uint8_t>(static_cast<size_t>(n_ctx * kvd) * vb, 0xff)), dvc(dkc.get());
        cuda::RopeArgs ra;
        if (n_rot > 0) ra.inv_freq = dinv.p, ra.n_rot = n_rot, ra.attn_factor = rc.attn_factor;
        ra.neox = layout == cpu::RopeLayout::neox;
        cuda::rope_store(dq.p, dk.p, dv.p, n_tokens, n_head, n_head_kv, head_dim, dpos.p, ra, dkc.p, dvc.p, f16, stream);
        cuda::stream_sync(stream);
        const auto gq = dq.get(), gk = dk.get();
        // The same angles in double; cos and sin may differ by an ulp from the host's libm.
        for (size_t i = 0; i < qr.size(); ++i) ASSERT_NEAR(gq[i], qr[i], 1e-6f * (1 + std::fabs(qr[i]))) << i;
        for (size_t i = 0; i < kr.size(); ++i) ASSERT_NEAR(gk[i], kr[i], 1e-6f * (1 + std::fabs(kr[i]))) << i;
        // The cache holds the device's rotated k and v at the positions, as the CPU stores them.
        std::vector<uint8_t> kc(dkc.n, 0xff), vc(dvc.n, 0xff);
        if (f16) {
          cpu::to_f16(gk.data(), reinterpret_cast<uint16_t*>(kc.data()) + pos0 * kvd, n_tokens * kvd);
          cpu::to_f16(v.data(), reinterpret_cast<uint16_t*>(vc.data()) + pos0 * kvd, n_tokens * kvd);
        } else {
          std::memcpy(kc.data() + pos0 * kvd * 4, gk.data(), gk.size() * 4);
          std::memcpy(vc.data() + pos0 * kvd * 4, v.data(), v.size() * 4);
        }
        ASSERT_EQ(dkc.get(), kc);
        ASSERT_EQ(dvc.get(), vc);
      }
    }
  }
  // Attention over a filled cache: one chunk of positions, and several (kAttnChunk = 256) merged,
  // with sliding windows that leave early chunks empty; then over the whole context's chunks.
  // Prompts of kAttnTilesMin (16) tokens or more take the tiles (16 tokens, 16 keys a step): from
  // position 0 and after earlier tokens, windows shorter than a tile, a last tile cut short.
  for (bool f16 : {true, false}) {
    for (auto [n_head, n_head_kv, head_dim] :
         {std::tuple<int64_t, int64_t, int64_t>{4, 2, 40}, {8, 8, 64}, {6, 2, 128}, {2, 1, 256}}) {
      for (auto [n_ctx, pos0, n_tokens, window] :
           {std::tuple<int64_t, int64_t, int64_t, int64_t>{40, 17, 4, 0}, {40, 17, 4, 5}, {700, 500, 3, 0},
            {700, 500, 3, 300}, {1100, 1024, 2, 5}, {1100, 30, 2, 0}, {200, 0, 70, 0}, {300, 100, 40, 23},
            {1100, 1000, 33, 0}, {90, 10, 16, 5}}) {
        SCOPED_TRACE(fmt::format("{} cache, {}/{} heads of {}, tokens {}..{}, window {}", f16 ? "F16" : "F32", n_head,
                                 n_head_kv, head_dim, pos0, pos0 + n_tokens - 1, window));
        const int64_t kvd = n_head_kv * head_dim, qd = n_head * head_dim;
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
        DeviceVec<uint8_t> dk(kc), dv(vc);
        DeviceVec<float> dq(q);
        DeviceVec<int32_t> dpos(std::vector<int32_t>{static_cast<int32_t>(pos0)});
        cuda::AttentionArgs a;
        a.n_head = n_head, a.n_head_kv = n_head_kv, a.head_dim = head_dim, a.n_ctx = n_ctx;
        a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        a.window = window;
        a.f16 = f16;
        std::vector<float> outs[2];
        for (int whole = 0; whole < 2; ++whole) {
          DeviceVec<float> dout(std::vector<float>(q.size(), nan));
          DeviceVec<float> dscores(std::vector<float>(static_cast<size_t>(n_tokens * n_head * n_ctx), nan));
          DeviceVec<float> dpartial(std::vector<float>(
              static_cast<size_t>(cuda::attention_partial_floats(n_tokens, n_head, head_dim, n_ctx)), nan));
          cuda::attention(a, dq.p, n_tokens, dpos.p, whole ? n_ctx : pos0 + n_tokens, dk.p, dv.p, dout.p, dscores.p,
                          dpartial.p, stream);
          cuda::stream_sync(stream);
          outs[whole] = dout.get();
        }
        cpu::AttentionShape sh;
        sh.n_head = n_head, sh.n_head_kv = n_head_kv, sh.head_dim = head_dim, sh.scale = a.scale, sh.window = window;
        std::vector<float> ref(q.size());
        cpu::attention_reference(sh, q.data(), n_tokens, pos0, kr.data(), vr.data(), kvd, ref.data());
        for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(outs[0][i], ref[i], 2e-5f * (1 + std::fabs(ref[i]))) << i;
        ASSERT_EQ(outs[1], outs[0]) << "the whole context's chunks changed the result";
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
  uint64_t cpu_planned = 0, gpu_planned = 0;  // each session's plan, counted with its device's scratch
};
// Each device holds the bytes its session's plan counts (with the scratch its kernels keep: the
// stand-in the common buffers, CUDA those and its own; a plan from a budget may then place a few
// more neurons on the stand-in).
static void expect_planned_bytes(const OnBothDevices& r) {
  EXPECT_EQ(r.cpu_bytes, r.cpu_planned);
  EXPECT_EQ(r.gpu_bytes, r.gpu_planned);
}
static OnBothDevices on_both_devices(const Model& model, SessionParams p, int64_t prompt = 12) {
  OnBothDevices r;
  p.hybrid.device_kind = "cpu";
  Session s_cpu(model, p);
  r.cpu = test_support::session_logits(s_cpu, prompt);
  r.cpu_crossings = s_cpu.hybrid()->device().stats().crossings;
  r.cpu_bytes = s_cpu.hybrid()->device().stats().bytes;
  r.cpu_planned = s_cpu.hybrid()->plan().gpu_bytes;
  p.hybrid.device_kind = "cuda";
  Session s_gpu(model, p);
  r.gpu = test_support::session_logits(s_gpu, prompt);
  r.gpu_stats = s_gpu.hybrid()->stats();
  r.gpu_crossings = s_gpu.hybrid()->device().stats().crossings;
  r.gpu_bytes = s_gpu.hybrid()->device().stats().bytes;
  r.gpu_planned = s_gpu.hybrid()->plan().gpu_bytes;
  return r;
}

// Three sequences at once (test_support::session_logits_seqs), attention on every layer and half
// the neurons on the device, its chunks of 5 rows cutting through the sequences: CUDA's caches
// per sequence give each sequence's logits as a CUDA session of that sequence alone does (to
// float sums: 5e-5, because a token's down sums are split into axpy_chunks(n) chunks of the active
// rows, n the rows of its step, so alone and in a step of three its terms are added in other
// orders; the gemma3 synth measured 1.5e-5 on an H200), twice the same, each device the bytes its plan counts,
// and the stand-in's logits to 1e-2. (Not 1e-4:
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
      (std::string(kind) == "cpu" ? cpu_bytes : gpu_bytes) = s.hybrid()->device().stats().bytes;
      EXPECT_EQ(s.hybrid()->device().stats().bytes, s.hybrid()->plan().gpu_bytes) << kind;
    }
    EXPECT_EQ(again, gpu) << "two CUDA runs differ";
    EXPECT_LE(cpu_bytes, gpu_bytes);
    p.hybrid.device_kind = "cuda";
    const test_support::Logits alone = test_support::session_logits_seqs_alone(*model, p);
    EXPECT_LT(test_support::max_rel_diff(alone, gpu), 5e-5);
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
  o.n_embd = 256, o.n_ff = type == DType::Q4_K || type == DType::Q6_K ? 768 : 704, o.n_layer = 3, o.n_head = 4, o.n_head_kv = 2, o.seed = 6, o.n_threads = 2;
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
  p.hybrid.vram_budget = type == DType::F32 ? 3 << 20 : 3 << 18;
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
  expect_planned_bytes(r);
  // Both devices round activations to the same 8 bits for quantized rows and multiply them in
  // integers: only the order of float sums differs. (Before the GPU rounded them so, a Q4_0 model
  // differed by 3e-2.) The all-CPU oracle holds a quantized down as its own copy (Q4_0: the
  // shared-scale one), the hybrid's devices as Q8_0 rows (rounded a second time): 3e-2 apart
  // (Q5_0 measured 1.0e-2). K-quant rows: the CPU rounds their activations in blocks of 256
  // (Q8_K), the device in blocks of 32 (as for every 8-bit type there), so the two sides of the
  // split differ by that rounding, 3.1e-2 for Q4_K here (the kernels themselves are checked to
  // their float rounding by MatvecAndGatherMatchReference).
  const double apart = type == DType::Q4_K || type == DType::Q6_K ? 6e-2 : 1e-4;
  EXPECT_LT(test_support::max_rel_diff(r.cpu, r.gpu), apart);
  EXPECT_LT(test_support::max_rel_diff(all_cpu, r.gpu), type == DType::F32 ? 1e-4 : std::max(3e-2, apart));
  std::filesystem::remove(path);
}
#endif

TEST(CudaOps, HybridCudaEqualsCpuStandIn) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  for (DType type : {DType::F32, DType::Q4_0, DType::Q5_0, DType::Q4_K, DType::Q6_K})
    expect_cuda_hybrid_equals_standin(type, false);
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
        const SessionParams p = test_support::given_plan_params(plan, max_batch);
        const OnBothDevices r = on_both_devices(*model, p);
        const OnBothDevices again = on_both_devices(*model, p);
        EXPECT_EQ(again.gpu, r.gpu) << "two CUDA runs differ";
        EXPECT_EQ(r.cpu_crossings.hidden_in, r.gpu_crossings.hidden_in);
        EXPECT_EQ(r.cpu_crossings.hidden_out, r.gpu_crossings.hidden_out);
        expect_planned_bytes(r);
        // Activations of quantized rows rounded to the same 8 bits on both: float sums apart.
        EXPECT_LT(test_support::max_rel_diff(r.cpu, r.gpu), 1e-4);
      }
    }
    std::filesystem::remove(path);
  }
#endif
}

// A mixture's experts on CUDA (the file's layout; gate with the activation in its epilogue, up
// times it, down; each expert over the tokens that chose it) against the CPU stand-in running the
// CPU's own kernels on the same plan, which equals the all-CPU mixture bit for bit
// (tests/test_hybrid_moe.cpp): prompts in one device batch and in chunks, attention on the CPU
// and on the device. Both round the activations of quantized rows to the same 8 bits; the
// activation's exp and the float sums differ. Two CUDA runs are bit-identical, the bytes are the
// plan's on both.
TEST(CudaOps, MixtureExpertsOnCudaEqualTheStandIn) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  for (DType type : {DType::F32, DType::Q4_0, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(type));
    SynthOptions o;
    o.type = type;
    o.act = FfnActivation::silu;
    o.n_embd = 128, o.n_ff = 96, o.n_layer = 3, o.n_head = 4, o.n_head_kv = 2;
    o.n_expert = 8, o.n_expert_used = 2, o.seed = 17, o.n_threads = 2;
    auto model = test_support::load_synth_in(test_support::test_temp_dir("cuda"), o,
                                             fmt::format("moe-{}.gguf", dtype_name(type)));
    // Batches of 64 with a 48-token prompt: experts with kGemmMinTokens slots or more (each on
    // the tiles); 16 and 5: every expert of a step in one launch.
    for (int64_t max_batch : {16, 5, 64})
      for (bool attn : {false, true}) {
        SCOPED_TRACE(fmt::format("batches of {}, attention {}", max_batch, attn ? "on the device" : "on the CPU"));
        Plan plan;  // layer 0: experts 1, 2 and 5; layer 1: none; layer 2: all
        plan.method = PlanMethod::greedy;
        plan.vram_budget = uint64_t{1} << 40;
        plan.layers.resize(3);
        plan.layers[0].gpu_experts = {1, 2, 5};
        for (int32_t e = 0; e < 8; ++e) plan.layers[2].gpu_experts.push_back(e);
        for (size_t l = 0; l < 3; ++l) plan.layers[l].attn_gpu = attn && l != 1;
        const SessionParams p = test_support::given_plan_params(plan, max_batch);
        const int64_t prompt = max_batch == 64 ? 48 : 12;
        const OnBothDevices r = on_both_devices(*model, p, prompt);
        const OnBothDevices again = on_both_devices(*model, p, prompt);
        EXPECT_EQ(again.gpu, r.gpu) << "two CUDA runs differ";
        expect_planned_bytes(r);
        EXPECT_GT(r.gpu_stats.device_expert_runs, 0u);
        EXPECT_GT(r.gpu_stats.cpu_expert_runs, 0u);
        // Attention on the device over the 48-token prompt: its sums in another order can round
        // an 8-bit activation the other way (as in SeveralSequencesOnCudaEqualTheStandIn): 1.1e-3.
        EXPECT_LT(test_support::max_rel_diff(r.cpu, r.gpu), attn && prompt > 12 ? 1e-2 : 1e-3);
      }
    std::filesystem::remove(model->file->path());
  }
#endif
}

// An all-GPU decode token (attention, every neuron and the output head on the device, with
// predictors or the oracle rule) waits on the host once; with graphs (the default where the
// runtime has them) it replays one graph and launches nothing one by one, and gives the same bits
// as the launches one by one (EMBER_CUDA_GRAPHS=0), token after token at growing positions.
TEST(CudaOps, AllGpuDecodeWaitsOnceAndGraphsChangeNoBit) {
  SKIP_WITHOUT_GPU();
#ifdef EMBER_HAS_CUDA
  for (bool predictors : {false, true}) {
    SCOPED_TRACE(predictors ? "predictors" : "oracle");
    SynthOptions o;
    o.type = DType::Q4_0;
    o.act = FfnActivation::relu;
    o.sparsity = 0.8f;
    o.powerinfer = predictors;
    o.n_embd = 256, o.n_ff = 704, o.n_layer = 3, o.n_head = 4, o.n_head_kv = 2, o.seed = 6, o.n_threads = 2;
    const std::string path =
        test_support::own_test_file(test_support::test_temp_dir("cuda"), predictors ? "graphs-pred" : "graphs");
    synth_write(o, path);
    auto model = load_model(path);
    Plan plan;
    plan.method = PlanMethod::greedy;
    plan.vram_budget = uint64_t{1} << 40;
    plan.layers.resize(3);
    for (size_t l = 0; l < 3; ++l) {
      for (int32_t j = 0; j < model->hp.n_ff; ++j) plan.layers[l].gpu_neurons.push_back(j);
      plan.layers[l].attn_gpu = true;
    }
    plan.output_gpu = true;
    SessionParams p;
    p.n_threads = 2;
    p.n_ctx = 64;
    if (predictors) p.sparse.mode = FfnMode::predictor, p.sparse.mirrored_predictors = false;
    p.hybrid.given = &plan;
    p.hybrid.plan.min_gpu_neurons = 0;
    p.hybrid.device_kind = "cuda";
    test_support::Logits by_mode[2];
    for (int graphs = 0; graphs < 2; ++graphs) {
      if (graphs && !cuda::graphs_supported()) continue;  // the HIP CPU runtime has none
      setenv("EMBER_CUDA_GRAPHS", graphs ? "1" : "0", 1);
      Session s(*model, p);
      by_mode[graphs] = test_support::session_logits(s);  // a prompt, then decode tokens
      const int32_t next = 7;
      s.eval(&next, 1);  // (captures the step's graph where it was not yet)
      s.hybrid()->reset_stats();
      s.eval(&next, 1);
      const DeviceCounters c = s.hybrid()->device().stats().counters;
      EXPECT_EQ(c.host_waits, 1u) << "graphs " << graphs;
      EXPECT_EQ(c.graphs, static_cast<uint64_t>(graphs));
      if (graphs) {
        EXPECT_EQ(c.launches, 0u);
        EXPECT_GT(c.graph_nodes, 0u);
      } else {
        EXPECT_GT(c.launches, 0u);
      }
    }
    unsetenv("EMBER_CUDA_GRAPHS");
    if (cuda::graphs_supported()) {
      EXPECT_EQ(by_mode[1], by_mode[0]) << "a graph's replay changed the logits";
    }
    std::filesystem::remove(path);
  }
#endif
}
