#include "model/ffn.hpp"

#include "ops/cpu/matmul.hpp"

namespace ember {

void dense_ffn(ThreadPool& pool, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n, float* out,
               float* gate_buf, float* up_buf, void* mm_scratch) {
  if (w.gate.type == w.up.type) {
    cpu::matmul_gated(pool, w.gate, w.up, act, x, n, gate_buf, up_buf, mm_scratch);
  } else {
    cpu::matmul(pool, w.gate, x, n, gate_buf, mm_scratch);
    cpu::matmul(pool, w.up, x, n, up_buf, mm_scratch);
    cpu::gated_activation(act, gate_buf, up_buf, gate_buf, n * w.gate.rows());
  }
  cpu::matmul(pool, w.down, gate_buf, n, out, mm_scratch);
}

}  // namespace ember
