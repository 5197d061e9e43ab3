// Writing Unicode code points as UTF-8, for every part that makes text (the tokenizer, the Jinja
// engine's string escapes, synthetic vocabularies).
#pragma once
#include <cstdint>
#include <string>

namespace ember {

// Appends the UTF-8 encoding of `cpt` (U+FFFD for values past U+10FFFF).
void append_utf8(std::string& out, uint32_t cpt);

}  // namespace ember
