#include "ops/cpu/attention/attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "support/simd_levels.hpp"
#include "tensor/quant.hpp"

using namespace ember;

namespace {
std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
}  // namespace

// The threaded attention equals the double-precision reference for awkward shapes, at every SIMD
// level: GQA groups (of four heads and more: the grouped kernel), a batch starting mid-sequence, sliding windows, soft-capping, head sizes
// that are not multiples of 16 or exceed the AVX-512 kernel's 256 register-held columns, and
// position counts that leave tails in its sixteen-wide softmax loops.
TEST(Attention, MatchesReference) {
  test_support::SimdGuard guard;
  struct Case {
    int64_t n_head, n_kv, hd, n_tokens, pos0, window;
    float softcap;
  };
  for (Case c : {Case{4, 4, 8, 1, 0, 0, 0}, Case{9, 3, 64, 7, 5, 0, 0}, Case{8, 1, 16, 13, 0, 4, 0},
                 Case{6, 2, 10, 3, 30, 0, 30.f}, Case{2, 1, 256, 1, 100, 7, 0},
                 Case{4, 2, 300, 2, 37, 0, 0}, Case{3, 3, 72, 1, 200, 0, 0}, Case{5, 5, 33, 40, 0, 0, 0},
                 Case{2, 2, 512, 3, 18, 0, 0},
                 // groups of four heads per KV head (the AVX-512 grouped kernel where enough of them)
                 Case{8, 2, 64, 1, 50, 0, 0}, Case{16, 2, 300, 3, 20, 0, 0}, Case{8, 2, 40, 5, 3, 6, 0},
                 Case{8, 2, 16, 4, 10, 0, 20.f},
                 // three heads per KV head (grouped by three), and long contexts with few runs of
                 // heads: decode split into equal chunks of at most 512 positions (tokens of a batch
                 // see different lengths), with a window, soft-capping, one head per KV head; the
                 // case after them has enough runs (8) not to split
                 Case{9, 3, 64, 2, 30, 0, 0}, Case{9, 3, 64, 1, 1500, 0, 0}, Case{8, 2, 64, 3, 2000, 0, 0},
                 Case{4, 1, 256, 2, 1100, 1000, 0}, Case{6, 2, 16, 1, 700, 0, 30.f}, Case{5, 5, 33, 1, 1030, 0, 0},
                 Case{4, 2, 24, 3, 510, 0, 0}, Case{32, 4, 64, 1, 1500, 0, 0},
                 // few runs but a batch of more than 4 tokens (a prompt's last chunk): not split
                 Case{4, 1, 256, 6, 1500, 0, 0}, Case{9, 3, 16, 2, 600, 0, 0}}) {
    cpu::AttentionShape s{c.n_head, c.n_kv, c.hd, 1.0f / std::sqrt(float(c.hd)), c.window, c.softcap};
    int64_t n_ctx = c.pos0 + c.n_tokens;
    int64_t stride = c.n_kv * c.hd + 3;  // rows padded: the stride is honoured
    auto q = random_vec(c.n_tokens * c.n_head * c.hd, 1);
    auto k = random_vec(n_ctx * stride, 2);
    auto v = random_vec(n_ctx * stride, 3);
    std::vector<float> ref(q.size()), out(q.size());
    cpu::attention_reference(s, q.data(), c.n_tokens, c.pos0, k.data(), v.data(), stride, ref.data());
    // The same cache in F16, against the reference on the F16-rounded values.
    std::vector<uint16_t> k16(k.size()), v16(v.size());
    quantize_row(DType::F16, k.data(), k16.data(), static_cast<int64_t>(k.size()));
    quantize_row(DType::F16, v.data(), v16.data(), static_cast<int64_t>(v.size()));
    std::vector<float> k_r(k.size()), v_r(v.size()), ref16(q.size());
    dequantize_row(DType::F16, k16.data(), k_r.data(), static_cast<int64_t>(k.size()));
    dequantize_row(DType::F16, v16.data(), v_r.data(), static_cast<int64_t>(v.size()));
    cpu::attention_reference(s, q.data(), c.n_tokens, c.pos0, k_r.data(), v_r.data(), stride, ref16.data());
    for (SimdLevel level : test_support::simd_levels())
      for (int threads : {1, 3})
        for (bool f16 : {false, true}) {
          set_simd_level(level);
          ThreadPool pool(threads);
          std::vector<float> scratch(cpu::attention_scratch_floats(n_ctx, c.n_head, c.hd, threads));
          cpu::AttentionShape sk = s;
          sk.kv_f16 = f16;
          cpu::attention(pool, sk, q.data(), c.n_tokens, c.pos0, f16 ? static_cast<const void*>(k16.data()) : k.data(),
                         f16 ? static_cast<const void*>(v16.data()) : v.data(), stride, out.data(), scratch.data());
          const std::vector<float>& want = f16 ? ref16 : ref;
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(out[i], want[i], 2e-5f) << i << " " << simd_level_name(level) << " hd " << c.hd << " f16 " << f16;
        }
  }
}

// With one visible key (position 0), attention returns exactly that value row.
TEST(Attention, FirstPositionReturnsValue) {
  cpu::AttentionShape s{2, 1, 4, 0.5f, 0, 0};
  std::vector<float> q = {1, 2, 3, 4, -1, 0, 1, 2}, k = {0.5f, 1, 1.5f, 2}, v = {7, -3, 2.5f, 9}, out(8);
  ThreadPool pool(1);
  std::vector<float> scratch(cpu::attention_scratch_floats(1, 2, 4, 1));
  cpu::attention(pool, s, q.data(), 1, 0, k.data(), v.data(), 4, out.data(), scratch.data());
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out[h * 4 + i], v[i]);
}

// The grouped kernel (runs of 4, 3 or 2 heads of a KV head) and the one-head kernel compute every
// score and output with the same operations: a decode step gives the same bits on one thread
// (runs of the whole group) as on three (runs of two heads where the group is four) and on
// sixteen (one head at a time), so results never depend on the thread count.
TEST(Attention, GroupedAndSingleHeadKernelsAgreeBitForBit) {
  test_support::SimdGuard guard;
  struct Case {
    int64_t n_head, n_kv, n_ctx;
  };
  // 37 positions: grouped on one thread, one head at a time on three; 1500 (split into chunks):
  // the chunks go to the threads, and the result must not depend on how. Head sizes: 72 (the
  // query read from memory), 64 and 40 (held in registers, scores four or two positions at a
  // time, 37 leaving a tail). Every level with a grouped kernel (AVX2: two to four heads, two or four
  // positions at a time, the queries from L1).
  for (SimdLevel level : test_support::simd_levels())
  for (int64_t hd : {72, 64, 40})
  for (Case c : {Case{8, 2, 37}, Case{9, 3, 37}, Case{9, 3, 1500}, Case{8, 2, 1500}})
  for (bool f16 : {false, true}) {
    cpu::AttentionShape s{c.n_head, c.n_kv, hd, 1.0f / std::sqrt(float(hd)), 0, 0};
    s.kv_f16 = f16;
    const int64_t n_ctx = c.n_ctx, stride = c.n_kv * hd;
    auto q = random_vec(c.n_head * hd, 4);
    auto k = random_vec(n_ctx * stride, 5), v = random_vec(n_ctx * stride, 6);
    std::vector<uint16_t> k16(k.size()), v16(v.size());
    quantize_row(DType::F16, k.data(), k16.data(), static_cast<int64_t>(k.size()));
    quantize_row(DType::F16, v.data(), v16.data(), static_cast<int64_t>(v.size()));
    const void* kp = f16 ? static_cast<const void*>(k16.data()) : k.data();
    const void* vp = f16 ? static_cast<const void*>(v16.data()) : v.data();
    // 1 thread: runs of the whole group (4 or 3 heads); 3: runs of 2 where the group is 4; 16:
    // one head at a time.
    std::vector<float> one(q.size()), other(q.size());
    set_simd_level(level);
    for (int threads : {1, 3, 16}) {
      ThreadPool pool(threads);
      std::vector<float> scratch(cpu::attention_scratch_floats(n_ctx, c.n_head, hd, threads));
      cpu::attention(pool, s, q.data(), 1, n_ctx - 1, kp, vp, stride, threads == 1 ? one.data() : other.data(),
                     scratch.data());
      if (threads == 1) continue;
      for (size_t i = 0; i < q.size(); ++i)
        ASSERT_EQ(one[i], other[i]) << i << " f16 " << f16 << " ctx " << n_ctx << " hd " << hd << " threads " << threads
                                    << " " << simd_level_name(level);
    }
  }
}
