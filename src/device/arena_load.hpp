// One loader for every device: it walks a device's arena layout (device_arena_layout) and writes
// each part through the device's ArenaWriter, which knows how its memory is written (a memcpy on
// the CPU stand-in; rows packed into CUDA's layout and copied up on CUDA), and returns the views
// the device computes with.
#pragma once
#include <cstdint>
#include <vector>

#include "device/device.hpp"
#include "model/blocks.hpp"

namespace ember {

// How a device writes its arena.
class ArenaWriter {
 public:
  virtual ~ArenaWriter() = default;
  // Whether the device holds the file's layout of attention, experts and the output head (its
  // own kernels read that), not the CPU's (which may be repacked: the stand-in runs the CPU's
  // kernels on them).
  virtual bool file_layout() const = 0;
  // Rows ids[0..n) of src (rows 0..n-1 where ids is null), one after another from `offset`, in the
  // device's layout.
  virtual void rows(const TensorView& src, const int32_t* ids, int64_t n, uint64_t offset) = 0;
  virtual void bytes(const void* src, size_t n, uint64_t offset) = 0;
  // The address of `offset` in the device's memory, for the views.
  virtual uint8_t* at(uint64_t offset) = 0;
};

// What a load put in the arena, as views there, per layer of the model (empty where the plan
// puts nothing of the layer on the device).
struct ArenaViews {
  std::vector<FfnWeights> shares;  // share_weights: the share's rows as an FFN of their own
  std::vector<TensorView> fc1, fc2;  // the predictors (fc2's rows in predictor_row_order)
  std::vector<LayerWeights> attn;    // the attention layers' tensors (attention_tensors, ffn_block_tensors)
  // A copy of each of the layer's gpu_experts (in their order) with gate, up and down in the arena.
  std::vector<std::vector<FfnWeights>> experts;
  OutputWeights out;  // the output head (Plan::output_gpu)
};

// Writes every part of `layout` (the FFN shares' rows, the predictors, the experts, the attention
// layers' tensors, the output head) through `w`. Checks the shares' row sizes against the plan's
// model and that the whole tensors it copies are contiguous, naming `device`.
ArenaViews load_arena(const Model& model, const DeviceLoad& d, const DeviceArenaLayout& layout, ArenaWriter& w,
                      const char* device);

}  // namespace ember
