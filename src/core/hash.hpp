// FNV-1a, 64 bits: a stable hash of short strings (synthetic tensors' seeds, the plan cache's
// keys, a served file's digest). Not for security.
#pragma once
#include <cstdint>
#include <string_view>

namespace ember {

constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;  // 14695981039346656037
constexpr uint64_t kFnv1aPrime = 0x100000001b3ull;

constexpr uint64_t fnv1a64(std::string_view s, uint64_t h = kFnv1aOffset) {
  for (unsigned char c : s) h = (h ^ c) * kFnv1aPrime;
  return h;
}

}  // namespace ember
