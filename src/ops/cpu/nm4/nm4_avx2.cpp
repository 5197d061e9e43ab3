// AVX2 + FMA + F16C kernel of the neuron-major 4-bit axpy (ops/cpu/nm4/nm4.hpp): segment by
// segment and chunk by chunk, fours of the segment's rows multiplied by their int8 factors
// (vpmaddubsw into 16-bit half-sums, added into 32 bits once per segment: nm4/nm4_simd.hpp), then
// scaled into the output once. The same operations per output as the scalar kernel, so the same
// bits.
#include <immintrin.h>

#include "ops/cpu/nm4/nm4.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/simd_f32.hpp"
#include "ops/cpu/nm4/nm4_simd.hpp"

template <bool kMin, bool kNarrow>
void axpy(const TensorView& D, const Nm4Seg* segs, int64_t n_segs, int64_t col0, int64_t len, float* out) {
  for (int64_t g = 0; g < n_segs; ++g) {
    const Nm4Rows rows = nm4_rows(D, segs[g]);
    for (int64_t j = col0; j < col0 + len;) {
      const Nm4Chunk c = nm4_chunk_at(D.cols(), j);
      nm4_chunk256<kMin, kNarrow>(D, segs[g], rows, c, col0, out);
      j += c.width;
    }
  }
}

}  // namespace

void add_nm4_axpy_avx2(KernelTable<Nm4AxpyFn>& t) {
  add_nm4_axpys(t, SimdLevel::avx2, {&axpy<false, false>, &axpy<true, false>, &axpy<false, true>, &axpy<true, true>});
}

}  // namespace ember::cpu::detail
