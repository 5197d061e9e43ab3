// AVX-VNNI kernel (vpdpbusd on 256-bit vectors: Intel Alder Lake and later) of the neuron-major
// 4-bit axpy (ops/cpu/nm4/nm4.hpp): segment by segment and chunk by chunk, fours of the segment's
// rows multiplied by their int8 factors (vpdpbusd into 32-bit sums: nm4/nm4_simd.hpp), then
// scaled into the output once. The same operations per output as the scalar kernel, so the same
// bits.
#include <immintrin.h>

#include "ops/cpu/nm4/nm4.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/simd_f32.hpp"
#include "ops/cpu/nm4/nm4_simd.hpp"

}  // namespace

void add_nm4_axpy_avx_vnni(KernelTable<Nm4AxpyFn>& t) {
  add_nm4_axpys(t, SimdLevel::avx_vnni,
                {&nm4_axpy256<false, false>, &nm4_axpy256<true, false>, &nm4_axpy256<false, true>, &nm4_axpy256<true, true>});
}

}  // namespace ember::cpu::detail
