#include "tensor/dtype.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "core/error.hpp"

namespace ember {
namespace {

struct Entry {
  uint32_t id;
  DTypeInfo info;
};

constexpr std::array kTypes = {
    Entry{0, {"F32", 1, 4}},        Entry{1, {"F16", 1, 2}},        Entry{2, {"Q4_0", 32, 18}},
    Entry{3, {"Q4_1", 32, 20}},     Entry{6, {"Q5_0", 32, 22}},     Entry{7, {"Q5_1", 32, 24}},
    Entry{8, {"Q8_0", 32, 34}},     Entry{9, {"Q8_1", 32, 36}},     Entry{10, {"Q2_K", 256, 84}},
    Entry{11, {"Q3_K", 256, 110}},  Entry{12, {"Q4_K", 256, 144}},  Entry{13, {"Q5_K", 256, 176}},
    Entry{14, {"Q6_K", 256, 210}},  Entry{15, {"Q8_K", 256, 292}},  Entry{16, {"IQ2_XXS", 256, 66}},
    Entry{17, {"IQ2_XS", 256, 74}}, Entry{18, {"IQ3_XXS", 256, 98}}, Entry{19, {"IQ1_S", 256, 50}},
    Entry{20, {"IQ4_NL", 32, 18}},  Entry{21, {"IQ3_S", 256, 110}}, Entry{22, {"IQ2_S", 256, 82}},
    Entry{23, {"IQ4_XS", 256, 136}}, Entry{24, {"I8", 1, 1}},       Entry{25, {"I16", 1, 2}},
    Entry{26, {"I32", 1, 4}},       Entry{27, {"I64", 1, 8}},       Entry{28, {"F64", 1, 8}},
    Entry{29, {"IQ1_M", 256, 56}},  Entry{30, {"BF16", 1, 2}},      Entry{34, {"TQ1_0", 256, 54}},
    Entry{35, {"TQ2_0", 256, 66}},
};

}  // namespace

std::optional<DTypeInfo> dtype_info(uint32_t id) {
  for (const auto& e : kTypes)
    if (e.id == id) return e.info;
  return std::nullopt;
}

const DTypeInfo& info(DType t) {
  // Same bytes per block as Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K, so row strides and sizes carry over.
  static constexpr DTypeInfo kQ4_0_R16{"Q4_0_R16", 32, 18}, kQ4_1_R16{"Q4_1_R16", 32, 20}, kQ8_0_R16{"Q8_0_R16", 32, 34},
      kQ5_0_R16{"Q5_0_R16", 32, 22}, kQ4_K_R16{"Q4_K_R16", 256, 144}, kQ5_K_R16{"Q5_K_R16", 256, 176},
      kQ6_K_R16{"Q6_K_R16", 256, 210};
  // Neuron-major 4-bit codes: 16 bytes per 32 values in a row; the shared scale table is extra.
  static constexpr DTypeInfo kQ4_0_NM{"Q4_0_NM", 32, 16}, kQ4_1_NM{"Q4_1_NM", 32, 16},
      kQ4_0_NM8{"Q4_0_NM8", 32, 16}, kQ4_1_NM8{"Q4_1_NM8", 32, 16};
  if (t == DType::Q4_0_NM) return kQ4_0_NM;
  if (t == DType::Q4_1_NM) return kQ4_1_NM;
  if (t == DType::Q4_0_NM8) return kQ4_0_NM8;
  if (t == DType::Q4_1_NM8) return kQ4_1_NM8;
  if (t == DType::Q5_K_R16) return kQ5_K_R16;
  if (t == DType::Q5_0_R16) return kQ5_0_R16;
  if (t == DType::Q4_0_R16) return kQ4_0_R16;
  if (t == DType::Q8_0_R16) return kQ8_0_R16;
  if (t == DType::Q4_1_R16) return kQ4_1_R16;
  if (t == DType::Q4_K_R16) return kQ4_K_R16;
  if (t == DType::Q6_K_R16) return kQ6_K_R16;
  for (const auto& e : kTypes)
    if (e.id == static_cast<uint32_t>(t)) return e.info;
  fail("unknown tensor type id {}", static_cast<uint32_t>(t));
}

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  for (const auto& e : kTypes)
    if (e.info.name == upper) return static_cast<DType>(e.id);
  return std::nullopt;
}

bool dtype_supported(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0:
    case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K:
    case DType::Q6_K: case DType::Q2_K: case DType::Q3_K:
      return true;
    default:
      return false;
  }
}

}  // namespace ember
