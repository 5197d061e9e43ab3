// Buffers for weights and caches (core/huge_pages.hpp, core/aligned_buffer.hpp): alignment,
// zeroing and reuse, below and above the huge-page size.
#include "core/huge_pages.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include "core/aligned_buffer.hpp"

using namespace ember;

namespace {

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

}  // namespace

TEST(HugePages, SmallBuffersAre64ByteAlignedAndZeroed) {
  for (size_t n : {size_t{1}, size_t{63}, size_t{4096}, kHugeAllocMin - 1}) {
    AlignedBuffer<uint8_t> b(n);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u) << n;
    EXPECT_TRUE(all_zero(b.data(), n)) << n;
  }
}

TEST(HugePages, LargeBuffersAreHugePageAlignedZeroedAndWritableToTheEnd) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under ASan every buffer stays on the heap";
#endif
  // Sizes that are and are not whole huge pages, and reuse of freed mappings.
  for (int round = 0; round < 2; ++round)
    for (size_t n : {kHugeAllocMin, kHugeAllocMin + 1, 3 * kHugePageBytes + 4097}) {
      AlignedBuffer<uint8_t> b(n);
      ASSERT_NE(b.data(), nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kHugePageBytes, 0u) << n;
      EXPECT_TRUE(all_zero(b.data(), n)) << n;
      for (size_t i = 0; i < n; i += 4096) b[i] = 0xA5;  // dirty it before the next round frees and maps again
      b[n - 1] = 0x5A;
      EXPECT_EQ(b[n - 1], 0x5A);
    }
}

TEST(HugePages, GrowingABufferReplacesItAndZeroesTheNewOne) {
  AlignedBuffer<float> b(1000);
  b[999] = 1.0f;
  b.resize(kHugeAllocMin);  // floats: 4x the bytes, a huge-page mapping
  EXPECT_EQ(b.size(), kHugeAllocMin);
  EXPECT_EQ(b[999], 0.0f);
  EXPECT_EQ(b[kHugeAllocMin - 1], 0.0f);
  b.resize(10);  // smaller: kept as it is
  EXPECT_EQ(b.size(), kHugeAllocMin);
  AlignedBuffer<float> moved(std::move(b));
  EXPECT_EQ(moved.size(), kHugeAllocMin);
  EXPECT_EQ(b.size(), 0u);
}

TEST(HugePages, ALargeBufferGetsHugePagesWhereTheKernelOffersThem) {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (mode.find("[always]") == std::string::npos && mode.find("[madvise]") == std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off here";
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under ASan every buffer stays on the heap";
#endif
  const size_t before = anon_huge_page_bytes();
  AlignedBuffer<uint8_t> b(8 * kHugePageBytes);
  for (size_t i = 0; i < b.size(); i += 4096) b[i] = 1;
  // At least one of the eight (the kernel may fall back to small pages where memory is
  // fragmented, but not for all of them on a machine with free memory).
  EXPECT_GE(anon_huge_page_bytes(), before + kHugePageBytes);
}
