// A fixed-size, 64-byte aligned, zero-initialized heap buffer. Allocated once (at load or the
// first use), never on the per-token path.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace ember {

template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { resize(n); }
  ~AlignedBuffer() { std::free(data_); }
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
    if (n <= size_) return;
    std::free(data_);
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!data_) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_), 0, bytes);
    size_ = n;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ember
