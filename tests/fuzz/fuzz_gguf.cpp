// libFuzzer target for the GGUF reader: every input must either parse, with every tensor view
// inside the input, or throw ember::Error. Anything else (a crash, a sanitizer report, another
// exception type) is a bug. Built and run by scripts/fuzz_gguf.sh; not part of the test suite
// (crashers it finds go to tests/data/gguf_malformed/, which the suite replays).
#include <cstdint>
#include <cstdlib>
#include <cstdio>

#include "core/error.hpp"
#include "gguf/reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ember::gguf::Reader r(data, size, "fuzz");
    for (const auto& t : r.tensors()) {
      ember::TensorView v = r.view(t);
      if (v.data < data || v.data + v.nbytes > data + size || v.nbytes != v.row_stride() * size_t(v.rows())) {
        std::fprintf(stderr, "tensor '%s' lies outside the input\n", t.name.c_str());
        std::abort();
      }
    }
    for (const auto& k : r.keys()) (void)r.find(k)->to_string();
    (void)r.opt_int("general.alignment");
  } catch (const ember::Error&) {
  }
  return 0;
}
