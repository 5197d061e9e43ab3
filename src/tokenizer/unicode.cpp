#include "tokenizer/unicode.hpp"

#include <algorithm>
#include <array>
#include <memory>

namespace ember::unicode {

namespace {

uint16_t lookup_runs(uint32_t cpt) {
  const CptRun* begin = kCptRuns;
  const CptRun* end = kCptRuns + kCptRunCount;
  const CptRun* it = std::upper_bound(begin, end, cpt, [](uint32_t c, const CptRun& r) { return c < r.first; });
  return it == begin ? static_cast<uint16_t>(kUndefined) : (it - 1)->flags;
}

// The Basic Multilingual Plane is looked up in a flat table (128 KiB), built once; the rest
// of the code space by binary search over the runs.
const std::vector<uint16_t>& bmp_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(0x10000);
    for (size_t i = 0; i < kCptRunCount; ++i) {
      uint32_t first = kCptRuns[i].first;
      if (first >= 0x10000) break;
      uint32_t last = i + 1 < kCptRunCount ? std::min<uint32_t>(kCptRuns[i + 1].first, 0x10000) : 0x10000;
      std::fill(t.begin() + first, t.begin() + last, kCptRuns[i].flags);
    }
    return t;
  }();
  return table;
}

struct ByteMaps {
  std::array<uint32_t, 256> to_cpt{};
  std::array<int16_t, 512> from_cpt{};  // every alphabet code point is below 0x144
};

const ByteMaps& byte_maps() {
  static const ByteMaps maps = [] {
    ByteMaps m;
    m.from_cpt.fill(-1);
    std::array<bool, 256> printable{};
    for (int b = 0x21; b <= 0x7E; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      uint32_t cpt = printable[b] ? static_cast<uint32_t>(b) : next++;
      m.to_cpt[b] = cpt;
      m.from_cpt[cpt] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return maps;
}

}  // namespace

uint16_t flags(uint32_t cpt) {
  if (cpt < 0x10000) return bmp_table()[cpt];
  if (cpt >= 0x110000) return kUndefined;
  return lookup_runs(cpt);
}

uint32_t decode_one(std::string_view s, size_t& pos) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  auto cont = [&](size_t i) { return i < s.size() && (byte(i) & 0xC0) == 0x80; };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  }
  if ((b0 & 0xE0) == 0xC0 && cont(pos + 1)) {
    uint32_t c = ((b0 & 0x1Fu) << 6) | (byte(pos + 1) & 0x3Fu);
    pos += 2;
    return c;
  }
  if ((b0 & 0xF0) == 0xE0 && cont(pos + 1) && cont(pos + 2)) {
    uint32_t c = ((b0 & 0x0Fu) << 12) | ((byte(pos + 1) & 0x3Fu) << 6) | (byte(pos + 2) & 0x3Fu);
    pos += 3;
    return c;
  }
  if ((b0 & 0xF8) == 0xF0 && cont(pos + 1) && cont(pos + 2) && cont(pos + 3)) {
    uint32_t c = ((b0 & 0x07u) << 18) | ((byte(pos + 1) & 0x3Fu) << 12) | ((byte(pos + 2) & 0x3Fu) << 6) |
                 (byte(pos + 3) & 0x3Fu);
    pos += 4;
    return c;
  }
  pos += 1;
  return kReplacement;
}

std::vector<uint32_t> decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) out.push_back(decode_one(s, pos));
  return out;
}

std::string encode(const std::vector<uint32_t>& cpts) {
  std::string out;
  out.reserve(cpts.size());
  for (uint32_t c : cpts) append_utf8(out, c);
  return out;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint32_t cpt = 0, min = 0;
    if (b < 0x80) n = 1, cpt = b;
    else if ((b & 0xe0) == 0xc0) n = 2, cpt = b & 0x1f, min = 0x80;
    else if ((b & 0xf0) == 0xe0) n = 3, cpt = b & 0x0f, min = 0x800;
    else if ((b & 0xf8) == 0xf0) n = 4, cpt = b & 0x07, min = 0x10000;
    else return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if ((c & 0xc0) != 0x80) return false;
      cpt = (cpt << 6) | (c & 0x3f);
    }
    if (n > 1 && (cpt < min || cpt > 0x10ffff || (cpt >= 0xd800 && cpt <= 0xdfff))) return false;
    i += n;
  }
  return true;
}

size_t incomplete_utf8_tail(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 0;
    if ((b & 0xE0) == 0xC0) need = 2;
    else if ((b & 0xF0) == 0xE0) need = 3;
    else if ((b & 0xF8) == 0xF0) need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

uint32_t byte_to_cpt(uint8_t byte) { return byte_maps().to_cpt[byte]; }

int cpt_to_byte(uint32_t cpt) { return cpt < 512 ? byte_maps().from_cpt[cpt] : -1; }

}  // namespace ember::unicode
