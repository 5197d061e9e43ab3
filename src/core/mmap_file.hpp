// A read-only memory-mapped file. Model weights are used in place (zero-copy) from the map.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ember {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Asks the kernel to read the whole file ahead (used before timing generation).
  void prefetch() const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Gives the whole pages inside [p, p + n) of a file's map back to the kernel: the file stays
// mapped, and a page is read again from the page cache if anything touches it later. Only for
// file-backed memory (anonymous memory would read back as zeros).
void release_mapped_pages(const void* p, size_t n);
// Makes the pages around [p, p + n) of a file's private map the process's own: read from the file
// (ahead, in large reads), then copied on write with the same bytes. Under a memory limit the
// kernel reclaims a file's pages from the page cache, but a private copy only to swap: these stay
// resident, at the same addresses. Returns the bytes of those pages.
size_t make_pages_private(const void* p, size_t n);
// Starts reading the pages around [p, p + n) of a file's map into the page cache (MADV_WILLNEED:
// one read for the range, whatever the map's advice) without waiting for them.
void read_pages_ahead(const void* p, size_t n);
// The pages around [p, p + n) of a file's map were read and will not be again soon (MADV_COLD):
// the kernel reclaims them before pages read later, which a page read twice (a fault, then a
// kernel's reads) would otherwise outlive.
void pages_are_cold(const void* p, size_t n);
// Reads of the pages around [p, p + n) of a file's map will come at random (MADV_RANDOM): a
// fault reads its page, no readahead around it.
void advise_random_reads(const void* p, size_t n);

}  // namespace ember
