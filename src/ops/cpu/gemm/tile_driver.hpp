// Register-tile driver shared by the SIMD kernel files. Include it only inside an anonymous
// namespace of a *_avx2.cpp / *_avx512.cpp file, so that each ISA gets its own instantiations
// (one shared definition would break the one-definition rule across target flags).
//
// A kernel K provides kRows, kTokens and `template <int R, int T> static void tile(args, r0, t0)`
// computing rows [r0, r0+R) x tokens [t0, t0+T); gemm<K> covers any block with tiles of at most
// kRows x kTokens, the remainders with smaller instantiations.

#include "ops/cpu/simd_f32.hpp"

using TileFn = void (*)(const GemmArgs&, int64_t, int64_t);

// The weight rows, activation rows and float accumulators (kLanes wide: 8 for __m256, 16 for
// __m512; zeroed) of one R x T tile; store() writes each output: the accumulator's lane sum, or
// out(acc, r, t) where a kernel adds terms of its own.
template <class WB, class XB, int kLanes, int R, int T>
struct TileOperands {
  using V = typename F32Lanes<kLanes>::V;
  const WB* w[R];
  const XB* x[T];
  V acc[R][T];
  TileOperands(const GemmArgs& a, int64_t r0, int64_t t0) {
    for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const WB*>(a.w + (r0 + r) * a.w_stride);
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const XB*>(a.x + (t0 + t) * a.x_stride);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = F32Lanes<kLanes>::zero();
  }
  void store(const GemmArgs& a, int64_t r0, int64_t t0) const {
    store(a, r0, t0, [](V v, int, int) { return F32Lanes<kLanes>::reduce_add(v); });
  }
  template <class Out>
  void store(const GemmArgs& a, int64_t r0, int64_t t0, Out out) const {
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) a.y[(t0 + t) * a.y_stride + r0 + r] = out(acc[r][t], r, t);
  }
};

template <class K, int R, int T>
void tile_call(const GemmArgs& a, int64_t r0, int64_t t0) {
  K::template tile<R, T>(a, r0, t0);
}

template <class K, int RM, int TM, int I = 0>
constexpr void fill_tiles(std::array<TileFn, RM * TM>& table) {
  if constexpr (I < RM * TM) {
    table[I] = &tile_call<K, I / TM + 1, I % TM + 1>;
    fill_tiles<K, RM, TM, I + 1>(table);
  }
}

template <class K>
constexpr int decode_rows() {
  if constexpr (requires { K::kDecodeRows; }) return K::kDecodeRows;
  else return K::kRows;
}

template <class K>
void gemm(const GemmArgs& a) {
  constexpr int RM = K::kRows, TM = K::kTokens;
  if constexpr (decode_rows<K>() != RM) {
    if (a.ntok == 1) {
      constexpr int RD = decode_rows<K>();
      static_assert(RD <= RM);
      int64_t r0 = 0;
      for (; r0 + RD <= a.nrows; r0 += RD) K::template tile<RD, 1>(a, r0, 0);
      for (; r0 < a.nrows; ++r0) K::template tile<1, 1>(a, r0, 0);
      return;
    }
  }
  static constexpr std::array<TileFn, RM * TM> table = [] {
    std::array<TileFn, RM * TM> t{};
    fill_tiles<K, RM, TM>(t);
    return t;
  }();
  for (int64_t r0 = 0; r0 < a.nrows; r0 += RM) {
    const int nr = static_cast<int>(a.nrows - r0 < RM ? a.nrows - r0 : RM);
    for (int64_t t0 = 0; t0 < a.ntok; t0 += TM) {
      const int nt = static_cast<int>(a.ntok - t0 < TM ? a.ntok - t0 : TM);
      table[(nr - 1) * TM + nt - 1](a, r0, t0);
    }
  }
}
