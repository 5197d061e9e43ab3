// GGUF reader (versions 2 and 3, and PowerInfer's "PWRI" magic) over a memory-mapped file.
// Everything is validated before use: a malformed file gives an ember::Error naming the
// problem, never a crash or an out-of-bounds read. Tensor data is not copied.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/mmap_file.hpp"
#include "gguf/value.hpp"
#include "tensor/tensor_view.hpp"

namespace ember::gguf {

struct TensorInfo {
  std::string name;
  DType type;
  int n_dims;
  int64_t ne[4];
  uint64_t offset;  // relative to the data section
  size_t nbytes;
};

class Reader {
 public:
  // Opens and validates a file.
  explicit Reader(const std::string& path);
  // Validates an in-memory image (used by the fuzz tests). `data` must outlive the reader.
  Reader(const uint8_t* data, size_t size, std::string label = "<memory>");

  const std::string& path() const { return path_; }
  bool is_powerinfer() const { return powerinfer_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }
  size_t file_size() const { return size_; }
  // Asks the kernel to read the mapped file ahead (no-op for in-memory images).
  void prefetch() const {
    if (file_) file_->prefetch();
  }

  const std::map<std::string, Value>& metadata() const { return kv_; }
  const std::vector<std::string>& keys() const { return key_order_; }
  const Value* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  // Typed accessors. They throw if the key exists with an incompatible type; get_* throw
  // when the key is missing too, opt_* return nullopt.
  std::optional<int64_t> opt_int(const std::string& key) const;
  std::optional<double> opt_float(const std::string& key) const;
  std::optional<bool> opt_bool(const std::string& key) const;
  std::optional<std::string> opt_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<float> get_float_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;
  TensorView view(const TensorInfo& t) const;
  // View of a named tensor; an invalid (empty) view when absent.
  TensorView view(const std::string& name) const;
  const uint8_t* data() const { return base_; }
  // Whether p points into the file's bytes (a view still in the map, not copied out).
  bool contains(const void* p) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return base_ && b >= base_ && b < base_ + size_;
  }

 private:
  void parse();

  std::unique_ptr<MappedFile> file_;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool powerinfer_ = false;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::map<std::string, Value> kv_;
  std::vector<std::string> key_order_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace ember::gguf
