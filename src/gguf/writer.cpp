#include "gguf/writer.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"

namespace ember::gguf {
namespace {

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  size_t n = out.size();
  out.resize(n + sizeof(T));
  std::memcpy(out.data() + n, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void put_value(std::vector<uint8_t>& out, const Value& v) {
  switch (v.type) {
    case ValueType::U8: put<uint8_t>(out, static_cast<uint8_t>(v.i)); break;
    case ValueType::I8: put<int8_t>(out, static_cast<int8_t>(v.i)); break;
    case ValueType::U16: put<uint16_t>(out, static_cast<uint16_t>(v.i)); break;
    case ValueType::I16: put<int16_t>(out, static_cast<int16_t>(v.i)); break;
    case ValueType::U32: put<uint32_t>(out, static_cast<uint32_t>(v.i)); break;
    case ValueType::I32: put<int32_t>(out, static_cast<int32_t>(v.i)); break;
    case ValueType::U64: put<uint64_t>(out, v.u()); break;
    case ValueType::I64: put<int64_t>(out, v.i); break;
    case ValueType::F32: put<float>(out, static_cast<float>(v.f)); break;
    case ValueType::F64: put<double>(out, v.f); break;
    case ValueType::BOOL: put<uint8_t>(out, v.i ? 1 : 0); break;
    case ValueType::STRING: put_string(out, v.s); break;
    case ValueType::ARRAY:
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, v.length());
      for (size_t k = 0; k < v.length(); ++k) {
        const Value e = v.at(k);
        if (e.type != v.elem_type) fail("GGUF writer: array element of type {} in an array of {}",
                                        value_type_name(e.type), value_type_name(v.elem_type));
        put_value(out, e);
      }
      break;
  }
}

void check_alignment(size_t a) {
  EMBER_CHECK(a >= 1 && a <= (size_t{1} << 20) && (a & (a - 1)) == 0,
              "GGUF writer: alignment must be a power of two up to 1 MiB, got {}", a);
}

}  // namespace

Writer::Writer(size_t alignment) : alignment_(alignment) { check_alignment(alignment); }

void Writer::set(const std::string& key, Value v) {
  if (key == "general.alignment") {
    EMBER_CHECK(is_integer(v.type) && v.i > 0, "GGUF writer: general.alignment must be a positive integer, got {}",
                v.to_string());
    check_alignment(static_cast<size_t>(v.i));
    alignment_ = static_cast<size_t>(v.i);
  }
  for (auto& [k, old] : kv_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  kv_.emplace_back(key, std::move(v));
}

size_t Writer::check_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne) const {
  EMBER_CHECK(!ne.empty() && ne.size() <= 4, "tensor '{}': 1 to 4 dimensions required", name);
  int64_t n = 1;
  for (int64_t d : ne) {
    EMBER_CHECK(d >= 1, "tensor '{}': dimension of size {} (must be at least 1)", name, d);
    EMBER_CHECK(!__builtin_mul_overflow(n, d, &n), "tensor '{}': too many elements", name);
  }
  EMBER_CHECK(ne[0] % info(type).block_size == 0, "tensor '{}': row length {} is not a multiple of {}'s block size",
              name, ne[0], dtype_name(type));
  for (const auto& t : tensors_) EMBER_CHECK(t.name != name, "tensor '{}' added twice", name);
  return row_bytes(type, ne[0]) * static_cast<size_t>(n / ne[0]);
}

void Writer::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne,
                        std::vector<uint8_t> data) {
  const size_t expect = check_tensor(name, type, ne);
  EMBER_CHECK(data.size() == expect, "tensor '{}': {} bytes given, {} expected", name, data.size(), expect);
  tensors_.push_back({name, type, ne, std::move(data), expect, nullptr});
}

void Writer::add_tensor_lazy(const std::string& name, DType type, const std::vector<int64_t>& ne, Producer produce) {
  const size_t expect = check_tensor(name, type, ne);
  EMBER_CHECK(produce != nullptr, "tensor '{}': no producer", name);
  tensors_.push_back({name, type, ne, {}, expect, std::move(produce)});
}

std::vector<uint8_t> Writer::bytes_of(const Tensor& t) const {
  if (!t.produce) return t.data;
  std::vector<uint8_t> b = t.produce();
  EMBER_CHECK(b.size() == t.nbytes, "tensor '{}': its producer made {} bytes, {} expected", t.name, b.size(), t.nbytes);
  return b;
}

std::vector<uint8_t> Writer::header_bytes() const {
  const char* magic = powerinfer_ ? "PWRI" : "GGUF";
  std::vector<uint8_t> out(magic, magic + 4);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  bool has_alignment = false;
  for (const auto& [k, v] : kv_) has_alignment |= k == "general.alignment";
  put<uint64_t>(out, kv_.size() + (alignment_ != 32 && !has_alignment ? 1 : 0));
  for (const auto& [k, v] : kv_) {
    put_string(out, k);
    put<uint32_t>(out, static_cast<uint32_t>(v.type));
    put_value(out, v);
  }
  if (alignment_ != 32 && !has_alignment) {
    put_string(out, "general.alignment");
    put<uint32_t>(out, static_cast<uint32_t>(ValueType::U32));
    put<uint32_t>(out, static_cast<uint32_t>(alignment_));
  }
  auto align = [&](size_t x) { return (x + alignment_ - 1) / alignment_ * alignment_; };
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(out, static_cast<uint64_t>(d));
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offset = align(offset + t.nbytes);
  }
  out.resize(align(out.size()), 0);
  return out;
}

size_t Writer::padding(size_t n) const { return (alignment_ - n % alignment_) % alignment_; }

size_t Writer::file_size() const {
  size_t n = header_bytes().size();
  for (const auto& t : tensors_) n += t.nbytes + padding(t.nbytes);
  return n;
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> out = header_bytes();
  for (const auto& t : tensors_) {
    if (t.produce) {
      const std::vector<uint8_t> b = bytes_of(t);
      out.insert(out.end(), b.begin(), b.end());
    } else {
      out.insert(out.end(), t.data.begin(), t.data.end());
    }
    out.resize(out.size() + padding(t.nbytes), 0);
  }
  return out;
}

void Writer::write(const std::string& path) const {
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  EMBER_CHECK(f, "cannot write '{}': {}", tmp, std::strerror(errno));
  // Streamed tensor by tensor: a multi-gigabyte model is never copied whole.
  std::vector<uint8_t> header = header_bytes();
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  static const uint8_t zeros[256] = {};
  for (const auto& t : tensors_) {
    if (!ok) break;
    if (t.produce) {
      std::vector<uint8_t> b;
      try {
        b = bytes_of(t);
      } catch (...) {
        std::fclose(f);
        std::remove(tmp.c_str());
        throw;
      }
      ok = std::fwrite(b.data(), 1, b.size(), f) == b.size();
    } else {
      ok = std::fwrite(t.data.data(), 1, t.data.size(), f) == t.data.size();
    }
    size_t pad = padding(t.nbytes);
    while (ok && pad > 0) {
      size_t k = pad < sizeof(zeros) ? pad : sizeof(zeros);
      ok = std::fwrite(zeros, 1, k, f) == k;
      pad -= k;
    }
  }
  int closed = std::fclose(f);
  if (!ok || closed != 0) {
    std::remove(tmp.c_str());
    fail("writing '{}' failed (disk full?)", path);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace ember::gguf
