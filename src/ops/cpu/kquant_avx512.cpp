// AVX-512 (VNNI on 256-bit vectors) kernels for Q5_0, Q5_1, Q4_K, Q5_K: see kquant_simd.hpp.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <array>
#include <type_traits>

#include "ops/cpu/kquant.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/tile_driver.hpp"
#include "ops/cpu/kquant_simd.hpp"

}  // namespace

const KQuantSet& kquant_avx512() { return make_kquant_set(); }

}  // namespace ember::cpu::detail
