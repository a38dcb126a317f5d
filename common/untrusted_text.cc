#include "common/untrusted_text.h"

#include <cstdio>

namespace ft {

namespace {

void AppendHex(const char* format, unsigned value, std::string* out) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), format, value);
  *out += buf;
}

// The length of the valid UTF-8 sequence starting at text[i] (2..4), or 0.
size_t Utf8Length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  const size_t n = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 && lead < 0xE0 ? 2 : 0;
  if (n == 0 || lead > 0xF4 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  if (lead == 0xE0 && byte(i + 1) < 0xA0) return 0;   // overlong
  if (lead == 0xED && byte(i + 1) >= 0xA0) return 0;  // surrogates
  if (lead == 0xF0 && byte(i + 1) < 0x90) return 0;   // overlong
  if (lead == 0xF4 && byte(i + 1) >= 0x90) return 0;  // past U+10FFFF
  return n;
}

}  // namespace

std::string EscapeControlChars(std::string_view text, size_t max_bytes) {
  const bool cut = max_bytes > 0 && text.size() > max_bytes;
  if (cut) text = text.substr(0, max_bytes);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7F) {
      AppendHex("\\x%02x", c, &out);
      ++i;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
    } else if (const size_t n = Utf8Length(text, i); n == 0) {
      AppendHex("\\x%02x", c, &out);
      ++i;
    } else if (c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {  // C1 control
      AppendHex("\\u%04x", static_cast<unsigned char>(text[i + 1]), &out);
      i += 2;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  if (cut) out += "...";
  return out;
}

}  // namespace ft
