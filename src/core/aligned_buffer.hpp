// A fixed-size, 64-byte aligned, zero-initialized heap buffer. Allocated once (at load or the
// first use), never on the per-token path. Buffers of kHugeAllocMin bytes or more are backed by
// transparent huge pages where the kernel gives them (core/huge_pages.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/huge_pages.hpp"

namespace ember {

// p rounded up to the next 64-byte boundary (a scratch area carved out of a larger buffer).
inline uint8_t* align64(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { resize(n); }
  // Untouched: a large buffer's pages become resident as they are first written (alloc_zeroed).
  struct Untouched {};
  AlignedBuffer(size_t n, Untouched) { allocate(n, false); }
  ~AlignedBuffer() { free_zeroed(data_, size_ * sizeof(T)); }
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Reallocates (contents lost) only when n exceeds the current size.
  void resize(size_t n) {
    if (n > size_) allocate(n, true);
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  void allocate(size_t n, bool touch) {
    free_zeroed(data_, size_ * sizeof(T));
    data_ = nullptr, size_ = 0;
    data_ = static_cast<T*>(alloc_zeroed(n * sizeof(T), touch));
    if (!data_) throw std::bad_alloc();
    size_ = n;
  }

  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ember
