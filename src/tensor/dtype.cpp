#include "tensor/dtype.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cctype>
#include <string>

#include "core/error.hpp"
#include "tensor/quant.hpp"

namespace ember {
namespace {

struct Entry {
  uint32_t id;  // a GGUF type id, or from 0x10000 an Ember in-memory layout (never in a file)
  DTypeInfo info;
};

constexpr uint32_t kFirstOwnId = 0x10000;
constexpr std::optional<DType> kF32 = DType::F32, kQ8_0 = DType::Q8_0, kQ8_1 = DType::Q8_1, kQ8_K = DType::Q8_K;

// Every type, one row: GGUF's (ggml's type ids and block layouts), then Ember's own layouts.
// For the types Ember computes with: the activations of their dot products, the 16-row form the
// dense kernels read (ops/cpu/r16/r16.hpp, same bytes a block as the file's so strides and sizes
// carry over), the llama_ftype an all-of-this-type file declares (Q3_K: Q3_K_S's, Q4_K: Q4_K_M's),
// and the row conversions (tensor/quant.hpp).
constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4, kF32, {}, {}, 0, &blocks::f32, &blocks::f32}},
    {1, {"F16", 1, 2, kF32, {}, {}, 1, &blocks::f16, &blocks::f16}},
    {2, {"Q4_0", 32, 18, kQ8_0, DType::Q4_0_R16, {}, 2, &blocks::q4_0, &blocks::q4_0}},
    {3, {"Q4_1", 32, 20, kQ8_1, DType::Q4_1_R16, {}, 3, &blocks::q4_1, &blocks::q4_1}},
    {6, {"Q5_0", 32, 22, kQ8_0, DType::Q5_0_R16, {}, 8, &blocks::q5_0, &blocks::q5_0}},
    {7, {"Q5_1", 32, 24, kQ8_1, {}, {}, 9, &blocks::q5_1, &blocks::q5_1}},
    {8, {"Q8_0", 32, 34, kQ8_0, DType::Q8_0_R16, {}, 7, &blocks::q8_0, &blocks::q8_0}},
    {9, {"Q8_1", 32, 36, {}, {}, {}, -1, &blocks::q8_1, &blocks::q8_1}},
    {10, {"Q2_K", 256, 84, kQ8_K, {}, {}, 10, &blocks::q2_k, &blocks::q2_k}},
    {11, {"Q3_K", 256, 110, kQ8_K, {}, {}, 11, &blocks::q3_k, &blocks::q3_k}},
    {12, {"Q4_K", 256, 144, kQ8_K, DType::Q4_K_R16, {}, 15, &blocks::q4_k, &blocks::q4_k}},
    {13, {"Q5_K", 256, 176, kQ8_K, DType::Q5_K_R16, {}, 17, &blocks::q5_k, &blocks::q5_k}},
    {14, {"Q6_K", 256, 210, kQ8_K, DType::Q6_K_R16, {}, 18, &blocks::q6_k, &blocks::q6_k}},
    {15, {"Q8_K", 256, 292, {}, {}, {}, -1, &blocks::q8_k, &blocks::q8_k}},
    {16, {"IQ2_XXS", 256, 66}},
    {17, {"IQ2_XS", 256, 74}},
    {18, {"IQ3_XXS", 256, 98}},
    {19, {"IQ1_S", 256, 50}},
    {20, {"IQ4_NL", 32, 18}},
    {21, {"IQ3_S", 256, 110}},
    {22, {"IQ2_S", 256, 82}},
    {23, {"IQ4_XS", 256, 136}},
    {24, {"I8", 1, 1}},
    {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},
    {27, {"I64", 1, 8}},
    {28, {"F64", 1, 8}},
    {29, {"IQ1_M", 256, 56}},
    {30, {"BF16", 1, 2, kF32, {}, {}, 32, &blocks::bf16, &blocks::bf16}},
    {34, {"TQ1_0", 256, 54}},
    {35, {"TQ2_0", 256, 66}},
    // Rows repacked 16 at a time (ops/cpu/r16/r16.hpp): the file type's activations.
    {0x10002, {"Q4_0_R16", 32, 18, kQ8_0, {}, DType::Q4_0}},
    {0x10003, {"Q4_1_R16", 32, 20, kQ8_1, {}, DType::Q4_1}},
    {0x10006, {"Q5_0_R16", 32, 22, kQ8_0, {}, DType::Q5_0}},
    {0x10008, {"Q8_0_R16", 32, 34, kQ8_0, {}, DType::Q8_0}},
    {0x1000c, {"Q4_K_R16", 256, 144, kQ8_K, {}, DType::Q4_K}},
    {0x1000d, {"Q5_K_R16", 256, 176, kQ8_K, {}, DType::Q5_K}},
    {0x1000e, {"Q6_K_R16", 256, 210, kQ8_K, {}, DType::Q6_K}},
    // Neuron-major 4-bit codes (ops/cpu/nm4/nm4.hpp): 16 bytes per 32 values in a row, the
    // shared scale table apart; read by the sparse axpy only.
    {0x20002, {"Q4_0_NM", 32, 16, {}, {}, DType::Q4_0}},
    {0x20003, {"Q4_1_NM", 32, 16, {}, {}, DType::Q4_1}},
    {0x20012, {"Q4_0_NM8", 32, 16, {}, {}, DType::Q4_0}},
    {0x20013, {"Q4_1_NM8", 32, 16, {}, {}, DType::Q4_1}},
};

// The row of an id, by a direct index (the matmul path asks per call): file ids 0..63 and Ember's
// own ids 0x10000 + c and 0x20000 + c (c < 64) map to one slot each.
const DTypeInfo* find(uint32_t id) {
  constexpr uint32_t kSlots = 64;
  const auto slot = [](uint32_t i) -> uint32_t {
    const uint32_t page = i >> 16, c = i & 0xFFFF;
    return page < 3 && c < kSlots ? page * kSlots + c : UINT32_MAX;
  };
  static const auto index = [&] {
    std::array<const DTypeInfo*, 3 * kSlots> t{};
    for (const auto& e : kTypes) t.at(slot(e.id)) = &e.info;
    return t;
  }();
  const uint32_t s = slot(id);
  return s < index.size() ? index[s] : nullptr;
}

}  // namespace

std::optional<DTypeInfo> dtype_info(uint32_t id) {
  const DTypeInfo* i = id < kFirstOwnId ? find(id) : nullptr;
  return i ? std::optional<DTypeInfo>(*i) : std::nullopt;
}

const DTypeInfo& info(DType t) {
  const DTypeInfo* i = find(static_cast<uint32_t>(t));
  if (!i) fail("unknown tensor type id {}", static_cast<uint32_t>(t));
  return *i;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  for (const auto& e : kTypes)
    if (e.id < kFirstOwnId && e.info.name == upper) return static_cast<DType>(e.id);
  return std::nullopt;
}

bool dtype_supported(DType t) {
  const auto i = dtype_info(static_cast<uint32_t>(t));
  return i && i->dot && i->to_float;
}

bool dtype_writable(DType t) { return dtype_supported(t) && info(t).file_type >= 0 && info(t).from_float; }

}  // namespace ember
