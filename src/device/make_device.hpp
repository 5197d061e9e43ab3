// The device of a kind: "auto" (CUDA when built and a GPU is present, else the CPU stand-in),
// "cuda" or "cpu". Adding a device (ROCm, Metal, Vulkan) is a folder under device/ implementing
// device/device.hpp, its caps, and a kind here.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "device/device.hpp"

namespace ember {

// Throws naming why when `kind` is unknown or "cuda" cannot be had. standin_threads and
// standin_vram are the CPU stand-in's threads and the memory it reports (0: the host's available).
std::unique_ptr<Device> make_device(const std::string& kind, int standin_threads, uint64_t standin_vram);
// What the device of a kind runs and keeps, without making it (`ember plan`): "cuda" CUDA's caps
// in any build, "cpu" the stand-in's, "auto" the kind make_device would pick here.
DeviceCaps device_kind_caps(const std::string& kind);

}  // namespace ember
