#include "common/untrusted_text.h"

#include <cstdio>

#include "common/utf8.h"

namespace ft {

namespace {

void AppendHex(const char* format, unsigned value, std::string* out) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), format, value);
  *out += buf;
}

}  // namespace

std::string EscapeControlChars(std::string_view text, size_t max_bytes) {
  const bool cut = max_bytes > 0 && text.size() > max_bytes;
  if (cut) text = text.substr(0, max_bytes);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const Utf8Char u = DecodeUtf8(text, i, Utf8Policy::kEscapeByte);
    if (c < 0x20 || c == 0x7F || !u.valid) {
      AppendHex("\\x%02x", c, &out);
    } else if (u.cp >= 0x80 && u.cp < 0xA0) {  // C1 control
      AppendHex("\\u%04x", u.cp, &out);
    } else {
      out.append(text.substr(i, u.len));
    }
    i += u.len;
  }
  if (cut) out += "...";
  return out;
}

}  // namespace ft
