#include "device/make_device.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "device/cpu/cpu_device.hpp"
#ifdef EMBER_HAS_CUDA
#include "device/cuda/cuda_device.hpp"
#include "ops/cuda/cuda_ops.hpp"
#endif

namespace ember {
namespace {

void check_kind(const std::string& kind) {
  EMBER_CHECK(kind == "auto" || kind == "cuda" || kind == "cpu",
              "unknown hybrid device '{}' (expected auto, cuda or cpu)", kind);
}

}  // namespace

std::unique_ptr<Device> make_device(const std::string& kind, int standin_threads, uint64_t standin_vram) {
  check_kind(kind);
#ifdef EMBER_HAS_CUDA
  if (kind != "cpu") {
    std::string why;
    if (cuda::available(&why)) {
      log_info("hybrid: device {} (CUDA)", cuda::device_name());
      return std::make_unique<CudaDevice>();
    }
    EMBER_CHECK(kind != "cuda", "hybrid device cuda: {}", why);
    log_warn("hybrid: no CUDA device ({}): a second CPU device stands in for the GPU; this run measures no GPU", why);
  }
#else
  EMBER_CHECK(kind != "cuda", "hybrid device cuda: this build has no CUDA backend (configure with a CUDA "
              "toolkit, EMBER_CUDA=ON)");
  if (kind == "auto")
    log_warn("hybrid: built without CUDA: a second CPU device stands in for the GPU; this run measures no GPU");
#endif
  return std::make_unique<CpuDevice>(standin_threads, standin_vram);
}

DeviceCaps device_kind_caps(const std::string& kind) {
  check_kind(kind);
  if (kind == "cuda") return cuda_caps();
#ifdef EMBER_HAS_CUDA
  if (kind == "auto" && cuda::available(nullptr)) return cuda_caps();
#endif
  return cpu_standin_caps();
}

}  // namespace ember
