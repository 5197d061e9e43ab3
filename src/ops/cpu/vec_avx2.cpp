#include "ops/cpu/vec_impl.hpp"

EMBER_DEFINE_VEC_KERNELS(avx2)
