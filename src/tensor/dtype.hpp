// Element types of GGUF tensors. The numeric values are the GGUF/ggml type ids on disk.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ember {

enum class DType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35,
  // Ember's own in-memory layouts, never read from or written to a file (dtype_info() does not
  // know them): Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K rows repacked 16 at a time for the dense
  // kernels (ops/cpu/r16/r16.hpp).
  Q4_0_R16 = 0x10002, Q4_1_R16 = 0x10003, Q5_0_R16 = 0x10006, Q8_0_R16 = 0x10008, Q4_K_R16 = 0x1000c, Q5_K_R16 = 0x1000d, Q6_K_R16 = 0x1000e,
  // Q4_0 / Q4_1 down projections transposed to neuron-major rows without requantizing: 4-bit
  // codes per row, the scales shared by 32 neurons in a table after the rows (ops/cpu/nm4/nm4.hpp);
  // the _NM8 forms hold those tables as u8 codes with an fp16 scale and base per 32 of them.
  Q4_0_NM = 0x20002, Q4_1_NM = 0x20003, Q4_0_NM8 = 0x20012, Q4_1_NM8 = 0x20013,
};

// A row of conversions: nb blocks of a type to floats, and floats to nb blocks (tensor/quant.hpp).
using BlocksToFloat = void (*)(const void* src, float* dst, int64_t nb);
using BlocksFromFloat = void (*)(const float* src, void* dst, int64_t nb);

// Everything Ember knows of a type, one row each (tensor/dtype.cpp, kTypes): its layout, and where
// Ember computes with it, the activations its dot products take, its 16-row repacked form, the
// file type of a file all of it, and its conversions. Ember's own in-memory layouts (ids from
// 0x10000) name the file type they are made from.
struct DTypeInfo {
  std::string_view name;
  int64_t block_size;   // elements per block
  size_t block_bytes;   // bytes per block
  std::optional<DType> dot = std::nullopt;       // the quantized activations its dot products take (ops/cpu/matmul)
  std::optional<DType> repacked = std::nullopt;  // its 16-row layout for the dense kernels (ops/cpu/r16)
  std::optional<DType> base = std::nullopt;      // an in-memory layout's file type
  int file_type = -1;                            // llama.cpp's llama_ftype of a file all of this type
  BlocksToFloat to_float = nullptr;
  BlocksFromFloat from_float = nullptr;
};

// Layout of a type id read from a file; nullopt for ids that no GGUF writer produces.
std::optional<DTypeInfo> dtype_info(uint32_t id);
const DTypeInfo& info(DType t);  // t must be a known type
inline std::string_view dtype_name(DType t) { return info(t).name; }
std::optional<DType> dtype_from_name(std::string_view name);  // case-insensitive: "q4_0", "F16"

// Bytes for n elements (n must be a multiple of the block size).
inline size_t row_bytes(DType t, int64_t n) {
  const DTypeInfo& i = info(t);
  return static_cast<size_t>(n / i.block_size) * i.block_bytes;
}

// Whether Ember has kernels (dequantize, dot products) for a file's type.
bool dtype_supported(DType t);
// The types of files Ember writes (`ember synth --type`): those with a file type and a quantizer.
bool dtype_writable(DType t);

}  // namespace ember
