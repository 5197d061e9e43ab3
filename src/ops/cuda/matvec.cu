// The matvec (see cuda_ops.hpp): a warp per row, up to kMvTokens tokens from one read of it;
// prompts of kGemmMinTokens or more go to the tiles (tiles.cu).
#include "ops/cuda/matvec.cuh"

namespace ember::cuda {

using namespace detail;

namespace {

// Block (rows kMvWarps i .. + kMvWarps - 1, token slice y): a warp per row, all the slice's
// tokens kMvTokens at a time from one read of the row each; the epilogue at lane 0.
template <DType T>
__global__ void __launch_bounds__(kMvWarps * kWarp) matvec_kernel(MvArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMvWarps + threadIdx.x / kWarp;
  const int64_t n = a.count ? *a.count : a.max_rows;
  const bool valid = i < n;  // a warp past the end still takes part in the (uniform) shuffles
  const int64_t r = valid ? (a.ids ? a.ids[i] : i) : 0;
  const int64_t t_begin = static_cast<int64_t>(blockIdx.y) * a.tokens_per_block;
  const int64_t t_end = t_begin + a.tokens_per_block < a.n_tokens ? t_begin + a.tokens_per_block : a.n_tokens;
  const MatvecOut& o = a.out;
  int fired = 0;
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kMvTokens) {
    const int ng = static_cast<int>(t_end - t0 < kMvTokens ? t_end - t0 : kMvTokens);
    float acc[kMvTokens];
#pragma unroll
    for (int j = 0; j < kMvTokens; ++j) acc[j] = 0.0f;
    if (valid) lane_dots<T>(a.w, a.w_rows, a.cols, r, a.x, a.n_tokens, t0, ng, lane, acc);
#pragma unroll
    for (int j = 0; j < kMvTokens; ++j) acc[j] = warp_sum(acc[j]);
    if (!valid || lane != 0) continue;
    for (int j = 0; j < ng; ++j) apply_epilogue(o, t0 + j, i, r, acc[j], fired);
  }
  if (!valid || lane != 0) return;
  if (o.kind == Epilogue::fire) o.counts[i] = fired;
  if (o.kind == Epilogue::select && i < o.k) o.counts[i] = fired;
}

}  // namespace

void matvec(const Matrix& W, const RowSet& rs, Activations x, int64_t n_tokens, const MatvecOut& out, void* stream) {
  check_type(W.type, W.cols);
  const int64_t max_rows = rs.max >= 0 ? rs.max : W.rows;
  if (max_rows == 0 || n_tokens == 0) return;
  const void* xp = takes_q8(W.type) ? x.q8 : static_cast<const void*>(x.f);
  EMBER_CHECK(xp, "CUDA matvec: {} rows need {} activations", dtype_name(W.type), takes_q8(W.type) ? "8-bit" : "float");
  EMBER_CHECK(out.kind == Epilogue::select || out.y, "CUDA matvec: no output");
  EMBER_CHECK((out.kind != Epilogue::fire && out.kind != Epilogue::select) || out.counts, "CUDA matvec: no counts");
  EMBER_CHECK(out.kind != Epilogue::select || out.mask, "CUDA matvec: no mask for the selection");
  MvArgs a{static_cast<const uint8_t*>(W.data), W.rows, W.cols, rs.ids, rs.count, max_rows, xp, n_tokens, n_tokens, out};
  if (a.out.stride == 0) a.out.stride = max_rows;
  cudaStream_t s = as_stream(stream);
  if (n_tokens >= kGemmMinTokens) {  // a prompt: tiles, each weight read once per 64 tokens
    launch_tiles(W.type, a, s);
    return;
  }
  // Epilogues of one token at a time may split the tokens over blocks (prompts: more blocks,
  // each row read once per slice); fire and select count over all tokens in one warp.
  const bool per_token = out.kind != Epilogue::fire && out.kind != Epilogue::select;
  constexpr int64_t kSlice = 4 * kMvTokens;
  if (per_token && n_tokens > kSlice) a.tokens_per_block = kSlice;
  const dim3 grid(grid_of(max_rows, kMvWarps), static_cast<unsigned>((n_tokens + a.tokens_per_block - 1) / a.tokens_per_block));
  by_type(W.type, [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    matvec_kernel<T><<<grid, kMvWarps * kWarp, 0, s>>>(a);
  });
  launched("matvec kernel");
}

void matvec(DType type, const void* W, int64_t cols, int64_t rows, Activations x, int64_t n_tokens, float* y,
            void* stream) {
  MatvecOut o;
  o.y = y;
  matvec({type, W, rows, cols}, {}, x, n_tokens, o, stream);
}

void gather_matvec(DType type, const void* W, int64_t w_rows, int64_t cols, const int32_t* rows,
                   const int32_t* n_rows, int64_t max_rows, Activations x, int64_t n_tokens, float* y,
                   int64_t y_stride, void* stream) {
  MatvecOut o;
  o.y = y;
  o.stride = y_stride;
  matvec({type, W, w_rows, cols}, {rows, n_rows, max_rows}, x, n_tokens, o, stream);
}

}  // namespace ember::cuda
