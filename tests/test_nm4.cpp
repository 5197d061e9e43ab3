// Neuron-major 4-bit down projections with shared scales (ops/cpu/nm4/nm4.hpp): the copy holds the
// file's values bit for bit (the narrow-table copy its codes, and each table value within half a
// step of 255 of its group's range); the axpy kernels (fp16 and narrow tables) of every SIMD level give the scalar kernel's bits
// for any list (unsorted, long runs in one block, zero factors), any column slice and thread
// split; the scalar kernel equals a double-precision sum with the factors rounded as the header
// says, and stays within the rounding's bound of the sum with unrounded factors.
#include "ops/cpu/nm4/nm4.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "ops/cpu/sparse/sparse.hpp"
#include "support/simd_levels.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

using namespace ember;

namespace {

using test_support::SimdGuard;

struct Down {
  std::vector<uint8_t> bytes;
  TensorView view;  // input-major: ne[0] = n_ff, ne[1] = n_embd
};

// Rows of different magnitude, so that the scales of one neuron block differ by output.
Down random_down(DType t, int64_t n_embd, int64_t n_ff, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  Down d;
  const size_t stride = row_bytes(t, n_ff);
  d.bytes.resize(stride * static_cast<size_t>(n_embd));
  std::vector<float> row(static_cast<size_t>(n_ff));
  for (int64_t r = 0; r < n_embd; ++r) {
    const float scale = 0.1f + static_cast<float>(r % 7);
    for (auto& x : row) x = dist(rng) * scale + (t == DType::Q4_1 ? 0.3f * scale : 0.f);
    quantize_row(t, row.data(), d.bytes.data() + static_cast<size_t>(r) * stride, n_ff);
  }
  d.view = matrix_view(t, d.bytes.data(), n_embd, n_ff);
  d.view.name = "down";
  return d;
}

// Lists: unsorted subsets, sorted ones (long runs in one block), a whole block and more.
std::vector<std::vector<int32_t>> lists(int64_t n_ff, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> all(static_cast<size_t>(n_ff));
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<int32_t>> v = {{}, {static_cast<int32_t>(n_ff - 1)}, all};
  for (double frac : {0.05, 0.3, 0.7}) {
    auto s = all;
    std::shuffle(s.begin(), s.end(), rng);
    s.resize(std::max<size_t>(1, static_cast<size_t>(frac * static_cast<double>(n_ff))));
    v.push_back(s);
    std::sort(s.begin(), s.end());
    v.push_back(s);
  }
  return v;
}

std::vector<float> factors(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> h(n);
  for (auto& x : h) x = u(rng) < 0.2f ? 0.f : dist(rng);  // zeros are skipped and split nothing
  return h;
}

// The copies the kernels take (fp16 and narrow tables), and the file type each is made from here.
const DType kCopyTypes[] = {DType::Q4_0_NM, DType::Q4_1_NM, DType::Q4_0_NM8, DType::Q4_1_NM8};
DType file_type(DType nt) { return cpu::nm4_has_min(nt) ? DType::Q4_1 : DType::Q4_0; }

}  // namespace

// The copy types the tests run are those of the kernel table (ops/cpu/nm4/nm4.hpp), every one with a
// scalar kernel: a kernel added to it is tested at every level without a new test.
TEST(Nm4, TableTypesAreTheTestedCopyTypes) {
  const auto& t = cpu::detail::nm4_axpy_table();
  EXPECT_EQ(t.types(), std::vector<DType>(std::begin(kCopyTypes), std::end(kCopyTypes)));
  for (DType w : t.types()) EXPECT_TRUE(t.has_own(w, SimdLevel::scalar)) << dtype_name(w);
}

namespace {

// n_embd, n_ff: every chunk width (128, 64, 32) and row ends of each.
const int64_t kShapes[][2] = {{32, 32}, {96, 160}, {224, 96}, {2048, 64}, {576, 64}};

}  // namespace

TEST(Nm4, CopyHoldsTheFilesValuesBitForBit) {
  ThreadPool pool(2);
  for (DType t : {DType::Q4_0, DType::Q4_1}) {
    for (const auto& s : kShapes) {
      const int64_t n_embd = s[0], n_ff = s[1];
      Down down = random_down(t, n_embd, n_ff, 3);
      const DType nt = cpu::neuron_major_dtype(t, cpu::NeuronMajorType::exact, n_embd, true);
      ASSERT_EQ(nt, t == DType::Q4_0 ? DType::Q4_0_NM : DType::Q4_1_NM);
      // Without shared scales (the hybrid devices' copies) exact stays Q8_0.
      EXPECT_EQ(cpu::neuron_major_dtype(t, cpu::NeuronMajorType::exact, n_embd), DType::Q8_0);
      auto nm = cpu::make_neuron_major(pool, down.view, nt);
      ASSERT_EQ(nm.view.nbytes, down.bytes.size()) << "the file's bytes, no more";
      std::vector<float> dense(static_cast<size_t>(n_embd * n_ff)), row(static_cast<size_t>(n_embd));
      for (int64_t r = 0; r < n_embd; ++r) dequantize_row(t, down.view.row(r), dense.data() + r * n_ff, n_ff);
      for (int64_t i = 0; i < n_ff; ++i) {
        cpu::dequantize_neuron(nm.view, i, row.data());
        for (int64_t r = 0; r < n_embd; ++r)
          ASSERT_EQ(row[r], dense[r * n_ff + i]) << dtype_name(t) << " neuron " << i << " output " << r;
      }
    }
  }
}

// A Q4_K matrix becomes Q4_1_NM: the codes kept, each sub-block's d sc and -dmin m rounded to
// fp16, so every value is within fp16's relative rounding (2^-11) of those two of the file's.
TEST(Nm4, Q4KCopyKeepsTheCodesAndRoundsOnlyTheScales) {
  ThreadPool pool(2);
  for (const auto& s : {std::pair<int64_t, int64_t>{96, 256}, {224, 512}, {576, 256}}) {
    const int64_t n_embd = s.first, n_ff = s.second;
    Down down = random_down(DType::Q4_K, n_embd, n_ff, 19);
    const DType nt = cpu::neuron_major_dtype(DType::Q4_K, cpu::NeuronMajorType::exact, n_embd, true);
    ASSERT_EQ(nt, DType::Q4_1_NM);
    auto nm = cpu::make_neuron_major(pool, down.view, nt);
    EXPECT_LT(nm.view.nbytes, static_cast<size_t>(n_ff * n_embd) * 5 / 8 + 1) << "5 bits per value";
    std::vector<float> dense(static_cast<size_t>(n_embd * n_ff)), row(static_cast<size_t>(n_embd));
    for (int64_t r = 0; r < n_embd; ++r) dequantize_row(DType::Q4_K, down.view.row(r), dense.data() + r * n_ff, n_ff);
    int64_t inexact = 0;
    for (int64_t i = 0; i < n_ff; ++i) {
      cpu::dequantize_neuron(nm.view, i, row.data());
      for (int64_t r = 0; r < n_embd; ++r) {
        const auto* blk = reinterpret_cast<const BlockQ4_K*>(down.view.row(r)) + i / 256;
        uint8_t sc, mn;
        kquant_scale_min(blk->scales, static_cast<int>(i % 256 / 32), sc, mn);
        const double d1 = static_cast<double>(fp16_to_fp32(blk->d)) * sc, m1 = static_cast<double>(fp16_to_fp32(blk->dmin)) * mn;
        const double bound = (15 * std::fabs(d1) + std::fabs(m1)) * std::ldexp(1.0, -11) + 1e-30;
        ASSERT_LE(std::fabs(row[r] - dense[r * n_ff + i]), bound) << "neuron " << i << " output " << r;
        inexact += row[r] != dense[r * n_ff + i];
      }
    }
    EXPECT_GT(inexact, 0) << "fp16 rounding of the scales never showed: the bound tests nothing";
  }
}

// The narrow tables (Q4_0_NM8 / Q4_1_NM8): the rows are the fp16 copy's bytes; every table
// value (d, and Q4_1's m) is within half a step (1/510 of its group's range) of the fp16 table's,
// plus the fp16 rounding of the group's base and scale (for Q4_K: of the unrounded d sc and
// -dmin m, which the fp16 table rounds by 2^-11 more); the tables take 9 bytes per 8 entries.
TEST(Nm4, NarrowCopyKeepsTheCodesAndRoundsTheTablesToAStepOf255) {
  ThreadPool pool(2);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q4_K}) {
    for (const auto& s : {std::pair<int64_t, int64_t>{96, 256}, {224, 512}, {576, 256}, {32, 256}}) {
      const int64_t n_embd = s.first, n_ff = s.second;
      Down down = random_down(t, n_embd, n_ff, 41);
      const DType nt = cpu::neuron_major_dtype(t, cpu::NeuronMajorType::compact, n_embd, true);
      ASSERT_EQ(nt, t == DType::Q4_0 ? DType::Q4_0_NM8 : DType::Q4_1_NM8);
      EXPECT_EQ(cpu::neuron_major_dtype(t, cpu::NeuronMajorType::compact, n_embd), DType::Q8_0) << "no shared tables";
      auto wide = cpu::make_neuron_major(pool, down.view, cpu::nm4_type_of(t));
      auto narrow = cpu::make_neuron_major(pool, down.view, nt);
      const size_t codes = static_cast<size_t>(n_ff * n_embd / 2);
      ASSERT_EQ(narrow.view.nbytes, codes + cpu::nm4_table_bytes(nt, n_ff, n_embd));
      EXPECT_EQ(cpu::nm4_table_bytes(nt, n_ff, n_embd) * 16, cpu::nm4_table_bytes(wide.view.type, n_ff, n_embd) * 9);
      ASSERT_EQ(std::memcmp(narrow.view.data, wide.view.data, codes), 0) << "the same codes";
      int64_t inexact = 0;
      for (int64_t b = 0; b < n_ff / cpu::kNm4Block; ++b)
        for (int min = 0; min < cpu::nm4_tables_per_block(nt); ++min)
          for (int64_t g = 0; g < n_embd; g += cpu::kNm8Group) {
            const int64_t i = b * cpu::kNm4Block;
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t j = g; j < g + cpu::kNm8Group; ++j) {
              const double w = cpu::nm4_table_value(wide.view, i, j, min);
              lo = std::min(lo, w), hi = std::max(hi, w);
            }
            const double mag = std::max(std::fabs(lo), std::fabs(hi));
            for (int64_t j = g; j < g + cpu::kNm8Group; ++j) {
              const double w = cpu::nm4_table_value(wide.view, i, j, min), n = cpu::nm4_table_value(narrow.view, i, j, min);
              // half a step of the range (the step as an fp16: 2^-11 more), the base's fp16
              // rounding (2^-11 of its magnitude, the range widened by it), and the fp16 table's
              // own rounding where it rounds (Q4_K)
              const double bound = (hi - lo + mag * std::ldexp(1.0, -11)) / 510.0 * (1 + std::ldexp(1.0, -10)) +
                                   mag * std::ldexp(1.0, -11) + (t == DType::Q4_K ? 2 * mag * std::ldexp(1.0, -11) : 0.0);
              ASSERT_LE(std::fabs(n - w), bound) << dtype_name(t) << " block " << b << " output " << j << " min " << min;
              inexact += n != w;
            }
          }
      EXPECT_GT(inexact, 0) << "the rounding never showed: the bound tests nothing";
    }
  }
}

// nm4_narrow_table at its edges: a constant group, a group of one sign, an outlier, both signs.
TEST(Nm4, NarrowTableEdges) {
  std::vector<float> v(4 * cpu::kNm8Group, 0.25f);
  for (int k = 0; k < 32; ++k) v[32 + k] = -0.01f * static_cast<float>(k + 1);  // negative, -0.32 .. -0.01
  for (int k = 0; k < 32; ++k) v[64 + k] = 1e-3f;
  v[64 + 5] = 1000.f;                                                           // an outlier
  for (int k = 0; k < 32; ++k) v[96 + k] = static_cast<float>(k - 16) * 0.25f;  // -4 .. 3.75
  std::vector<uint8_t> codes(v.size());
  std::vector<uint16_t> sb(2 * 4);
  cpu::nm4_narrow_table(v.data(), static_cast<int64_t>(v.size()), codes.data(), sb.data());
  const auto value = [&](int k) { return codes[k] * fp16_to_fp32(sb[2 * (k / 32)]) + fp16_to_fp32(sb[2 * (k / 32) + 1]); };
  EXPECT_EQ(sb[0], 0) << "a constant group has no range";
  for (int k = 0; k < 32; ++k) EXPECT_EQ(value(k), 0.25f) << "and is its base";
  EXPECT_EQ(codes[32 + 31], 0) << "the least value is the base";
  EXPECT_EQ(codes[32], 255) << "the greatest the last step";
  for (int k = 32; k < 64; ++k) EXPECT_NEAR(value(k), v[k], 0.31 / 510 * 1.002 + 0.32 * std::ldexp(1.0, -11));
  EXPECT_EQ(codes[64 + 5], 255);
  EXPECT_EQ(codes[64], 0);
  EXPECT_NEAR(value(64), 1e-3f, 1000.0 / 510 * 1.002) << "within half a step of the outlier's range, as the format says";
  for (int k = 96; k < 128; ++k) EXPECT_NEAR(value(k), v[k], 7.75 / 510 * 1.002 + 4 * std::ldexp(1.0, -11));
  EXPECT_EQ(codes[96], 0);
  EXPECT_EQ(codes[127], 255);
}

TEST(Nm4, AxpyKernelsAgreeBitForBitAndWithDoubles) {
  SimdGuard guard;
  ThreadPool pool(1);
  for (DType nt : kCopyTypes) {
    const DType t = file_type(nt);
    for (const auto& s : kShapes) {
      const int64_t n_embd = s[0], n_ff = s[1];
      Down down = random_down(t, n_embd, n_ff, 5);
      auto nm = cpu::make_neuron_major(pool, down.view, nt);
      // The copy's values (the file's with fp16 tables: the first test), output-major.
      std::vector<float> dense(static_cast<size_t>(n_embd * n_ff)), row(static_cast<size_t>(n_embd));
      for (int64_t i = 0; i < n_ff; ++i) {
        cpu::dequantize_neuron(nm.view, i, row.data());
        for (int64_t r = 0; r < n_embd; ++r) dense[r * n_ff + i] = row[r];
      }
      uint32_t seed = 7;
      for (const auto& list : lists(n_ff, 11)) {
        const auto h = factors(list.size(), ++seed);
        const auto out0 = factors(static_cast<size_t>(n_embd), ++seed);
        const int64_t n = static_cast<int64_t>(list.size());
        // The scalar kernel over the whole width.
        std::vector<float> ref = out0;
        std::vector<cpu::detail::Nm4Seg> segs;
        cpu::detail::nm4_prepare_segments(list.data(), h.data(), n, segs);
        cpu::detail::nm4_axpy_scalar(nm.view, segs.data(), static_cast<int64_t>(segs.size()), 0, n_embd, ref.data());
        // The factors as the kernels round them: int8 per segment of the list.
        std::vector<double> hq(static_cast<size_t>(n), 0.0);
        double hmax = 0;
        for (float x : h) hmax = std::max(hmax, std::fabs(static_cast<double>(x)));
        cpu::detail::nm4_segments(list.data(), h.data(), n, [&](const int32_t*, const float* hs, int c, int64_t, int64_t after) {
          const auto q = cpu::detail::nm4_quantize_factors(hs, c);
          // The segment's entries are the last c nonzero factors before `after`.
          int r = c;
          for (int64_t i = after - 1; r > 0; --i)
            if (h[i] != 0.0f) hq[i] = static_cast<double>(q.q[--r]) * q.scale;
        });
        // Against doubles: with the rounded factors to float accuracy; with the unrounded ones
        // within half a step of the largest factor (127 steps) times the sum of the rounded
        // parts of the weights (d (q - 8), or d q for Q4_1).
        // The magnitudes the kernels' float roundings are relative to: a table value's, or for a
        // narrow table its two terms' (code x scale and base, which may cancel).
        const auto span = [&](int64_t i, int64_t j, bool min) -> double {
          if (!cpu::nm4_narrow(nt)) return std::fabs(cpu::nm4_table_value(nm.view, i, j, min));
          const cpu::detail::Nm4Tables tb = cpu::detail::nm4_tables(nm.view, i / cpu::kNm4Block);
          const uint16_t* sb = (min ? tb.msb : tb.dsb) + 2 * (j / cpu::kNm8Group);
          return (min ? tb.mc : tb.dc)[j] * fp16_to_fp32(sb[0]) + std::fabs(fp16_to_fp32(sb[1]));
        };
        double worst = 0, scale = 1e-30, worst_excess = 0;
        for (int64_t j = 0; j < n_embd; ++j) {
          double e = out0[j], eq = out0[j], mag = std::fabs(out0[j]), wsum = 0;
          for (int64_t i = 0; i < n; ++i) {
            const double w = dense[j * n_ff + list[i]];
            // Q4_1's min term m takes the unrounded factor; only d q is rounded.
            const double m = t == DType::Q4_1 ? cpu::nm4_table_value(nm.view, list[i], j, true) : 0.0;
            const double d = cpu::nm4_table_value(nm.view, list[i], j, false), q = d != 0 ? (w - m) / d : 0.0;
            e += static_cast<double>(h[i]) * w;
            eq += hq[i] * (w - m) + static_cast<double>(h[i]) * m;
            mag += std::fabs(hq[i] * q) * span(list[i], j, false) +
                   (t == DType::Q4_1 ? std::fabs(static_cast<double>(h[i])) * span(list[i], j, true) : 0.0);
            wsum += std::fabs(w - m);
          }
          worst = std::max(worst, std::fabs(ref[j] - eq));
          scale = std::max(scale, mag);
          const double bound = wsum * hmax / 254.0 * 1.0001 + 1e-6 * (mag + wsum * hmax);
          worst_excess = std::max(worst_excess, std::fabs(ref[j] - e) - bound);
        }
        EXPECT_LT(worst / scale, 1e-6) << dtype_name(nm.view.type) << " n_embd " << n_embd << " list " << n;
        EXPECT_LE(worst_excess, 0.0) << dtype_name(nm.view.type) << " n_embd " << n_embd << " list " << n;
        // Every SIMD level, whole width and a slice, gives the same bits.
        for (SimdLevel level : test_support::simd_levels()) {
          set_simd_level(level);
          std::vector<float> got = out0;
          cpu::nm4_axpy(nm.view, list.data(), h.data(), n, 0, n_embd, got.data());
          ASSERT_EQ(got, ref) << dtype_name(nm.view.type) << " " << simd_level_name(level) << " n_embd " << n_embd << " list " << n;
          if (n_embd > cpu::kNm4Chunk) {  // from the second chunk to the row's end
            const int64_t c0 = cpu::kNm4Chunk, len = n_embd - c0;
            std::vector<float> part(out0.begin() + c0, out0.begin() + c0 + len);
            cpu::nm4_axpy(nm.view, list.data(), h.data(), n, c0, len, part.data());
            for (int64_t j = 0; j < len; ++j)
              ASSERT_EQ(part[j], ref[c0 + j]) << simd_level_name(level) << " slice output " << c0 + j;
          }
          if (n_embd >= 4 * cpu::kNm4Chunk) {  // a middle slice, as a thread of the column split takes
            const int64_t c0 = cpu::kNm4Chunk, len = 2 * cpu::kNm4Chunk;
            std::vector<float> part(out0.begin() + c0, out0.begin() + c0 + len);
            cpu::nm4_axpy(nm.view, list.data(), h.data(), n, c0, len, part.data());
            for (int64_t j = 0; j < len; ++j)
              ASSERT_EQ(part[j], ref[c0 + j]) << simd_level_name(level) << " middle slice output " << c0 + j;
          }
        }
      }
    }
  }
}

// The largest sums a segment can make: 16 rows of code 15 with factors of +-127 (the AVX2
// kernel sums pairs of rows in 16 bits: 16 x 127 x 15 = 30480 must fit) give every level the
// scalar kernel's bits and the exact sum.
TEST(Nm4, AxpyAtTheLargestSegmentSums) {
  SimdGuard guard;
  ThreadPool pool(1);
  const int64_t n_embd = 320, n_ff = 64;  // a 128-wide chunk, then 128, 64
  for (DType nt : kCopyTypes) {
    const DType t = file_type(nt);
    // Q4_1: 1 with a 0 in each block (d = 1/15, min 0: code 15); Q4_0: 7 with a -8 (d = 1: code 15).
    const float top = t == DType::Q4_1 ? 1.0f : 7.0f, low = t == DType::Q4_1 ? 0.0f : -8.0f;
    Down d;
    const size_t stride = row_bytes(t, n_ff);
    d.bytes.resize(stride * static_cast<size_t>(n_embd));
    std::vector<float> row(static_cast<size_t>(n_ff), top);
    for (int64_t i = 31; i < n_ff; i += 32) row[static_cast<size_t>(i)] = low;
    for (int64_t r = 0; r < n_embd; ++r)
      quantize_row(t, row.data(), d.bytes.data() + static_cast<size_t>(r) * stride, n_ff);
    d.view = matrix_view(t, d.bytes.data(), n_embd, n_ff);
    d.view.name = "down";
    auto nm = cpu::make_neuron_major(pool, d.view, nt);
    std::vector<int32_t> list(16);
    std::iota(list.begin(), list.end(), 32);  // one segment: rows 32 .. 47 of the second block
    for (float sign : {1.0f, -1.0f}) {
      const std::vector<float> h(list.size(), sign);
      std::vector<float> ref(static_cast<size_t>(n_embd), 0.0f);
      std::vector<cpu::detail::Nm4Seg> segs;
      cpu::detail::nm4_prepare_segments(list.data(), h.data(), 16, segs);
      ASSERT_EQ(segs.size(), 1u);
      cpu::detail::nm4_axpy_scalar(nm.view, segs.data(), 1, 0, n_embd, ref.data());
      for (float x : ref) ASSERT_NEAR(x, 16.0f * top * sign, 1e-3f * 16.0f * top) << dtype_name(nt);
      for (SimdLevel level : test_support::simd_levels()) {
        set_simd_level(level);
        std::vector<float> got(static_cast<size_t>(n_embd), 0.0f);
        cpu::nm4_axpy(nm.view, list.data(), h.data(), 16, 0, n_embd, got.data());
        ASSERT_EQ(got, ref) << dtype_name(nt) << " " << simd_level_name(level) << " sign " << sign;
      }
    }
  }
}

// Through sparse_axpy: the column split gives the same bits for any thread count, several
// tokens equal one token at a time, and the neurons split stays close.
TEST(Nm4, SparseAxpyThreadsAndTokens) {
  for (DType nt : kCopyTypes) {
    const DType t = file_type(nt);
    const int64_t n_embd = 1024, n_ff = 256, n_tokens = 3;
    Down down = random_down(t, n_embd, n_ff, 9);
    ThreadPool one(1), three(3);
    auto nm = cpu::make_neuron_major(three, down.view, nt);
    auto list = lists(n_ff, 13)[6];  // 30 %, sorted
    const int64_t n = static_cast<int64_t>(list.size());
    std::vector<float> H;
    for (int64_t tk = 0; tk < n_tokens; ++tk) {
      auto h = factors(list.size(), 17 + static_cast<uint32_t>(tk));
      H.insert(H.end(), h.begin(), h.end());
    }
    std::vector<float> a(n_embd * n_tokens, 0.f), b = a, c = a, per_token = a;
    std::vector<float> s1(cpu::sparse_axpy_scratch_floats(n_embd, n_tokens, 1, cpu::AxpySplit::columns));
    std::vector<float> s3(cpu::sparse_axpy_scratch_floats(n_embd, n_tokens, 3, cpu::AxpySplit::neurons));
    cpu::sparse_axpy(one, nm.view, list.data(), n, H.data(), n_tokens, n, a.data(), n_embd, s1.data());
    cpu::sparse_axpy(three, nm.view, list.data(), n, H.data(), n_tokens, n, b.data(), n_embd, s3.data());
    EXPECT_EQ(a, b) << dtype_name(nt) << ": columns split, 1 vs 3 threads";
    for (int64_t tk = 0; tk < n_tokens; ++tk)
      cpu::nm4_axpy(nm.view, list.data(), H.data() + tk * n, n, 0, n_embd, per_token.data() + tk * n_embd);
    EXPECT_EQ(a, per_token) << dtype_name(nt);
    cpu::sparse_axpy(three, nm.view, list.data(), n, H.data(), n_tokens, n, c.data(), n_embd, s3.data(),
                     cpu::AxpySplit::neurons);
    // The neurons split segments the list differently, so its factors round differently: each
    // result is within half a step of the largest factor times the rounded parts' sum of the
    // exact one.
    float worst = 0, mag = 0, hmax = 0;
    for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, std::fabs(a[j] - c[j])), mag = std::max(mag, std::fabs(a[j]));
    for (float x : H) hmax = std::max(hmax, std::fabs(x));
    std::vector<float> w(static_cast<size_t>(n_embd));
    double wsum_max = 0;
    std::vector<double> wsum(static_cast<size_t>(n_embd), 0.0);
    for (int32_t i : list) {
      cpu::dequantize_neuron(nm.view, i, w.data());
      for (int64_t j = 0; j < n_embd; ++j)
        wsum[j] += std::fabs(w[j] - (t == DType::Q4_1 ? cpu::nm4_table_value(nm.view, i, j, true) : 0.f));
    }
    for (double x : wsum) wsum_max = std::max(wsum_max, x);
    EXPECT_LT(worst, 2 * wsum_max * hmax / 254.0 + 1e-5f * mag) << dtype_name(nt) << ": neurons split";
    EXPECT_GT(worst, 0.0f) << "the splits' roundings differ (else the bound above tests nothing)";
  }
}

// What a hybrid device holds of a layer's down (cpu::neuron_major_rows): some neurons' rows, in a
// list's order, in Q8_0: from the shared-scale copy the same bytes as from a whole Q8_0 copy
// (the file's values, rounded once), and from that copy its rows as they are. The bytes per
// neuron the planner charges the CPU are the copy's, tables included.
TEST(Nm4, DeviceRowsFromTheCopyEqualTheRowWiseCopy) {
  ThreadPool pool(2);
  for (DType t : {DType::Q4_0, DType::Q4_1}) {
    for (const auto& s : kShapes) {
      const int64_t n_embd = s[0], n_ff = s[1];
      Down down = random_down(t, n_embd, n_ff, 23);
      auto nm = cpu::make_neuron_major(pool, down.view, cpu::nm4_type_of(t));
      auto q8 = cpu::make_neuron_major(pool, down.view, DType::Q8_0);
      EXPECT_EQ(cpu::neuron_major_row_bytes(nm.view.type, n_embd) * static_cast<uint64_t>(n_ff), nm.view.nbytes);
      EXPECT_EQ(cpu::neuron_major_row_bytes(DType::Q8_0, n_embd), q8.view.row_size());
      auto narrow = cpu::make_neuron_major(pool, down.view, cpu::nm4_type_of(t, true));
      const uint64_t narrow_row = cpu::neuron_major_row_bytes(narrow.view.type, n_embd);  // rounded up
      EXPECT_GE(narrow_row * static_cast<uint64_t>(n_ff), narrow.view.nbytes);
      EXPECT_LT((narrow_row - 1) * static_cast<uint64_t>(n_ff), narrow.view.nbytes);
      for (const auto& ids : lists(n_ff, 29)) {
        const int64_t n = static_cast<int64_t>(ids.size());
        auto from_nm = cpu::neuron_major_rows(pool, nm.view, ids.data(), n, DType::Q8_0);
        auto from_q8 = cpu::neuron_major_rows(pool, q8.view, ids.data(), n, DType::Q8_0);
        ASSERT_EQ(from_nm.view.rows(), n);
        ASSERT_EQ(from_nm.view.nbytes, static_cast<size_t>(n) * q8.view.row_size());
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::memcmp(from_nm.view.row(i), q8.view.row(ids[i]), q8.view.row_size()), 0)
              << dtype_name(t) << " " << n_embd << "x" << n_ff << " row " << i << " (neuron " << ids[i] << ")";
          ASSERT_EQ(std::memcmp(from_q8.view.row(i), q8.view.row(ids[i]), q8.view.row_size()), 0);
        }
      }
    }
  }
  Down d = random_down(DType::Q4_0, 64, 64, 1);
  auto nm = cpu::make_neuron_major(pool, d.view, DType::Q4_0_NM);
  const int32_t ids[] = {3, 64};
  EXPECT_THROW(cpu::neuron_major_rows(pool, nm.view, ids, 1, DType::Q4_0_NM), std::exception);  // no shared tables
  EXPECT_THROW(cpu::neuron_major_rows(pool, nm.view, ids, 2, DType::Q8_0), std::exception);     // neuron 64 of 64
}

TEST(Nm4, RejectsWhatItCannotHold) {
  ThreadPool pool(1);
  Down q8 = random_down(DType::Q8_0, 32, 64, 1);
  EXPECT_THROW(cpu::nm4_type_of(DType::Q8_0), std::exception);
  EXPECT_THROW(cpu::make_neuron_major(pool, q8.view, DType::Q4_0_NM), std::exception);
  EXPECT_THROW(cpu::make_neuron_major(pool, q8.view, DType::Q4_0_NM8), std::exception);
  Down q41 = random_down(DType::Q4_1, 32, 64, 1);
  EXPECT_THROW(cpu::make_neuron_major(pool, q41.view, DType::Q4_0_NM8), std::exception) << "Q4_1 needs its min table";
  // A width that is not a multiple of 32 keeps a row-wise type.
  EXPECT_NE(cpu::neuron_major_dtype(DType::Q4_0, cpu::NeuronMajorType::exact, 48, true), DType::Q4_0_NM);
}
