// AVX2 + FMA + F16C kernel of the neuron-major 4-bit axpy (ops/cpu/nm4/nm4.hpp): segment by
// segment and chunk by chunk, pairs of the segment's rows multiplied by their int8 factors
// (vpmaddubsw, summed in 16 bits over the segment and widened once: nm4/nm4_simd.hpp), then
// scaled into the output once. The same operations per output as the scalar kernel, so the same
// bits.
#include <immintrin.h>

#include "ops/cpu/nm4/nm4.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/simd_f32.hpp"
#include "ops/cpu/nm4/nm4_simd.hpp"

}  // namespace

void add_nm4_axpy_avx2(KernelTable<Nm4AxpyFn>& t) {
  add_nm4_axpys(t, SimdLevel::avx2,
                {&nm4_axpy256<false, false>, &nm4_axpy256<true, false>, &nm4_axpy256<false, true>, &nm4_axpy256<true, true>});
}

}  // namespace ember::cpu::detail
