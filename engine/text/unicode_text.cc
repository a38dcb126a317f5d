#include "engine/text/unicode_text.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <array>

namespace ft::text {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

struct ByteMaps {
  std::array<uint32_t, 256> to_unicode{};
  std::array<int16_t, 324> to_byte{};  // the map's code points are all < 324
};

const ByteMaps& Maps() {
  static const ByteMaps maps = [] {
    ByteMaps m;
    m.to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      m.to_unicode[b] = printable ? b : 256 + extra++;
      m.to_byte[m.to_unicode[b]] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return maps;
}

const UNormalizer2* Instance(NormForm form) {
  UErrorCode err = U_ZERO_ERROR;
  switch (form) {
    case NormForm::kNFC: return unorm2_getNFCInstance(&err);
    case NormForm::kNFD: return unorm2_getNFDInstance(&err);
    case NormForm::kNFKC: return unorm2_getNFKCInstance(&err);
    case NormForm::kNFKD: return unorm2_getNFKDInstance(&err);
  }
  return nullptr;
}

bool ToUtf16(std::string_view s, std::u16string* out) {
  UErrorCode err = U_ZERO_ERROR;
  out->resize(s.size() + 1);
  int32_t len = 0;
  u_strFromUTF8(out->data(), static_cast<int32_t>(out->size()), &len, s.data(),
                static_cast<int32_t>(s.size()), &err);
  if (U_FAILURE(err)) return false;
  out->resize(len);
  return true;
}

bool ToUtf8(const std::u16string& s, std::string* out) {
  UErrorCode err = U_ZERO_ERROR;
  out->resize(s.size() * 3 + 1);
  int32_t len = 0;
  u_strToUTF8(out->data(), static_cast<int32_t>(out->size()), &len, s.data(), static_cast<int32_t>(s.size()),
              &err);
  if (U_FAILURE(err)) return false;
  out->resize(len);
  return true;
}

bool IsNormalized(const UNormalizer2* n2, const std::u16string& s) {
  UErrorCode err = U_ZERO_ERROR;
  const UBool yes = unorm2_isNormalized(n2, s.data(), static_cast<int32_t>(s.size()), &err);
  return U_SUCCESS(err) && yes;
}

bool NormalizeUtf16(const UNormalizer2* n2, const std::u16string& in, std::u16string* out) {
  UErrorCode err = U_ZERO_ERROR;
  out->resize(in.size() * 4 + 8);  // the longest expansions are well below 4x (x18 only for rare NFKD chars)
  int32_t len = unorm2_normalize(n2, in.data(), static_cast<int32_t>(in.size()), out->data(),
                                 static_cast<int32_t>(out->size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    out->resize(len);
    len = unorm2_normalize(n2, in.data(), static_cast<int32_t>(in.size()), out->data(),
                           static_cast<int32_t>(out->size()), &err);
  }
  if (U_FAILURE(err)) return false;
  out->resize(len);
  return true;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // Skip ASCII eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Utf8Char c = DecodeUtf8(s, i, Utf8Policy::kReplace);
    if (!c.valid) return false;
    i += c.len;
  }
  return true;
}

std::string Utf8Lossy(std::string_view bytes) {
  if (IsValidUtf8(bytes)) return std::string(bytes);
  return MakeAlignedText(bytes, 0, false).text;
}

uint32_t ByteToUnicode(uint8_t b) { return Maps().to_unicode[b]; }

int UnicodeToByte(uint32_t cp) { return cp < Maps().to_byte.size() ? Maps().to_byte[cp] : -1; }

bool ByteLevelToBytes(std::string_view token, std::string* out) {
  out->clear();
  size_t i = 0;
  while (i < token.size()) {
    const int b = UnicodeToByte(NextCodePoint(token, &i));
    if (b < 0) return false;
    out->push_back(static_cast<char>(b));
  }
  return true;
}

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) AppendUtf8(ByteToUnicode(b), &out);
  return out;
}

bool IsWhiteSpace(uint32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

bool IsWordChar(uint32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  }
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  switch (u_charType(c)) {
    case U_NON_SPACING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_CONNECTOR_PUNCTUATION: return true;
    default: return false;
  }
}

void AlignedText::MaterializeAlignment() {
  if (!track || !align.empty() || text.empty()) return;
  align.resize(text.size());
  for (size_t i = 0; i < text.size(); ++i) align[i] = Src(i);
}

AlignedText AlignedText::Slice(size_t b, size_t e) const {
  AlignedText out;
  out.track = track;
  out.text.assign(text, b, e - b);
  if (align.empty()) {
    out.base = base + static_cast<int64_t>(b);
  } else if (track) {
    out.align.assign(align.begin() + b, align.begin() + e);
  }
  return out;
}

void AlignedText::AppendFrom(const AlignedText& other, size_t b, size_t e) {
  if (track) {
    MaterializeAlignment();
    // An empty text has no alignment yet; appending keeps it explicit from here.
    for (size_t i = b; i < e; ++i) align.push_back(other.Src(i));
  }
  text.append(other.text, b, e - b);
}

void AlignedText::AppendWithSrc(std::string_view bytes, SrcRange r) {
  if (track) {
    MaterializeAlignment();
    align.insert(align.end(), bytes.size(), r);
  }
  text.append(bytes);
}

AlignedText MakeAlignedText(std::string_view s, int64_t base, bool track) {
  AlignedText out;
  out.track = track;
  out.base = base;
  if (IsValidUtf8(s)) {
    out.text.assign(s);
    return out;
  }
  size_t i = 0;
  out.text.reserve(s.size() + 8);
  if (track) out.align.reserve(s.size() + 8);
  while (i < s.size()) {
    const Utf8Char c = DecodeUtf8(s, i, Utf8Policy::kReplace);
    const int64_t at = base + static_cast<int64_t>(i);
    if (c.valid) {
      out.text.append(s.substr(i, c.len));
      if (track) {
        for (uint32_t k = 0; k < c.len; ++k) out.align.push_back({at + k, at + k + 1});
      }
    } else {
      out.text.append(kReplacement);
      if (track) out.align.insert(out.align.end(), 3, SrcRange{at, at + c.len});
    }
    i += c.len;
  }
  return out;
}

bool Normalize(NormForm form, AlignedText* t) {
  const std::string& s = t->text;
  // Code points below U+0300 are NFC-stable and compose with nothing before
  // them; ASCII is stable under every form.
  const uint8_t stable_below = form == NormForm::kNFC ? 0xCC : 0x80;
  bool all_stable = true;
  for (unsigned char c : s) {
    if (c >= stable_below) {
      all_stable = false;
      break;
    }
  }
  if (all_stable) return true;
  const UNormalizer2* n2 = Instance(form);
  std::u16string u16;
  if (n2 == nullptr || !ToUtf16(s, &u16)) return false;
  if (IsNormalized(n2, u16)) return true;

  // Normalize chunk by chunk, a chunk ending before each character that has a
  // normalization boundary before it: chunks normalize independently, and each
  // output chunk is attributed to its input chunk.
  AlignedText out;
  out.track = t->track;
  out.text.reserve(s.size() + s.size() / 4);
  std::u16string chunk16, norm16;
  std::string norm8;
  size_t chunk_begin = 0, i = 0;
  auto flush = [&](size_t chunk_end) -> bool {
    if (chunk_end == chunk_begin) return true;
    const std::string_view chunk = std::string_view(s).substr(chunk_begin, chunk_end - chunk_begin);
    if (!ToUtf16(chunk, &chunk16)) return false;
    if (IsNormalized(n2, chunk16)) {
      out.AppendFrom(*t, chunk_begin, chunk_end);
    } else {
      if (!NormalizeUtf16(n2, chunk16, &norm16) || !ToUtf8(norm16, &norm8)) return false;
      out.AppendWithSrc(norm8, t->SrcSpan(chunk_begin, chunk_end));
    }
    chunk_begin = chunk_end;
    return true;
  };
  while (i < s.size()) {
    const size_t at = i;
    const uint32_t cp = NextCodePoint(s, &i);
    if (at > chunk_begin && unorm2_hasBoundaryBefore(n2, static_cast<UChar32>(cp))) {
      if (!flush(at)) return false;
    }
  }
  if (!flush(s.size())) return false;
  *t = std::move(out);
  return true;
}

void Lowercase(AlignedText* t) {
  const std::string& s = t->text;
  AlignedText out;
  out.track = t->track;
  out.text.reserve(s.size());
  std::string lower8;
  UChar in16[2], out16[8];
  size_t i = 0;
  while (i < s.size()) {
    const size_t at = i;
    const uint32_t cp = NextCodePoint(s, &i);
    if (cp < 0x80) {
      const char c = static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
      out.AppendWithSrc(std::string_view(&c, 1), t->Src(at));
      continue;
    }
    int32_t n16 = 0;
    U16_APPEND_UNSAFE(in16, n16, static_cast<UChar32>(cp));
    UErrorCode err = U_ZERO_ERROR;
    const int32_t len = u_strToLower(out16, 8, in16, n16, "", &err);
    lower8.clear();
    if (U_FAILURE(err)) {
      lower8.assign(s, at, i - at);
    } else {
      for (int32_t k = 0; k < len;) {
        UChar32 c;
        U16_NEXT(out16, k, len, c);
        AppendUtf8(static_cast<uint32_t>(c), &lower8);
      }
    }
    if (lower8 == std::string_view(s).substr(at, i - at)) {
      out.AppendFrom(*t, at, i);
    } else {
      out.AppendWithSrc(lower8, t->SrcSpan(at, i));
    }
  }
  *t = std::move(out);
}

}  // namespace ft::text
