// What each CUDA kernel of the hybrid engine reaches on this GPU, against the bytes it must move
// (the device library's METHOD: a kernel's floor is its bytes over the card's bandwidth).
//
//   ember-cuda-kernels [--json FILE] [--reps N]
//
// First the card's own rate: a device-to-device copy of 1 GiB (bytes read plus written over the
// time). Then each kernel on a 7B model's shapes (Llama-2-7B: n_embd 4096, n_ff 11008, 32 heads,
// vocabulary 32000; Q4_0 weights as Ember holds them, the split layout), timed with events over
// `reps` launches at a time, the median of 11 such timings, its inputs rotated over copies that
// together exceed the L2 cache (so a matrix is read from memory, not from the cache): microseconds
// a launch, the bytes it must read and write, GB/s, and that as a share of the copy's rate. The
// target of issue 43: the 4096 x 11008 Q4_0 matvec at 75 % or more.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "tensor/dtype.hpp"
#include "tensor/quant.hpp"
#ifdef EMBER_HAS_CUDA
#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_ops.hpp"
#endif

using namespace ember;

#ifndef EMBER_HAS_CUDA
int main() {
  std::fprintf(stderr, "ember-cuda-kernels: built without CUDA (configure with a CUDA toolkit)\n");
  return 2;
}
#else
namespace {

constexpr int64_t kEmbd = 4096, kFf = 11008, kHeads = 32, kHeadDim = 128, kVocab = 32000;
constexpr size_t kRotateBytes = size_t{256} << 20;  // inputs rotated over this much (> any L2)

struct Row {
  std::string kernel, shape;
  double us = 0, bytes = 0, gbs = 0, share = 0;
};

// Device buffers freed at exit.
struct Arena {
  std::vector<void*> ptrs;
  ~Arena() {
    for (void* p : ptrs) cuda::free_device(p);
  }
  void* alloc(size_t bytes) {
    ptrs.push_back(cuda::malloc_device(bytes));
    return ptrs.back();
  }
  template <class T>
  T* upload(const std::vector<T>& host) {
    auto* p = static_cast<T*>(alloc(host.size() * sizeof(T)));
    cuda::copy_to_device_sync(p, host.data(), host.size() * sizeof(T));
    return p;
  }
};

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// `copies` device copies of a random rows x cols matrix of `type` in the device layout.
std::vector<const void*> matrices(Arena& a, DType type, int64_t rows, int64_t cols, int copies, std::mt19937& rng) {
  const std::vector<float> v = random_floats(static_cast<size_t>(rows * cols), rng);
  const size_t rb = row_bytes(type, cols);
  std::vector<uint8_t> q(rb * static_cast<size_t>(rows)), packed(q.size());
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, v.data() + r * cols, q.data() + r * rb, cols);
  cuda::pack_matrix(type, q.data(), rows, cols, packed.data());
  std::vector<const void*> out;
  for (int i = 0; i < copies; ++i) out.push_back(a.upload(packed));
  return out;
}

int copies_for(size_t bytes) { return static_cast<int>(std::clamp<size_t>(kRotateBytes / std::max<size_t>(bytes, 1), 1, 64)); }

// Median microseconds of one call of f(i) (i: the launch's index, for rotating inputs).
double time_us(void* stream, int reps, const std::function<void(int)>& f) {
  void* e0 = cuda::timing_event_create();
  void* e1 = cuda::timing_event_create();
  for (int i = 0; i < reps; ++i) f(i);  // warm-up: modules loaded, clocks up
  std::vector<double> t;
  for (int k = 0; k < 11; ++k) {
    cuda::event_record(e0, stream);
    for (int i = 0; i < reps; ++i) f(k * reps + i);
    cuda::event_record(e1, stream);
    cuda::event_sync(e1);
    t.push_back(1e3 * cuda::event_elapsed_ms(e0, e1) / reps);
  }
  cuda::event_destroy(e0);
  cuda::event_destroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: ember-cuda-kernels [--json FILE] [--reps N]\n");
      return 2;
    }
  }
  try {
    std::string why;
    EMBER_CHECK(cuda::available(&why), "no CUDA device: {}", why);
    std::mt19937 rng(7);
    Arena A;
    void* s = cuda::stream_create();
    std::vector<Row> rows;
    // The card's rate: a 1 GiB device-to-device copy, read plus write.
    const size_t big = size_t{1} << 30;
    void* src = A.alloc(big);
    void* dst = A.alloc(big);
    const double copy_us = time_us(s, 3, [&](int) { cuda::copy_device(dst, src, big, s); });
    const double peak = 2.0 * static_cast<double>(big) / (copy_us * 1e-6);
    auto add = [&](const std::string& kernel, const std::string& shape, double bytes, double us) {
      Row r{kernel, shape, us, bytes, bytes / (us * 1e-6) / 1e9, bytes / (us * 1e-6) / peak};
      std::printf("| %-28s | %-30s | %9.2f | %10.0f | %8.1f | %5.1f %% |\n", kernel.c_str(), shape.c_str(), us, bytes,
                  r.gbs, 100 * r.share);
      std::fflush(stdout);
      rows.push_back(r);
    };
    std::printf("%s: device-to-device copy %.1f GB/s (read + write)\n\n", cuda::device_name().c_str(), peak / 1e9);
    std::printf("| kernel | shape | us | bytes | GB/s | of copy |\n| --- | --- | ---: | ---: | ---: | ---: |\n");

    // 8-bit activations of one token, and the norm with them in one pass.
    const std::vector<float> x1 = random_floats(kEmbd * 4, rng);
    float* x = A.upload(x1);
    auto* xq = static_cast<uint8_t*>(A.alloc(4 * kEmbd * 2));
    float* xn = static_cast<float*>(A.alloc(4 * kEmbd * sizeof(float)));
    float* w = A.upload(random_floats(kEmbd, rng));
    add("quantize_q8", "1 x 4096", kEmbd * 4.0 + kEmbd * 36.0 / 32,
        time_us(s, reps, [&](int) { cuda::quantize_q8(x, 1, kEmbd, xq, s); }));
    add("norm_rows + q8", "1 x 4096", kEmbd * 8.0 + kEmbd * 4.0 + kEmbd * 36.0 / 32,
        time_us(s, reps, [&](int) { cuda::norm_rows(x, w, nullptr, xn, 1, kEmbd, 1e-5f, false, s, xq); }));

    // Matvecs over whole matrices: gate / up (11008 x 4096), down as rows (4096 x 11008), a
    // projection (4096 x 4096), the output head (32000 x 4096); 1 and 4 tokens.
    struct Shape {
      const char* name;
      int64_t rows, cols;
    };
    for (DType type : {DType::Q4_0, DType::Q8_0, DType::F16}) {
      for (const Shape& sh : {Shape{"gate/up", kFf, kEmbd}, Shape{"down", kEmbd, kFf}, Shape{"wq", kEmbd, kEmbd},
                              Shape{"output", kVocab, kEmbd}}) {
        if (type != DType::Q4_0 && std::string(sh.name) != "gate/up") continue;
        const size_t mbytes = row_bytes(type, sh.cols) * static_cast<size_t>(sh.rows);
        const auto mats = matrices(A, type, sh.rows, sh.cols, copies_for(mbytes), rng);
        const std::vector<float> xv = random_floats(static_cast<size_t>(4 * sh.cols), rng);
        float* xs = A.upload(xv);
        auto* q = static_cast<uint8_t*>(A.alloc(static_cast<size_t>(4 * sh.cols / 32 * 36)));
        cuda::quantize_q8(xs, 4, sh.cols, q, s);
        float* y = static_cast<float*>(A.alloc(static_cast<size_t>(4 * sh.rows) * sizeof(float)));
        for (int64_t nt : {1, 4}) {
          const cuda::Activations act{xs, cuda::takes_q8(type) ? q : nullptr};
          const double us = time_us(s, reps, [&](int i) {
            cuda::matvec(type, mats[static_cast<size_t>(i) % mats.size()], sh.cols, sh.rows, act, nt, y, s);
          });
          add(fmt::format("matvec {}", dtype_name(type)), fmt::format("{} {} x {}, {} token(s)", sh.name, sh.rows,
              sh.cols, nt), static_cast<double>(mbytes) + 4.0 * nt * sh.rows, us);
        }
      }
    }

    // Prompts: a 512-token batch through the tiled product (each weight read once per 64 tokens)
    // and the down's partial sums a row read per 8 tokens; their rate in multiply-adds too (a
    // prompt is compute-bound: llama.cpp's pp512 is the reference of issue 43).
    {
      const DType type = DType::Q4_0;
      constexpr int64_t kPrompt = 512;
      const size_t mbytes = row_bytes(type, kEmbd) * static_cast<size_t>(kFf);
      const auto mats = matrices(A, type, kFf, kEmbd, copies_for(mbytes), rng);
      float* xs = A.upload(random_floats(static_cast<size_t>(kPrompt * kEmbd), rng));
      auto* q = static_cast<uint8_t*>(A.alloc(static_cast<size_t>(kPrompt * kEmbd / 32 * 36)));
      cuda::quantize_q8(xs, kPrompt, kEmbd, q, s);
      float* y = static_cast<float*>(A.alloc(static_cast<size_t>(kPrompt * kFf) * sizeof(float)));
      // Both ways of multiplying the tiles' codes (tensor cores where the card has them, and dp4a).
      const cuda::TileMath chosen = cuda::tile_math();
      for (cuda::TileMath m : {cuda::TileMath::mma, cuda::TileMath::dp4a}) {
        cuda::set_tile_math(m);
        const double us = time_us(s, std::max(1, reps / 8), [&](int i) {
          cuda::matvec(type, mats[static_cast<size_t>(i) % mats.size()], kEmbd, kFf, {xs, q}, kPrompt, y, s);
        });
        add(fmt::format("matmul Q4_0 (prompt, {})", m == cuda::TileMath::mma ? "mma" : "dp4a"),
            "gate/up 11008 x 4096, 512 tokens", static_cast<double>(mbytes) + kPrompt * kEmbd * 36.0 / 32 + kPrompt * kFf * 4.0,
            us);
        std::printf("|   (%.1f T multiply-adds/s) | | | | | |\n", static_cast<double>(kFf) * kEmbd * kPrompt / (us * 1e-6) / 1e12);
      }
      cuda::set_tile_math(chosen);
      // The down's partial sums over every row (a dense prompt's share), 512 tokens.
      const auto downs = matrices(A, type, kFf, kEmbd, copies_for(mbytes), rng);
      std::vector<int32_t> all(static_cast<size_t>(kFf));
      for (int64_t i = 0; i < kFf; ++i) all[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      auto* active = static_cast<int32_t*>(A.alloc((kFf + 1) * sizeof(int32_t)));
      cuda::copy_to_device_sync(active, all.data(), all.size() * sizeof(int32_t));
      const int32_t nff = static_cast<int32_t>(kFf);
      cuda::copy_to_device_sync(active + kFf, &nff, sizeof(int32_t));
      float* h = A.upload(random_floats(static_cast<size_t>(kPrompt * kFf), rng));
      float* partial = static_cast<float*>(A.alloc(static_cast<size_t>(kPrompt * kEmbd) * sizeof(float)));
      for (cuda::TileMath m : {cuda::TileMath::mma, cuda::TileMath::dp4a}) {  // tensor cores, or the axpy
        cuda::set_tile_math(m);
        const double ud = time_us(s, std::max(1, reps / 8), [&](int i) {
          cuda::sparse_axpy_partial(type, downs[static_cast<size_t>(i) % downs.size()], kFf, kEmbd, active, active + kFf,
                                    h, kFf, kPrompt, partial, s);
        });
        add(fmt::format("sparse_axpy Q4_0 (prompt, {})", m == cuda::TileMath::mma ? "mma" : "axpy"),
            "11008 rows of 4096, 512 tokens", static_cast<double>(mbytes) + kPrompt * kFf * 4.0 + kPrompt * kEmbd * 4.0, ud);
        std::printf("|   (%.1f T multiply-adds/s) | | | | | |\n", static_cast<double>(kFf) * kEmbd * kPrompt / (ud * 1e-6) / 1e12);
      }
      cuda::set_tile_math(chosen);
    }

    // The FFN share at 10 % firing: the gate with the firing test over all rows, the compaction,
    // up times the firing value over the firing rows, the down's partial sums and their reduction.
    {
      const DType type = DType::Q4_0;
      const size_t mbytes = row_bytes(type, kEmbd) * static_cast<size_t>(kFf);
      const int copies = copies_for(3 * mbytes);
      const auto gates = matrices(A, type, kFf, kEmbd, copies, rng), ups = matrices(A, type, kFf, kEmbd, copies, rng),
                 downs = matrices(A, type, kFf, kEmbd, copies, rng);
      auto* q = static_cast<uint8_t*>(A.alloc(kEmbd / 32 * 36));
      cuda::quantize_q8(x, 1, kEmbd, q, s);
      const cuda::Activations act{x, q};
      float* a = static_cast<float*>(A.alloc(kFf * sizeof(float)));
      float* h = static_cast<float*>(A.alloc(kFf * sizeof(float)));
      auto* counts = static_cast<int32_t*>(A.alloc(kFf * sizeof(int32_t)));
      auto* active = static_cast<int32_t*>(A.alloc(kFf * sizeof(int32_t)));
      auto* pos = static_cast<int32_t*>(A.alloc((kFf + 2) * sizeof(int32_t)));
      float* partial = static_cast<float*>(A.alloc(cuda::kAxpyChunks * kEmbd * sizeof(float)));
      float* out = static_cast<float*>(A.alloc(kEmbd * sizeof(float)));
      // A threshold that fires about 10 % of the neurons (|N(0, 1) * 4096^0.5 * scale| tail).
      cuda::MatvecOut g;
      g.kind = cuda::Epilogue::fire;
      g.y = a;
      g.act = cpu::Activation::relu;
      g.counts = counts;
      g.threshold = 0.0f;
      std::vector<float> pre(kFf);
      cuda::matvec(type, gates[0], kEmbd, kFf, act, 1, a, s);
      cuda::stream_sync(s);
      cuda::copy_to_host_sync(pre.data(), a, kFf * sizeof(float));
      std::sort(pre.begin(), pre.end());
      g.threshold = std::max(0.0f, pre[static_cast<size_t>(kFf * 0.9)]);
      add("matvec gate + fire", "11008 x 4096, 1 token", static_cast<double>(mbytes) + kFf * 8.0,
          time_us(s, reps, [&](int i) { cuda::matvec({type, gates[static_cast<size_t>(i) % gates.size()], kFf, kEmbd}, {}, act, 1, g, s); }));
      add("compact", "11008 positions", kFf * 4.0 * 2,
          time_us(s, reps, [&](int) { cuda::compact(counts, kFf, nullptr, nullptr, active, pos, pos + kFf, s); }));
      int32_t na = 0;
      cuda::stream_sync(s);
      cuda::copy_to_host_sync(&na, pos + kFf, sizeof(na));
      const double frac = static_cast<double>(na) / kFf;
      cuda::MatvecOut u;
      u.kind = cuda::Epilogue::gate_mul;
      u.y = h;
      u.stride = kFf;
      u.a = a;
      u.a_stride = kFf;
      u.pos = pos;
      add("matvec up x act (gather)", fmt::format("{} of 11008 rows", na), frac * static_cast<double>(mbytes) + na * 8.0,
          time_us(s, reps, [&](int i) {
            cuda::matvec({type, ups[static_cast<size_t>(i) % ups.size()], kFf, kEmbd}, {active, pos + kFf, kFf}, act, 1,
                         u, s);
          }));
      add("sparse_axpy (partial)", fmt::format("{} rows of 4096", na),
          frac * static_cast<double>(mbytes) + cuda::kAxpyChunks * kEmbd * 4.0,
          time_us(s, reps, [&](int i) {
            cuda::sparse_axpy_partial(type, downs[static_cast<size_t>(i) % downs.size()], kFf, kEmbd, active, pos + kFf,
                                      h, kFf, 1, partial, s);
          }));
      add("axpy_reduce", "64 chunks x 4096", cuda::kAxpyChunks * kEmbd * 4.0 + kEmbd * 4.0,
          time_us(s, reps, [&](int) { cuda::axpy_reduce(partial, kEmbd, 1, out, s); }));
    }

    // Attention of one token over 256 and 2048 cached positions (F16 cache), 32 heads of 128.
    for (int64_t ctx : {256, 2048}) {
      const int64_t kvd = kHeads * kHeadDim;
      auto* k = A.alloc(static_cast<size_t>(ctx * kvd) * 2);
      auto* v = A.alloc(static_cast<size_t>(ctx * kvd) * 2);
      float* qv = A.upload(random_floats(kvd, rng));
      float* o = static_cast<float*>(A.alloc(kvd * sizeof(float)));
      float* sc = static_cast<float*>(A.alloc(static_cast<size_t>(kHeads * ctx) * sizeof(float)));
      float* part = static_cast<float*>(
          A.alloc(static_cast<size_t>(cuda::attention_partial_floats(1, kHeads, kHeadDim, ctx)) * sizeof(float)));
      auto* p0 = A.upload(std::vector<int32_t>{static_cast<int32_t>(ctx - 1)});
      cuda::AttentionArgs args;
      args.n_head = kHeads, args.n_head_kv = kHeads, args.head_dim = kHeadDim, args.n_ctx = ctx;
      args.scale = 0.088f;
      add("attention (F16 cache)", fmt::format("1 token, {} positions", ctx), 2.0 * ctx * kvd * 2 + kvd * 8.0,
          time_us(s, reps, [&](int) { cuda::attention(args, qv, 1, p0, ctx, k, v, o, sc, part, s); }));
    }
    cuda::stream_destroy(s);
    if (!json_path.empty()) {
      nlohmann::json j;
      j["device"] = cuda::device_name();
      j["copy_bytes_per_s"] = peak;
      for (const Row& r : rows)
        j["kernels"].push_back({{"kernel", r.kernel}, {"shape", r.shape}, {"us", r.us}, {"bytes", r.bytes},
                                {"gb_per_s", r.gbs}, {"share_of_copy", r.share}});
      std::ofstream(json_path) << j.dump(2) << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ember-cuda-kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
#endif
