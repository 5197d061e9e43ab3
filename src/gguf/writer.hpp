// GGUF v3 writer: metadata in insertion order, tensors aligned. Used by `synth` and by the
// offline tools that write prepared models.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/value.hpp"
#include "tensor/dtype.hpp"

namespace ember::gguf {

class Writer {
 public:
  // `alignment`: a power of two up to 1 MiB; written as general.alignment when not 32.
  explicit Writer(size_t alignment = 32);

  void set_powerinfer_magic(bool on) { powerinfer_ = on; }
  // Sets (or replaces) a key. Setting general.alignment changes the alignment used.
  void set(const std::string& key, Value v);
  // Adds a tensor; `data` must hold exactly row_bytes(type, ne[0]) * rows bytes. Tensors are
  // written in the order they were added.
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne, std::vector<uint8_t> data);
  // A tensor whose bytes `produce` makes when the file is written (and drops right after), so
  // that a writer of a multi-gigabyte model holds one tensor at a time. `produce` must return
  // exactly row_bytes(type, ne[0]) * rows bytes.
  using Producer = std::function<std::vector<uint8_t>()>;
  void add_tensor_lazy(const std::string& name, DType type, const std::vector<int64_t>& ne, Producer produce);

  // Serializes to bytes / to a file (written to a temporary name, then renamed).
  std::vector<uint8_t> to_bytes() const;
  void write(const std::string& path) const;

  size_t n_tensors() const { return tensors_.size(); }
  // Bytes of the whole file as to_bytes() / write() would produce it.
  size_t file_size() const;

 private:
  std::vector<uint8_t> header_bytes() const;  // everything before the first tensor's data
  size_t padding(size_t n) const;
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
    size_t nbytes = 0;
    Producer produce;  // set for lazy tensors (data empty until written)
  };
  size_t check_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne) const;  // bytes
  std::vector<uint8_t> bytes_of(const Tensor& t) const;  // data, or what produce returns (checked)
  size_t alignment_;
  bool powerinfer_ = false;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace ember::gguf
