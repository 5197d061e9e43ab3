// `ember inspect MODEL`: the header, every metadata key with its type and value, and the tensor
// table with totals per type; `--json` prints the same as one JSON object. `--verify` reads every
// value of every tensor instead and names those that are not finite (the loader checks only a
// matrix's first and last rows; a NaN scale in a middle block would otherwise show only as NaN
// logits at run time).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.hpp"
#include "core/error.hpp"
#include "gguf/reader.hpp"
#include "tensor/dtype.hpp"
#include "tensor/quant.hpp"

namespace ember::cli {
namespace {

// ordered: fields print in the order written (header first), not alphabetically.
using json = nlohmann::ordered_json;

std::string type_label(const gguf::Value& v) {
  if (v.type != gguf::ValueType::ARRAY) return gguf::value_type_name(v.type);
  return fmt::format("arr[{}]", gguf::value_type_name(v.elem_type));
}

std::string shape_string(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (int d = 0; d < t.n_dims; ++d) s += fmt::format("{}{}", d ? ", " : "", t.ne[d]);
  return s + "]";
}

int64_t n_elements(const gguf::TensorInfo& t) { return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]; }

std::string human_bytes(uint64_t n) {
  if (n >= (uint64_t{1} << 30)) return fmt::format("{:.2f} GiB", n / double(uint64_t{1} << 30));
  if (n >= (uint64_t{1} << 20)) return fmt::format("{:.2f} MiB", n / double(uint64_t{1} << 20));
  if (n >= (uint64_t{1} << 10)) return fmt::format("{:.2f} KiB", n / 1024.0);
  return fmt::format("{} B", n);
}

// max_items == 0: every array element.
json value_json(const gguf::Value& v, size_t max_items) {
  using gguf::ValueType;
  switch (v.type) {
    case ValueType::STRING: return v.s;
    case ValueType::BOOL: return v.i != 0;
    case ValueType::F32: {
      // The double nearest the float's shortest decimal form, so JSON shows 1e-05 rather than
      // 9.999999747378752e-06 (both read back as the same float).
      if (!std::isfinite(v.f)) return v.f;  // JSON has no inf/nan: null
      return std::strtod(fmt::format("{}", static_cast<float>(v.f)).c_str(), nullptr);
    }
    case ValueType::F64: return v.f;
    case ValueType::U64: return v.u();
    case ValueType::ARRAY: {
      json a = json::array();
      size_t n = max_items ? std::min(max_items, v.length()) : v.length();
      for (size_t k = 0; k < n; ++k) a.push_back(value_json(v.at(k), max_items));
      return a;
    }
    default: return v.i;
  }
}

struct Totals {
  int count = 0;
  int64_t elements = 0;
  uint64_t bytes = 0;
};

void run_inspect(const std::string& path, bool as_json, size_t max_items) {
  gguf::Reader r(path);
  std::map<std::string, Totals> per_type;
  Totals all;
  for (const auto& t : r.tensors()) {
    Totals& pt = per_type[std::string(dtype_name(t.type))];
    for (Totals* x : {&pt, &all}) {
      x->count += 1;
      x->elements += n_elements(t);
      x->bytes += t.nbytes;
    }
  }
  const char* magic = r.is_powerinfer() ? "PWRI" : "GGUF";

  if (as_json) {
    json out;
    out["path"] = path;
    out["magic"] = magic;
    out["version"] = r.version();
    out["alignment"] = r.alignment();
    out["n_tensors"] = r.tensors().size();
    out["n_kv"] = r.keys().size();
    out["data_offset"] = r.data_offset();
    out["file_size"] = r.file_size();
    json kvs = json::array();
    for (const auto& key : r.keys()) {
      const gguf::Value& v = *r.find(key);
      json e = {{"key", key}, {"type", gguf::value_type_name(v.type)}};
      if (v.type == gguf::ValueType::ARRAY) {
        e["elem_type"] = gguf::value_type_name(v.elem_type);
        e["length"] = v.length();
        e["truncated"] = max_items != 0 && v.length() > max_items;
      }
      e["value"] = value_json(v, max_items);
      kvs.push_back(std::move(e));
    }
    out["metadata"] = std::move(kvs);
    json ts = json::array();
    for (const auto& t : r.tensors()) {
      json shape = json::array();
      for (int d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
      ts.push_back({{"name", t.name},
                    {"type", std::string(dtype_name(t.type))},
                    {"shape", shape},
                    {"n_elements", n_elements(t)},
                    {"bytes", t.nbytes},
                    {"offset", t.offset},
                    {"file_offset", r.data_offset() + t.offset}});
    }
    out["tensors"] = std::move(ts);
    json totals = json::array();
    for (const auto& [name, x] : per_type)
      totals.push_back({{"type", name}, {"count", x.count}, {"n_elements", x.elements}, {"bytes", x.bytes}});
    out["totals"] = std::move(totals);
    out["total"] = {{"count", all.count}, {"n_elements", all.elements}, {"bytes", all.bytes}};
    // Metadata strings need not be valid UTF-8 (token pieces of byte-level vocabularies);
    // invalid bytes print as U+FFFD instead of aborting the dump.
    fmt::print("{}\n", out.dump(2, ' ', false, json::error_handler_t::replace));
    return;
  }

  fmt::print("file:        {}\n", path);
  fmt::print("magic:       {}{}\n", magic, r.is_powerinfer() ? " (PowerInfer)" : "");
  fmt::print("version:     {}\n", r.version());
  fmt::print("alignment:   {}\n", r.alignment());
  fmt::print("tensors:     {}\n", r.tensors().size());
  fmt::print("metadata:    {} keys\n", r.keys().size());
  fmt::print("data offset: {}\n", r.data_offset());
  fmt::print("file size:   {} ({})\n", r.file_size(), human_bytes(r.file_size()));

  fmt::print("\nmetadata ({} keys):\n", r.keys().size());
  size_t key_w = 3, type_w = 4;
  for (const auto& key : r.keys()) {
    key_w = std::max(key_w, key.size());
    type_w = std::max(type_w, type_label(*r.find(key)).size());
  }
  fmt::print("  {:<{}}  {:<{}}  {}\n", "key", key_w, "type", type_w, "value");
  for (const auto& key : r.keys()) {
    const gguf::Value& v = *r.find(key);
    fmt::print("  {:<{}}  {:<{}}  {}\n", key, key_w, type_label(v), type_w,
               v.to_string(max_items ? max_items : SIZE_MAX));
  }

  fmt::print("\ntensors ({}):\n", r.tensors().size());
  size_t name_w = 4, shape_w = 5;
  for (const auto& t : r.tensors()) {
    name_w = std::max(name_w, t.name.size());
    shape_w = std::max(shape_w, shape_string(t).size());
  }
  fmt::print("  {:<{}}  {:<7}  {:<{}}  {:>12}  {:>12}\n", "name", name_w, "type", "shape", shape_w, "bytes", "offset");
  for (const auto& t : r.tensors())
    fmt::print("  {:<{}}  {:<7}  {:<{}}  {:>12}  {:>12}\n", t.name, name_w, dtype_name(t.type), shape_string(t),
               shape_w, t.nbytes, t.offset);

  fmt::print("\ntotals:\n");
  fmt::print("  {:<7}  {:>7}  {:>14}  {:>14}\n", "type", "tensors", "elements", "bytes");
  for (const auto& [name, x] : per_type)
    fmt::print("  {:<7}  {:>7}  {:>14}  {:>14}  ({})\n", name, x.count, x.elements, x.bytes, human_bytes(x.bytes));
  fmt::print("  {:<7}  {:>7}  {:>14}  {:>14}  ({})\n", "all", all.count, all.elements, all.bytes,
             human_bytes(all.bytes));
}

// Every row of every tensor dequantized: the tensors holding values that are not finite, with
// their first such row. Throws ember::Error (exit 1) when there is one.
void run_verify(const std::string& path) {
  const gguf::Reader r(path);
  uint64_t total = 0, done = 0, next_report = 0;
  for (const auto& t : r.tensors()) total += t.nbytes;
  std::vector<float> scratch;
  size_t bad = 0, skipped = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& info : r.tensors()) {
    if (!dtype_supported(info.type)) {
      ++skipped;
      continue;
    }
    const TensorView t = r.view(info);
    int64_t bad_rows = 0, first = -1;
    for (int64_t row = 0; row < t.rows(); ++row)
      if (!row_finite(t.type, t.row(row), t.cols(), scratch)) {
        if (first < 0) first = row;
        ++bad_rows;
      }
    if (bad_rows) {
      ++bad;
      fmt::print("{}: {} of {} rows hold a value that is not finite (NaN or infinity); the first is row {}\n", info.name,
                 bad_rows, t.rows(), first);
    }
    done += info.nbytes;
    if (done >= next_report) {  // progress on stderr, every tenth
      fmt::print(stderr, "verify: {:.0f} % of {}\n", 100.0 * static_cast<double>(done) / std::max<uint64_t>(total, 1),
                 human_bytes(total));
      next_report = done + total / 10;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EMBER_CHECK(bad == 0, "{}: {} of {} tensors hold values that are not finite: the file is corrupt", path, bad,
              r.tensors().size());
  fmt::print("{}: every value of {} tensors ({}) is finite{} ({:.1f} s)\n", path, r.tensors().size() - skipped,
             human_bytes(total), skipped ? fmt::format("; {} of types Ember does not read were skipped", skipped) : "",
             secs);
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Print a GGUF file's header, metadata and tensor table");
  struct Opts {
    std::string path;
    bool json = false, verify = false;
    size_t max_items = 8;
  };
  auto opts = std::make_shared<Opts>();
  cmd->add_option("model", opts->path, "GGUF file")->required();
  cmd->add_flag("--json", opts->json, "Print as JSON");
  cmd->add_option("--max-items", opts->max_items, "Array elements shown per metadata array (0: all)")
      ->capture_default_str();
  cmd->add_flag("--verify", opts->verify,
                "Read every value of every tensor and name the tensors holding NaN or infinity (exit 1 if any)");
  cmd->callback([opts] { opts->verify ? run_verify(opts->path) : run_inspect(opts->path, opts->json, opts->max_items); });
}

}  // namespace ember::cli
