#include "core/mmap_file.hpp"

#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace ember {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  EMBER_CHECK(fd >= 0, "cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat '{}': {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("'{}' is not a regular file", path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("cannot map '{}': {}", path, std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::prefetch() const {
  if (data_) ::madvise(const_cast<uint8_t*>(data_), size_, MADV_WILLNEED);
}

namespace {
// The whole pages around [p, p + n).
std::pair<uintptr_t, uintptr_t> pages_around(const void* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return {reinterpret_cast<uintptr_t>(p) / page * page,
          (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page};
}
}  // namespace

size_t make_pages_private(const void* p, size_t n) {
  const auto [begin, end] = pages_around(p, n);
  if (end <= begin) return 0;
  void* at = reinterpret_cast<void*>(begin);
  const size_t len = end - begin;
  ::madvise(at, len, MADV_WILLNEED);
  if (::mprotect(at, len, PROT_READ | PROT_WRITE) != 0) return 0;  // not a private map: left as it is
#ifdef MADV_POPULATE_WRITE
  const bool populated = ::madvise(at, len, MADV_POPULATE_WRITE) == 0;
#else
  const bool populated = false;
#endif
  if (!populated) {  // kernels before 5.14: write each page's first byte back
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    for (uintptr_t q = begin; q < end; q += page) {
      volatile uint8_t* b = reinterpret_cast<volatile uint8_t*>(q);
      *b = *b;
    }
  }
  ::mprotect(at, len, PROT_READ);
  return len;
}

void read_pages_ahead(const void* p, size_t n) {
  const auto [begin, end] = pages_around(p, n);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
}

void pages_are_cold(const void* p, size_t n) {
  const auto [begin, end] = pages_around(p, n);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_COLD);
}

void advise_random_reads(const void* p, size_t n) {
  const auto [begin, end] = pages_around(p, n);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_RANDOM);
}

void release_mapped_pages(const void* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace ember
