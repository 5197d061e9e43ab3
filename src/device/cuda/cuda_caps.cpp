// What the CUDA device runs, known in every build (a plan is checked against it anywhere).
#include "device/cuda/cuda_scratch.hpp"
#include "device/device.hpp"

namespace ember {

DeviceCaps cuda_caps() {
  // ops/cuda/ (matvec.cu, tiles.cu, axpy.cu, experts.cu): act(gate) * up over F32, F16, Q8_0, Q4_0,
  // Q4_1, Q5_0, Q5_1 and the K-quants' rows (FFN shares and a mixture's experts, whole; a 5-bit or
  // K-quant down's neuron-major rows are Q8_0);
  // ops/cuda/cuda_blocks.cu: the attention block (RMSNorm or LayerNorm, biases, q/k norms, RoPE,
  // sliding windows, post-norms, an F16 or F32 cache) with heads of up to 256 values.
  return {.name = "cuda",
          .attention = true,
          .parallel_residual = false,
          .max_head_dim = 256,
          .gatings = {FfnGating::par},
          .up_bias = false,
          .experts = true,
          .weight_types = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                           DType::Q4_K, DType::Q5_K, DType::Q6_K},
          .down_row_types = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1},
          .scratch = &cuda_scratch()};
}

}  // namespace ember
