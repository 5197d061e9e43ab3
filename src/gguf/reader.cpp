#include "gguf/reader.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace ember::gguf {
namespace {

constexpr int kMaxArrayDepth = 4;
constexpr uint64_t kMaxTensors = 1u << 20;
constexpr uint64_t kMaxKeys = 1u << 20;
constexpr uint64_t kMaxNameLength = 1u << 16;
// Every decoded array element becomes a Value (about 90 bytes), so a length that the file's
// bytes could hold may still need many gigabytes. Real vocabularies have well under a million
// entries; these limits leave a wide margin and bound the memory a corrupt file can claim.
constexpr uint64_t kMaxArrayElements = uint64_t{1} << 24;
constexpr uint64_t kMaxMetadataValues = uint64_t{1} << 25;

// A bounds-checked cursor over the file's bytes.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n, const std::string& label) : p_(p), n_(n), label_(label) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }

  void need(size_t k, const char* what) const {
    if (k > remaining())
      fail("{}: file is truncated: reading {} needs {} bytes at offset {}, but only {} remain", label_, what, k,
           pos_, remaining());
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what, uint64_t max_len) {
    uint64_t len = read<uint64_t>(what);
    if (len > max_len || len > remaining())
      fail("{}: {} at offset {} claims length {}, which exceeds {} (file has {} bytes left)", label_, what,
           pos_ - 8, len, std::min<uint64_t>(max_len, remaining()), remaining());
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }
  const std::string& label() const { return label_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& label_;
};

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;  // at least the length prefix
    case ValueType::ARRAY: return 12;  // at least type + count
  }
  return 1;
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

Value read_value(Cursor& c, ValueType type, int depth, const std::string& key, uint64_t& budget) {
  Value v;
  v.type = type;
  switch (type) {
    case ValueType::U8: v.i = c.read<uint8_t>("u8 value"); break;
    case ValueType::I8: v.i = c.read<int8_t>("i8 value"); break;
    case ValueType::U16: v.i = c.read<uint16_t>("u16 value"); break;
    case ValueType::I16: v.i = c.read<int16_t>("i16 value"); break;
    case ValueType::U32: v.i = c.read<uint32_t>("u32 value"); break;
    case ValueType::I32: v.i = c.read<int32_t>("i32 value"); break;
    case ValueType::U64: v.i = static_cast<int64_t>(c.read<uint64_t>("u64 value")); break;
    case ValueType::I64: v.i = c.read<int64_t>("i64 value"); break;
    case ValueType::F32: v.f = c.read<float>("f32 value"); break;
    case ValueType::F64: v.f = c.read<double>("f64 value"); break;
    case ValueType::BOOL: {
      uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1) fail("{}: key '{}' has bool value {} (must be 0 or 1)", c.label(), key, b);
      v.i = b;
      break;
    }
    case ValueType::STRING: v.s = c.read_string("string value", UINT64_MAX); break;
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        fail("{}: key '{}' nests arrays deeper than {} levels", c.label(), key, kMaxArrayDepth);
      uint32_t et = c.read<uint32_t>("array element type");
      if (!valid_type(et)) fail("{}: key '{}' has an array of unknown value type {}", c.label(), key, et);
      uint64_t n = c.read<uint64_t>("array length");
      if (n > c.remaining() / scalar_size(static_cast<ValueType>(et)))
        fail("{}: key '{}' claims an array of {} elements, more than the {} bytes left can hold", c.label(), key,
             n, c.remaining());
      if (n > kMaxArrayElements || n > budget)
        fail("{}: key '{}' has an array of {} elements; Ember reads at most {} elements per array and {} in all",
             c.label(), key, n, kMaxArrayElements, kMaxMetadataValues);
      budget -= n;
      v.elem_type = static_cast<ValueType>(et);
      if (is_packed_scalar(v.elem_type)) {  // checked one by one, kept packed (Value::s)
        v.s.reserve(n * packed_size(v.elem_type));
        for (uint64_t k = 0; k < n; ++k) pack_scalar(v.s, read_value(c, v.elem_type, depth + 1, key, budget));
        break;
      }
      v.arr.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.arr.push_back(read_value(c, v.elem_type, depth + 1, key, budget));
      break;
    }
  }
  return v;
}

}  // namespace

Reader::Reader(const std::string& path) : file_(std::make_unique<MappedFile>(path)), path_(path) {
  base_ = file_->data();
  size_ = file_->size();
  parse();
}

Reader::Reader(const uint8_t* data, size_t size, std::string label)
    : path_(std::move(label)), base_(data), size_(size) {
  parse();
}

void Reader::parse() {
  Cursor c(base_, size_, path_);
  if (size_ < 4) fail("{}: file is too small to be GGUF ({} bytes)", path_, size_);
  char magic[4];
  std::memcpy(magic, base_, 4);
  if (std::memcmp(magic, "GGUF", 4) == 0) {
    powerinfer_ = false;
  } else if (std::memcmp(magic, "PWRI", 4) == 0) {
    powerinfer_ = true;
  } else {
    fail("{}: not a GGUF file (magic bytes {:02x} {:02x} {:02x} {:02x}, expected 'GGUF' or 'PWRI')", path_,
         static_cast<uint8_t>(magic[0]), static_cast<uint8_t>(magic[1]), static_cast<uint8_t>(magic[2]),
         static_cast<uint8_t>(magic[3]));
  }
  c.read<uint32_t>("magic");
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    fail("{}: unsupported GGUF version {} (Ember reads versions 2 and 3)", path_, version_);
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  if (n_tensors > kMaxTensors) fail("{}: absurd tensor count {}", path_, n_tensors);
  if (n_kv > kMaxKeys) fail("{}: absurd metadata count {}", path_, n_kv);
  // Each entry takes at least 24 (tensor) or 12 (metadata) bytes: a count the rest of the file
  // cannot hold is a cut file (or a corrupt count).
  if (n_tensors * 24 + n_kv * 12 > c.remaining())
    fail("{}: file is truncated (or its header corrupt): it declares {} metadata entries and {} tensors, whose tables "
         "need at least {} bytes, but only {} bytes follow the header ({} in all)", path_, n_kv, n_tensors,
         n_tensors * 24 + n_kv * 12, c.remaining(), size_);

  uint64_t value_budget = kMaxMetadataValues;
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("metadata key", kMaxNameLength);
    uint32_t t = c.read<uint32_t>("metadata value type");
    if (!valid_type(t)) fail("{}: key '{}' has unknown value type {}", path_, key, t);
    Value v = read_value(c, static_cast<ValueType>(t), 0, key, value_budget);
    if (kv_.count(key)) fail("{}: metadata key '{}' appears twice", path_, key);
    key_order_.push_back(key);
    kv_.emplace(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    if (!is_integer(a->type) || a->i <= 0 || a->i > (1 << 20) || (a->i & (a->i - 1)) != 0)
      fail("{}: general.alignment must be a power of two up to 1 MiB, got {}", path_, a->to_string());
    alignment_ = static_cast<size_t>(a->i);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo ti{};
    ti.name = c.read_string("tensor name", kMaxNameLength);
    uint32_t nd = c.read<uint32_t>("tensor dimension count");
    if (nd < 1 || nd > 4) fail("{}: tensor '{}' has {} dimensions (1 to 4 allowed)", path_, ti.name, nd);
    ti.n_dims = static_cast<int>(nd);
    int64_t n_el = 1;
    for (int d = 0; d < 4; ++d) ti.ne[d] = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      uint64_t ne = c.read<uint64_t>("tensor dimension");
      if (ne == 0 || ne > (uint64_t{1} << 40))
        fail("{}: tensor '{}' has dimension {} of size {}", path_, ti.name, d, ne);
      ti.ne[d] = static_cast<int64_t>(ne);
      if (__builtin_mul_overflow(n_el, ti.ne[d], &n_el) || n_el > (int64_t{1} << 42))
        fail("{}: tensor '{}' has too many elements", path_, ti.name);
    }
    uint32_t type = c.read<uint32_t>("tensor type");
    auto tinfo = dtype_info(type);
    if (!tinfo) fail("{}: tensor '{}' has unknown type id {}", path_, ti.name, type);
    ti.type = static_cast<DType>(type);
    if (ti.ne[0] % tinfo->block_size != 0)
      fail("{}: tensor '{}' of type {} has row length {}, not a multiple of the block size {}", path_, ti.name,
           tinfo->name, ti.ne[0], tinfo->block_size);
    ti.nbytes = static_cast<size_t>(n_el / tinfo->block_size) * tinfo->block_bytes;
    ti.offset = c.read<uint64_t>("tensor data offset");
    if (ti.offset % alignment_ != 0)
      fail("{}: tensor '{}' data offset {} is not a multiple of the alignment {}", path_, ti.name, ti.offset,
           alignment_);
    if (tensor_index_.count(ti.name)) fail("{}: tensor '{}' appears twice", path_, ti.name);
    tensor_index_[ti.name] = tensors_.size();
    tensors_.push_back(std::move(ti));
  }

  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_offset_ > size_)
    fail("{}: file is truncated: tensor data would start at {} but the file has {} bytes", path_, data_offset_,
         size_);
  size_t data_size = size_ > data_offset_ ? size_ - data_offset_ : 0;

  // Every tensor lies inside the data section and no two overlap.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail("{}: tensor '{}' data [{}, {}) lies outside the data section ({} bytes); the file is truncated or "
           "corrupt",
           path_, t.name, t.offset, t.offset + t.nbytes, data_size);
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const TensorInfo* a = by_offset[k - 1];
    const TensorInfo* b = by_offset[k];
    if (a->offset + a->nbytes > b->offset)
      fail("{}: tensors '{}' and '{}' overlap in the data section", path_, a->name, b->name);
  }
  // Each tensor fills its slot: the bytes up to the next tensor (or the file's end) are its data
  // and the alignment's padding, no more. A tensor whose type or shape was changed (F16 relabelled
  // Q4_0 reads a quarter of its bytes) leaves the rest of its slot unread.
  for (size_t k = 0; k < by_offset.size(); ++k) {
    const TensorInfo* a = by_offset[k];
    const uint64_t end = a->offset + a->nbytes;
    const uint64_t next = k + 1 < by_offset.size() ? by_offset[k + 1]->offset : data_size;
    if (next - end >= alignment_) {
      std::string dims = std::to_string(a->ne[0]);
      for (int d = 1; d < a->n_dims; ++d) dims += " x " + std::to_string(a->ne[d]);
      fail("{}: tensor '{}' ({} {}: {} bytes) is followed by {} bytes that no tensor holds{}: its type or shape does "
           "not match its data (the file is corrupt or was edited)", path_, a->name, dtype_name(a->type), dims,
           a->nbytes, next - end, k + 1 < by_offset.size() ? fmt::format(" before '{}'", by_offset[k + 1]->name)
                                                            : std::string(" before the end of the file"));
    }
  }
}

const Value* Reader::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::optional<int64_t> Reader::opt_int(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (!is_integer(v->type) && v->type != ValueType::BOOL)
    fail("{}: metadata '{}' should be an integer but is {}", path_, key, value_type_name(v->type));
  return v->i;
}

std::optional<double> Reader::opt_float(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (is_float(v->type)) return v->f;
  if (is_integer(v->type)) return static_cast<double>(v->i);
  fail("{}: metadata '{}' should be a number but is {}", path_, key, value_type_name(v->type));
}

std::optional<bool> Reader::opt_bool(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::BOOL && !is_integer(v->type))
    fail("{}: metadata '{}' should be a bool but is {}", path_, key, value_type_name(v->type));
  return v->i != 0;
}

std::optional<std::string> Reader::opt_string(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::STRING)
    fail("{}: metadata '{}' should be a string but is {}", path_, key, value_type_name(v->type));
  return v->s;
}

int64_t Reader::get_int(const std::string& key) const {
  auto v = opt_int(key);
  if (!v) fail("{}: required metadata '{}' is missing", path_, key);
  return *v;
}

double Reader::get_float(const std::string& key) const {
  auto v = opt_float(key);
  if (!v) fail("{}: required metadata '{}' is missing", path_, key);
  return *v;
}

std::string Reader::get_string(const std::string& key) const {
  auto v = opt_string(key);
  if (!v) fail("{}: required metadata '{}' is missing", path_, key);
  return *v;
}

namespace {
const Value& require_array(const Reader& r, const std::string& key) {
  const Value* v = r.find(key);
  if (!v) fail("{}: required metadata '{}' is missing", r.path(), key);
  if (v->type != ValueType::ARRAY) fail("{}: metadata '{}' should be an array", r.path(), key);
  return *v;
}
}  // namespace

std::vector<std::string> Reader::get_string_array(const std::string& key) const {
  const Value& v = require_array(*this, key);
  if (v.elem_type != ValueType::STRING) fail("{}: metadata '{}' should be an array of strings", path_, key);
  std::vector<std::string> out;
  out.reserve(v.length());
  for (const auto& e : v.arr) out.push_back(e.s);
  return out;
}

std::vector<float> Reader::get_float_array(const std::string& key) const {
  const Value& v = require_array(*this, key);
  std::vector<float> out;
  out.reserve(v.length());
  for (size_t k = 0; k < v.length(); ++k) {
    const Value e = v.at(k);
    if (is_float(e.type)) out.push_back(static_cast<float>(e.f));
    else if (is_integer(e.type)) out.push_back(static_cast<float>(e.i));
    else fail("{}: metadata '{}' should be an array of numbers", path_, key);
  }
  return out;
}

std::vector<int64_t> Reader::get_int_array(const std::string& key) const {
  const Value& v = require_array(*this, key);
  std::vector<int64_t> out;
  out.reserve(v.length());
  for (size_t k = 0; k < v.length(); ++k) {
    const Value e = v.at(k);
    if (!is_integer(e.type) && e.type != ValueType::BOOL) fail("{}: metadata '{}' should be an array of integers", path_, key);
    out.push_back(e.i);
  }
  return out;
}

const TensorInfo* Reader::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

TensorView Reader::view(const TensorInfo& t) const {
  TensorView v;
  v.name = t.name;
  v.type = t.type;
  v.n_dims = t.n_dims;
  for (int d = 0; d < 4; ++d) v.ne[d] = t.ne[d];
  v.data = base_ + data_offset_ + t.offset;
  v.nbytes = t.nbytes;
  return v;
}

TensorView Reader::view(const std::string& name) const {
  const TensorInfo* t = find_tensor(name);
  return t ? view(*t) : TensorView{};
}

}  // namespace ember::gguf
