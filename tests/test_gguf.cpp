// GGUF reader and writer: round trips of every value and tensor type, one regression case per
// kind of malformed file (each must give an ember::Error naming the problem), and a randomized
// mutation test (the reader either accepts a file whose tensors all lie inside the buffer, or
// throws ember::Error; nothing else).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <unistd.h>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"

using namespace ember;
using namespace ember::gguf;

namespace {

using Bytes = std::vector<uint8_t>;

// ---- helpers ------------------------------------------------------------------------------

std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

void add_pattern_tensor(Writer& w, const std::string& name, DType type, std::vector<int64_t> ne, uint32_t seed) {
  int64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
  w.add_tensor(name, type, ne, pattern_bytes(row_bytes(type, ne[0]) * rows, seed));
}

// Deep equality of two values as the file stores them (f32 compared after rounding to float).
::testing::AssertionResult same_value(const Value& a, const Value& b, const std::string& where) {
  if (a.type != b.type)
    return ::testing::AssertionFailure() << where << ": type " << value_type_name(a.type) << " vs "
                                         << value_type_name(b.type);
  switch (a.type) {
    case ValueType::F32:
      if (std::bit_cast<uint32_t>(static_cast<float>(a.f)) != std::bit_cast<uint32_t>(static_cast<float>(b.f)))
        return ::testing::AssertionFailure() << where << ": f32 " << a.f << " vs " << b.f;
      break;
    case ValueType::F64:
      if (std::bit_cast<uint64_t>(a.f) != std::bit_cast<uint64_t>(b.f))
        return ::testing::AssertionFailure() << where << ": f64 " << a.f << " vs " << b.f;
      break;
    case ValueType::STRING:
      if (a.s != b.s) return ::testing::AssertionFailure() << where << ": string '" << a.s << "' vs '" << b.s << "'";
      break;
    case ValueType::ARRAY:
      if (a.elem_type != b.elem_type) return ::testing::AssertionFailure() << where << ": element type differs";
      if (a.length() != b.length())
        return ::testing::AssertionFailure() << where << ": length " << a.length() << " vs " << b.length();
      for (size_t k = 0; k < a.length(); ++k) {
        auto r = same_value(a.at(k), b.at(k), where + "[" + std::to_string(k) + "]");
        if (!r) return r;
      }
      break;
    default:
      if (a.i != b.i) return ::testing::AssertionFailure() << where << ": int " << a.i << " vs " << b.i;
  }
  return ::testing::AssertionSuccess();
}

// Expects parsing `bytes` to throw ember::Error whose message contains `needle`.
void expect_error(const Bytes& bytes, const std::string& needle) {
  Bytes exact(bytes);  // exactly sized, so a sanitizer sees any read past the end
  try {
    Reader r(exact.data(), exact.size(), "bad.gguf");
    ADD_FAILURE() << "accepted a malformed file; expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected to contain: " << needle;
    EXPECT_NE(msg.find("bad.gguf"), std::string::npos) << "message does not name the file: " << msg;
  }
}

// Builds GGUF bytes by hand, field by field, for the malformed cases.
struct Raw {
  Bytes b;
  Raw& magic(const char* m = "GGUF") {
    b.insert(b.end(), m, m + 4);
    return *this;
  }
  Raw& u8(uint8_t v) { return put(v); }
  Raw& u32(uint32_t v) { return put(v); }
  Raw& u64(uint64_t v) { return put(v); }
  Raw& i32(int32_t v) { return put(v); }
  Raw& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  // header: magic, version, tensor count, kv count
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return magic().u32(version).u64(n_tensors).u64(n_kv);
  }
  Raw& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(uint32_t(ValueType::U32)).u32(v); }
  Raw& kv_str(const std::string& key, const std::string& v) {
    return str(key).u32(uint32_t(ValueType::STRING)).str(v);
  }
  // tensor info: name, dims, type, offset
  Raw& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Raw& align(size_t a = 32) {
    b.resize((b.size() + a - 1) / a * a, 0);
    return *this;
  }
  Raw& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
  template <class T>
  Raw& put(T v) {
    size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
    return *this;
  }
};

// A small valid file with metadata of several kinds and three tensors.
Writer small_writer() {
  Writer w;
  w.set("general.architecture", Value::str("llama"));
  w.set("general.name", Value::str("tiny"));
  w.set("llama.block_count", Value::u32(2));
  w.set("llama.rope.freq_base", Value::f32(10000.f));
  w.set("flag", Value::boolean(true));
  w.set("tokens", Value::strings({"a", "bc", ""}));
  w.set("scores", Value::floats({0.5f, -1.f}));
  add_pattern_tensor(w, "a", DType::F32, {8}, 1);
  add_pattern_tensor(w, "b", DType::Q4_0, {32, 2}, 2);
  add_pattern_tensor(w, "c", DType::F16, {16, 2}, 3);  // 64 bytes: no padding at the end
  return w;
}

}  // namespace

// ---- round trips ---------------------------------------------------------------------------

TEST(GgufRoundTrip, EveryValueType) {
  std::vector<std::pair<std::string, Value>> kvs = {
      {"u8.max", Value::make_int(ValueType::U8, 255)},
      {"u8.zero", Value::make_int(ValueType::U8, 0)},
      {"i8.min", Value::make_int(ValueType::I8, -128)},
      {"i8.max", Value::make_int(ValueType::I8, 127)},
      {"u16.max", Value::make_int(ValueType::U16, 65535)},
      {"i16.min", Value::make_int(ValueType::I16, -32768)},
      {"u32.max", Value::u32(UINT32_MAX)},
      {"i32.min", Value::i32(INT32_MIN)},
      {"i32.max", Value::i32(INT32_MAX)},
      {"u64.max", Value::u64(UINT64_MAX)},
      {"u64.big", Value::u64(uint64_t{1} << 63)},
      {"i64.min", Value::make_int(ValueType::I64, INT64_MIN)},
      {"i64.max", Value::make_int(ValueType::I64, INT64_MAX)},
      {"f32.pi", Value::f32(3.14159265f)},
      {"f32.tiny", Value::f32(std::numeric_limits<float>::denorm_min())},
      {"f32.inf", Value::f32(-std::numeric_limits<float>::infinity())},
      {"f32.negzero", Value::f32(-0.0f)},
      {"f64.e", Value::f64(2.718281828459045)},
      {"f64.max", Value::f64(std::numeric_limits<double>::max())},
      {"bool.true", Value::boolean(true)},
      {"bool.false", Value::boolean(false)},
      {"str.empty", Value::str("")},
      {"str.ascii", Value::str("hello world")},
      {"str.unicode", Value::str("h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\xA6\x80")},  // héllo 世界 🦀
      {"str.nul", Value::str(std::string("a\0b", 3))},
      {"str.newlines", Value::str("line1\nline2\r\n\t\"quoted\"")},
      {"str.long", Value::str(std::string(100000, 'x'))},
      {"\xE9\x8D\xB5.unicode.key", Value::u32(7)},
      {"arr.empty.u8", Value::array(ValueType::U8, {})},
      {"arr.empty.str", Value::array(ValueType::STRING, {})},
      {"arr.strings", Value::strings({"", "a", "\xF0\x9F\xA6\x80", std::string(300, 'z')})},
      {"arr.floats", Value::floats({1.f, -2.5f, 1e-30f})},
      {"arr.ints", Value::ints({INT32_MIN, 0, INT32_MAX})},
  };
  // One array of every scalar type.
  for (ValueType t : {ValueType::U8, ValueType::I8, ValueType::U16, ValueType::I16, ValueType::U32, ValueType::I32,
                      ValueType::U64, ValueType::I64, ValueType::BOOL}) {
    std::vector<Value> items;
    for (int64_t v : {0, 1, 0, 1, 1}) items.push_back(Value::make_int(t, v));
    kvs.push_back({std::string("arr.") + value_type_name(t), Value::array(t, items)});
  }
  kvs.push_back({"arr.f64", Value::array(ValueType::F64, {Value::f64(1.5), Value::f64(-1e300)})});
  // Nested arrays: arrays of arrays (of different element types and lengths), empty inner
  // arrays, and three levels deep.
  kvs.push_back({"arr.nested", Value::array(ValueType::ARRAY, {Value::ints({1, 2}), Value::strings({"x"}),
                                                              Value::array(ValueType::U8, {})})});
  kvs.push_back({"arr.nested.empty", Value::array(ValueType::ARRAY, {})});
  kvs.push_back({"arr.nested3", Value::array(ValueType::ARRAY, {Value::array(ValueType::ARRAY, {Value::floats({9.f})})})});

  Writer w;
  for (const auto& [k, v] : kvs) w.set(k, v);
  Bytes bytes = w.to_bytes();
  Reader r(bytes.data(), bytes.size());
  EXPECT_EQ(r.version(), 3u);
  EXPECT_FALSE(r.is_powerinfer());
  EXPECT_TRUE(r.tensors().empty());
  ASSERT_EQ(r.keys().size(), kvs.size());
  for (size_t k = 0; k < kvs.size(); ++k) {
    EXPECT_EQ(r.keys()[k], kvs[k].first) << "keys keep file order";
    const Value* v = r.find(kvs[k].first);
    ASSERT_NE(v, nullptr) << kvs[k].first;
    EXPECT_TRUE(same_value(kvs[k].second, *v, kvs[k].first));
    EXPECT_FALSE(v->to_string().empty());
  }
  EXPECT_EQ(r.find("u64.max")->u(), UINT64_MAX);
  EXPECT_EQ(r.get_string("str.unicode"), "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\xA6\x80");
  EXPECT_EQ(r.get_int("i16.min"), -32768);
  EXPECT_EQ(r.opt_bool("bool.true"), true);
  EXPECT_DOUBLE_EQ(r.get_float("f64.e"), 2.718281828459045);
  EXPECT_EQ(r.get_string_array("arr.strings").at(2), "\xF0\x9F\xA6\x80");
  EXPECT_EQ(r.get_int_array("arr.ints"), (std::vector<int64_t>{INT32_MIN, 0, INT32_MAX}));
  EXPECT_EQ(r.get_float_array("arr.floats").at(1), -2.5f);
  // Typed accessors reject a wrong type and a missing key with an error.
  EXPECT_THROW(r.get_int("str.ascii"), Error);
  EXPECT_THROW(r.get_string("u8.max"), Error);
  EXPECT_THROW(r.get_int("no.such.key"), Error);
  EXPECT_THROW(r.get_string_array("arr.ints"), Error);
  EXPECT_FALSE(r.opt_int("no.such.key").has_value());
}

// An array of scalars is kept packed as the file stores it (a prepared 7B file's per-neuron arrays
// have 458,752 entries: a Value each took 40 MiB an array), and reads back element by element.
TEST(GgufRoundTrip, LongScalarArraysStayPacked) {
  std::vector<int32_t> ids(100000);
  std::vector<float> freq(100000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 7919 % 100003) - 5, freq[i] = 1.0f / (i + 1);
  Writer w;
  w.set("ids", Value::ints(ids));
  w.set("freq", Value::floats(freq));
  w.set("flags", Value::array(ValueType::BOOL, {Value::boolean(true), Value::boolean(false)}));
  Bytes bytes = w.to_bytes();
  Reader r(bytes.data(), bytes.size());
  const Value* v = r.find("ids");
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(v->arr.empty());
  EXPECT_EQ(v->s.size(), ids.size() * sizeof(int32_t));
  EXPECT_EQ(v->length(), ids.size());
  EXPECT_EQ(v->at(12345).i, ids[12345]);
  EXPECT_EQ(v->at(12345).type, ValueType::I32);
  EXPECT_THROW(v->at(ids.size()), std::out_of_range);
  const std::vector<int64_t> back = r.get_int_array("ids");
  EXPECT_TRUE(std::equal(back.begin(), back.end(), ids.begin(), ids.end()));
  EXPECT_EQ(r.get_float_array("freq"), freq);
  EXPECT_EQ(r.find("flags")->at(0).i, 1);
  EXPECT_EQ(r.find("flags")->at(1).type, ValueType::BOOL);
  // Written again from the packed form, the same bytes.
  Writer again;
  for (const std::string& k : r.keys()) again.set(k, *r.find(k));
  EXPECT_EQ(again.to_bytes(), bytes);
}

TEST(GgufRoundTrip, TensorsOfSeveralTypesAndShapes) {
  struct Spec {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
  };
  std::vector<Spec> specs = {
      {"f32.1d", DType::F32, {7}},
      {"f16.2d", DType::F16, {3, 5}},
      {"bf16.4d", DType::BF16, {2, 3, 1, 2}},
      {"q4_0", DType::Q4_0, {64, 3}},
      {"q4_1", DType::Q4_1, {32, 1}},
      {"q8_0.3d", DType::Q8_0, {32, 2, 2}},
      {"q6_k", DType::Q6_K, {256, 1, 1, 2}},
      {"i32", DType::I32, {5}},
      {"blk.0.\xE2\x9C\x93.weight", DType::F32, {1}},
  };
  for (size_t alignment : {size_t{32}, size_t{1}, size_t{8}, size_t{64}, size_t{4096}}) {
    SCOPED_TRACE(alignment);
    Writer w(alignment);
    w.set("general.name", Value::str("t"));
    for (size_t k = 0; k < specs.size(); ++k) add_pattern_tensor(w, specs[k].name, specs[k].type, specs[k].ne, k);
    Bytes bytes = w.to_bytes();
    Reader r(bytes.data(), bytes.size());
    EXPECT_EQ(r.alignment(), alignment);
    EXPECT_EQ(r.data_offset() % alignment, 0u);
    EXPECT_EQ(r.file_size(), bytes.size());
    if (alignment != 32) {
      EXPECT_EQ(r.get_int("general.alignment"), static_cast<int64_t>(alignment));
    }
    ASSERT_EQ(r.tensors().size(), specs.size());
    for (size_t k = 0; k < specs.size(); ++k) {
      const TensorInfo& t = r.tensors()[k];
      EXPECT_EQ(t.name, specs[k].name);
      EXPECT_EQ(t.type, specs[k].type);
      EXPECT_EQ(t.n_dims, static_cast<int>(specs[k].ne.size()));
      int64_t rows = 1;
      for (int d = 0; d < 4; ++d) {
        int64_t expect = d < static_cast<int>(specs[k].ne.size()) ? specs[k].ne[d] : 1;
        EXPECT_EQ(t.ne[d], expect) << t.name << " dim " << d;
        if (d > 0) rows *= expect;
      }
      EXPECT_EQ(t.offset % alignment, 0u);
      TensorView v = r.view(specs[k].name);
      ASSERT_TRUE(v.valid());
      EXPECT_EQ(v.nbytes, row_bytes(specs[k].type, specs[k].ne[0]) * rows);
      EXPECT_EQ(v.rows(), rows);
      Bytes expect = pattern_bytes(v.nbytes, k);
      EXPECT_EQ(0, std::memcmp(v.data, expect.data(), v.nbytes)) << t.name;
      EXPECT_EQ((v.data - bytes.data()) % alignment, 0u);
      EXPECT_EQ(r.find_tensor(specs[k].name), &t);
    }
    EXPECT_FALSE(r.view("absent").valid());
    EXPECT_EQ(r.find_tensor("absent"), nullptr);
  }
}

TEST(GgufRoundTrip, AlignmentFromMetadataKey) {
  Writer w;
  w.set("general.alignment", Value::u32(256));
  add_pattern_tensor(w, "x", DType::F32, {3}, 1);
  add_pattern_tensor(w, "y", DType::F32, {5}, 2);
  Bytes bytes = w.to_bytes();
  Reader r(bytes.data(), bytes.size());
  EXPECT_EQ(r.alignment(), 256u);
  EXPECT_EQ(r.tensors()[1].offset, 256u);
  EXPECT_EQ(r.data_offset() % 256, 0u);
  EXPECT_EQ(0, std::memcmp(r.view("y").data, pattern_bytes(20, 2).data(), 20));
}

TEST(GgufRoundTrip, PowerInferMagic) {
  Writer w;
  w.set_powerinfer_magic(true);
  w.set("general.architecture", Value::str("llama"));
  add_pattern_tensor(w, "x", DType::F32, {4}, 1);
  Bytes bytes = w.to_bytes();
  ASSERT_EQ(0, std::memcmp(bytes.data(), "PWRI", 4));
  Reader r(bytes.data(), bytes.size());
  EXPECT_TRUE(r.is_powerinfer());
  EXPECT_EQ(r.get_string("general.architecture"), "llama");
  EXPECT_EQ(r.tensors().size(), 1u);
}

TEST(GgufRoundTrip, EmptyFileAndVersion2) {
  Writer w;
  Bytes bytes = w.to_bytes();
  Reader r(bytes.data(), bytes.size());
  EXPECT_TRUE(r.keys().empty());
  EXPECT_TRUE(r.tensors().empty());
  // Version 2 has the same layout as version 3 (64-bit counts).
  bytes[4] = 2;
  Reader r2(bytes.data(), bytes.size());
  EXPECT_EQ(r2.version(), 2u);
}

TEST(GgufRoundTrip, ThroughAFileOnDisk) {
  auto dir = std::filesystem::temp_directory_path() / ("ember_test_gguf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "small.gguf").string();
  Writer w = small_writer();
  w.write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  Bytes expect = w.to_bytes();
  EXPECT_EQ(std::filesystem::file_size(path), expect.size());
  {
    Reader r(path);
    EXPECT_EQ(r.path(), path);
    EXPECT_EQ(r.tensors().size(), 3u);
    EXPECT_EQ(0, std::memcmp(r.data(), expect.data(), expect.size()));
  }
  // Missing file, a directory and an empty file give errors naming the path.
  for (std::string bad : {(dir / "missing.gguf").string(), dir.string()}) {
    try {
      Reader r(bad);
      ADD_FAILURE() << "opened " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  std::string empty = (dir / "empty.gguf").string();
  std::ofstream(empty).close();
  EXPECT_THROW(Reader r(empty), Error);
  // Writing into a missing directory fails with an error, not a crash.
  EXPECT_THROW(w.write((dir / "no" / "such" / "dir.gguf").string()), Error);
  std::filesystem::remove_all(dir);
}

TEST(GgufWriter, RejectsInvalidInput) {
  Writer w;
  EXPECT_THROW(w.add_tensor("x", DType::F32, {}, {}), Error);
  EXPECT_THROW(w.add_tensor("x", DType::F32, {1, 1, 1, 1, 1}, Bytes(4)), Error);
  EXPECT_THROW(w.add_tensor("x", DType::F32, {0}, {}), Error);
  EXPECT_THROW(w.add_tensor("x", DType::F32, {-4}, {}), Error);
  EXPECT_THROW(w.add_tensor("x", DType::F32, {4, 0}, {}), Error);
  EXPECT_THROW(w.add_tensor("x", DType::F32, {4}, Bytes(15)), Error);
  EXPECT_THROW(w.add_tensor("x", DType::Q4_0, {16}, Bytes(9)), Error);
  w.add_tensor("x", DType::F32, {4}, Bytes(16));
  EXPECT_THROW(w.add_tensor("x", DType::F32, {4}, Bytes(16)), Error);
  EXPECT_THROW(Writer(0), Error);
  EXPECT_THROW(Writer(3), Error);
  EXPECT_THROW(w.set("general.alignment", Value::u32(48)), Error);
  EXPECT_THROW(w.set("general.alignment", Value::str("32")), Error);
  Writer mixed;
  mixed.set("arr", Value::array(ValueType::U8, {Value::u32(1)}));
  EXPECT_THROW(mixed.to_bytes(), Error);
}

// ---- malformed files -----------------------------------------------------------------------

TEST(GgufMalformed, TruncatedAtEveryByte) {
  Bytes full = small_writer().to_bytes();
  { Reader ok(full.data(), full.size()); }
  for (size_t len = 0; len < full.size(); ++len) {
    Bytes prefix(full.begin(), full.begin() + len);
    try {
      Reader r(prefix.data(), prefix.size(), "cut.gguf");
      ADD_FAILURE() << "accepted a file truncated to " << len << " of " << full.size() << " bytes";
    } catch (const Error& e) {
      std::string msg = e.what();
      bool names_it = msg.find("truncated") != std::string::npos || msg.find("too small") != std::string::npos ||
                      msg.find("bytes left") != std::string::npos || msg.find("outside") != std::string::npos ||
                      msg.find("absurd") != std::string::npos;
      EXPECT_TRUE(names_it) << "length " << len << ": " << msg;
    }
  }
}

TEST(GgufMalformed, BadMagic) {
  expect_error(Raw().magic("GGUX").u32(3).u64(0).u64(0).b, "not a GGUF file");
  expect_error(Raw().magic("FUGG").u32(3).u64(0).u64(0).b, "expected 'GGUF'");
  expect_error(Bytes{'G', 'G'}, "too small");
  expect_error(Bytes{}, "too small");
}

TEST(GgufMalformed, UnsupportedVersion) {
  expect_error(Raw().header(0, 0, 1).b, "unsupported GGUF version 1");
  expect_error(Raw().header(0, 0, 4).b, "unsupported GGUF version 4");
  expect_error(Raw().header(0, 0, 0x03000000).b, "unsupported GGUF version");  // big-endian file
}

TEST(GgufMalformed, AbsurdCounts) {
  expect_error(Raw().header(uint64_t{1} << 40, 0).zeros(64).b, "absurd tensor count");
  expect_error(Raw().header(UINT64_MAX, 0).zeros(64).b, "absurd tensor count");
  expect_error(Raw().header(0, uint64_t{1} << 40).zeros(64).b, "absurd metadata count");
  // More than the bytes can hold: a cut file (a model cut to 1000 bytes said "absurd tensor count").
  expect_error(Raw().header(0, 1000).zeros(64).b, "file is truncated (or its header corrupt): it declares 1000 metadata");
  expect_error(Raw().header(272, 3).zeros(900).b, "declares 3 metadata entries and 272 tensors");
}

TEST(GgufMalformed, AbsurdStringLength) {
  expect_error(Raw().header(0, 1).u64(UINT64_MAX).zeros(32).b, "metadata key");
  expect_error(Raw().header(0, 1).u64(uint64_t{1} << 20).zeros(32).b, "claims length");
  expect_error(Raw().header(0, 1).str("k").u32(uint32_t(ValueType::STRING)).u64(uint64_t{1} << 62).zeros(16).b,
               "string value");
  expect_error(Raw().header(1, 0).u64(uint64_t{1} << 33).zeros(64).b, "tensor name");
}

TEST(GgufMalformed, AbsurdArrayLength) {
  expect_error(Raw().header(0, 1).str("k").u32(uint32_t(ValueType::ARRAY)).u32(uint32_t(ValueType::U32))
                   .u64(UINT64_MAX).zeros(16).b,
               "claims an array of");
  expect_error(Raw().header(0, 1).str("k").u32(uint32_t(ValueType::ARRAY)).u32(uint32_t(ValueType::STRING))
                   .u64(1).u64(100).u8('a').b,
               "claims length 100");
}

// An array length that the bytes could hold but whose decoded form would take many gigabytes
// (every element becomes a Value) is refused instead of exhausting memory.
TEST(GgufMalformed, ArrayTooLongForMemory) {
  Raw raw;
  raw.header(0, 1).str("k").u32(uint32_t(ValueType::ARRAY)).u32(uint32_t(ValueType::U8)).u64(uint64_t{48} << 20);
  raw.zeros(uint64_t{48} << 20);
  expect_error(raw.b, "elements");
}

TEST(GgufMalformed, UnknownValueType) {
  expect_error(Raw().header(0, 1).str("k").u32(13).u32(0).b, "unknown value type 13");
  expect_error(Raw().header(0, 1).str("k").u32(uint32_t(ValueType::ARRAY)).u32(99).u64(0).b,
               "unknown value type 99");
}

TEST(GgufMalformed, BadDimensionCount) {
  expect_error(Raw().header(1, 0).tensor("t", {}, 0, 0).align().zeros(32).b, "has 0 dimensions");
  expect_error(Raw().header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).align().zeros(32).b, "has 5 dimensions");
}

TEST(GgufMalformed, ZeroDimension) {
  expect_error(Raw().header(1, 0).tensor("t", {4, 0}, 0, 0).align().zeros(32).b, "dimension 1 of size 0");
}

TEST(GgufMalformed, ElementCountOverflow) {
  uint64_t big = uint64_t{1} << 40;
  expect_error(Raw().header(1, 0).tensor("t", {big, big}, 0, 0).align().zeros(32).b, "too many elements");
  expect_error(Raw().header(1, 0).tensor("t", {big, 1, big, big}, 0, 0).align().zeros(32).b, "too many elements");
  expect_error(Raw().header(1, 0).tensor("t", {UINT64_MAX}, 0, 0).align().zeros(32).b, "of size");
}

TEST(GgufMalformed, UnknownTensorType) {
  expect_error(Raw().header(1, 0).tensor("t", {4}, 4, 0).align().zeros(32).b, "unknown type id 4");  // old Q4_2
  expect_error(Raw().header(1, 0).tensor("t", {4}, 99, 0).align().zeros(32).b, "unknown type id 99");
  expect_error(Raw().header(1, 0).tensor("t", {4}, UINT32_MAX, 0).align().zeros(32).b, "unknown type id");
}

TEST(GgufMalformed, RowNotMultipleOfBlock) {
  expect_error(Raw().header(1, 0).tensor("t", {48, 2}, uint32_t(DType::Q4_0), 0).align().zeros(64).b,
               "not a multiple of the block size 32");
  expect_error(Raw().header(1, 0).tensor("t", {128}, uint32_t(DType::Q6_K), 0).align().zeros(256).b,
               "not a multiple of the block size 256");
}

TEST(GgufMalformed, MisalignedOffset) {
  expect_error(Raw().header(1, 0).tensor("t", {4}, 0, 8).align().zeros(64).b, "not a multiple of the alignment 32");
  expect_error(Raw().header(1, 1).kv_u32("general.alignment", 64).tensor("t", {4}, 0, 32).align(64).zeros(128).b,
               "not a multiple of the alignment 64");
}

TEST(GgufMalformed, TensorDataOutOfRange) {
  expect_error(Raw().header(1, 0).tensor("t", {16}, 0, 0).align().zeros(32).b, "lies outside the data section");
  expect_error(Raw().header(1, 0).tensor("t", {4}, 0, 1024).align().zeros(32).b, "lies outside");
  expect_error(Raw().header(1, 0).tensor("t", {4}, 0, UINT64_MAX - 31).align().zeros(32).b, "lies outside");
  // The tensor table itself ends past the file (the header needs the data section to start
  // beyond the end).
  Bytes b = Raw().header(1, 0).tensor("t", {4}, 0, 0).b;
  expect_error(b, "truncated");
}

TEST(GgufMalformed, OverlappingTensors) {
  expect_error(Raw().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).align().zeros(128).b,
               "tensors 'a' and 'b' overlap");
  expect_error(Raw().header(2, 0).tensor("a", {4}, 0, 64).tensor("b", {4}, 0, 64).align().zeros(128).b, "overlap");
}

// A tensor whose type or shape no longer matches its data (an F16 tensor relabelled Q4_0 reads a
// quarter of its slot) leaves bytes no tensor holds: refused, naming the tensor and what follows.
TEST(GgufMalformed, TensorSmallerThanItsSlot) {
  // 'a': 64 F16 values = 128 bytes, relabelled Q4_0 (36 bytes), then 'b' at 128.
  expect_error(Raw().header(2, 0).tensor("a", {64}, uint32_t(DType::Q4_0), 0).tensor("b", {8}, 0, 128).align().zeros(160).b,
               "tensor 'a' (Q4_0 64: 36 bytes) is followed by 92 bytes that no tensor holds before 'b'");
  // The last tensor: the file goes on past its data and padding.
  expect_error(Raw().header(1, 0).tensor("t", {4}, 0, 0).align().zeros(64).b,
               "is followed by 48 bytes that no tensor holds before the end of the file");
  // Padding to the alignment is not a gap.
  Bytes ok = Raw().header(2, 0).tensor("a", {4}, 0, 0).tensor("b", {4}, 0, 32).align().zeros(48).b;
  Reader r(ok.data(), ok.size());
  EXPECT_EQ(r.tensors().size(), 2u);
}

TEST(GgufMalformed, DuplicateKey) {
  expect_error(Raw().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b, "metadata key 'k' appears twice");
}

TEST(GgufMalformed, DuplicateTensorName) {
  expect_error(Raw().header(2, 0).tensor("t", {4}, 0, 0).tensor("t", {4}, 0, 32).align().zeros(64).b,
               "tensor 't' appears twice");
}

TEST(GgufMalformed, BadBool) {
  expect_error(Raw().header(0, 1).str("b").u32(uint32_t(ValueType::BOOL)).u8(2).b, "bool value 2");
  expect_error(Raw().header(0, 1).str("b").u32(uint32_t(ValueType::ARRAY)).u32(uint32_t(ValueType::BOOL))
                   .u64(2).u8(1).u8(255).b,
               "bool value 255");
}

TEST(GgufMalformed, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u, 1u << 21, UINT32_MAX}) {
    SCOPED_TRACE(a);
    expect_error(Raw().header(0, 1).kv_u32("general.alignment", a).b, "general.alignment");
  }
  expect_error(Raw().header(0, 1).str("general.alignment").u32(uint32_t(ValueType::I32)).i32(-32).b,
               "general.alignment");
  expect_error(Raw().header(0, 1).kv_str("general.alignment", "32").b, "general.alignment");
  expect_error(Raw().header(0, 1).str("general.alignment").u32(uint32_t(ValueType::F32)).put(32.f).b,
               "general.alignment");
}

TEST(GgufMalformed, NestedArrayTooDeep) {
  auto nested = [](int depth) {
    Raw r;
    r.header(0, 1).str("deep").u32(uint32_t(ValueType::ARRAY));
    for (int d = 1; d < depth; ++d) r.u32(uint32_t(ValueType::ARRAY)).u64(1);
    r.u32(uint32_t(ValueType::U8)).u64(1).u8(7);
    return r.b;
  };
  {
    Bytes ok = nested(4);
    Reader r(ok.data(), ok.size());
    EXPECT_EQ(r.find("deep")->arr[0].arr[0].arr[0].at(0).i, 7);
  }
  expect_error(nested(5), "nests arrays deeper than 4");
  expect_error(nested(100), "nests arrays deeper");
}

// ---- regression inputs found by fuzzing ----------------------------------------------------

TEST(GgufMalformed, SavedCrashInputs) {
  auto dir = std::filesystem::path(EMBER_SOURCE_DIR) / "tests" / "data" / "gguf_malformed";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file() || entry.path().extension() == ".md") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    Bytes b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ++n;
    try {
      Reader r(b.data(), b.size());
      for (const auto& t : r.tensors()) {
        TensorView v = r.view(t);
        EXPECT_TRUE(v.data >= b.data() && v.data + v.nbytes <= b.data() + b.size()) << entry.path();
      }
    } catch (const Error&) {
    }
  }
  EXPECT_GT(n, 0);
}

// ---- randomized mutation -------------------------------------------------------------------

namespace {

Bytes sample_file(int which) {
  switch (which) {
    case 0:
      return small_writer().to_bytes();
    case 1: {
      Writer w(64);
      w.set_powerinfer_magic(true);
      w.set("nested", Value::array(ValueType::ARRAY, {Value::ints({1, 2, 3}), Value::strings({"p", "q"})}));
      w.set("u64", Value::u64(12345));
      w.set("f64", Value::f64(0.25));
      add_pattern_tensor(w, "q8", DType::Q8_0, {64, 2}, 5);
      add_pattern_tensor(w, "q6", DType::Q6_K, {256}, 6);
      add_pattern_tensor(w, "bf", DType::BF16, {3, 2, 2}, 7);
      return w.to_bytes();
    }
    default: {
      Writer w(8);
      for (int k = 0; k < 6; ++k) w.set("key." + std::to_string(k), Value::make_int(ValueType::I16, k));
      for (int k = 0; k < 5; ++k) add_pattern_tensor(w, "t" + std::to_string(k), DType::F16, {k + 1, 2}, k);
      return w.to_bytes();
    }
  }
}

// Parses `b` and checks the only two allowed outcomes.
void parse_or_error(const Bytes& b, uint64_t iteration) {
  Bytes exact(b);
  try {
    Reader r(exact.data(), exact.size(), "mutant");
    for (const auto& t : r.tensors()) {
      TensorView v = r.view(t);
      ASSERT_GE(v.data, exact.data()) << "iteration " << iteration;
      ASSERT_LE(v.data + v.nbytes, exact.data() + exact.size()) << "iteration " << iteration << " tensor " << t.name;
      ASSERT_EQ(v.nbytes, v.row_stride() * static_cast<size_t>(v.rows())) << "iteration " << iteration;
      ASSERT_GT(v.n_elements(), 0);
    }
    for (const auto& k : r.keys()) (void)r.find(k)->to_string();
  } catch (const Error&) {
    // fine
  } catch (const std::exception& e) {
    FAIL() << "iteration " << iteration << ": non-ember exception " << typeid(e).name() << ": " << e.what();
  }
}

}  // namespace

TEST(GgufMutation, RandomEditsNeverCrash) {
  const uint64_t extremes[] = {0,
                               1,
                               2,
                               31,
                               32,
                               33,
                               255,
                               UINT32_MAX,
                               uint64_t{1} << 32,
                               (uint64_t{1} << 40) + 1,
                               uint64_t{1} << 62,
                               uint64_t{1} << 63,
                               UINT64_MAX,
                               UINT64_MAX - 31};
  int accepted = 0, rejected = 0;
  for (int which = 0; which < 3; ++which) {
    const Bytes base = sample_file(which);
    // Most of the interesting structure is in the header; aim most edits there.
    size_t header_end;
    {
      Reader r(base.data(), base.size());
      header_end = r.data_offset();
    }
    std::mt19937_64 rng(1234 + which);
    for (uint64_t it = 0; it < 1500; ++it) {
      Bytes b = base;
      int n_edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < n_edits && !b.empty(); ++e) {
        size_t span = (rng() % 4 != 0 && header_end <= b.size()) ? header_end : b.size();
        size_t pos = rng() % span;
        switch (rng() % 6) {
          case 0: b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
          case 1: b[pos] = static_cast<uint8_t>(rng()); break;
          case 2: b.insert(b.begin() + pos, 1 + rng() % 8, static_cast<uint8_t>(rng())); break;
          case 3: b.erase(b.begin() + pos, b.begin() + std::min(b.size(), pos + 1 + rng() % 8)); break;
          case 4:
          case 5: {
            uint64_t v = extremes[rng() % std::size(extremes)];
            size_t width = (rng() % 2) ? 8 : 4;
            if (pos + width <= b.size()) std::memcpy(b.data() + pos, &v, width);
            break;
          }
        }
      }
      parse_or_error(b, it);
      if (HasFatalFailure()) return;
      try {
        Reader r(b.data(), b.size());
        ++accepted;
      } catch (const Error&) {
        ++rejected;
      }
    }
  }
  // Both outcomes occur, so the test exercises the accepting path too.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

// Overwrites each 8-byte-aligned and each 4-byte field position of the header, one at a time,
// with every extreme value.
TEST(GgufMutation, ExtremeFieldValuesAtEveryPosition) {
  const uint64_t extremes[] = {0, 1, UINT32_MAX, uint64_t{1} << 40, uint64_t{1} << 63, UINT64_MAX};
  for (int which = 0; which < 3; ++which) {
    const Bytes base = sample_file(which);
    Reader r0(base.data(), base.size());
    for (size_t pos = 0; pos + 4 <= r0.data_offset(); ++pos) {
      for (uint64_t v : extremes) {
        for (size_t width : {size_t{4}, size_t{8}}) {
          if (pos + width > base.size()) continue;
          Bytes b = base;
          std::memcpy(b.data() + pos, &v, width);
          parse_or_error(b, pos);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}
