// Buffers for weights and caches (core/huge_pages.hpp, core/aligned_buffer.hpp): alignment,
// zeroing and reuse, below and above the huge-page size.
#include "core/huge_pages.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include "core/aligned_buffer.hpp"
#include "core/mmap_file.hpp"

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

// A file's map made the process's own where it is kept resident (model/hot_rows.hpp): the whole
// pages around the range, the file's bytes unchanged, the map still read-only and the file on
// disk untouched.
TEST(MappedFile, PrivatePagesKeepTheFilesBytes) {
  const std::string path = ::testing::TempDir() + "ember_private_pages.bin";
  std::string bytes(5 * 4096 + 100, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  {
    MappedFile f(path);
    const size_t page = 4096;
    EXPECT_EQ(make_pages_private(f.data() + page + 10, 2 * page), 3 * page);  // pages 1, 2 and 3
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data()), f.size()), bytes);
    read_pages_ahead(f.data(), f.size());
    EXPECT_EQ(make_pages_private(f.data(), 0), 0u);
  }
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), bytes);
  std::remove(path.c_str());
}
