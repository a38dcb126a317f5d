// UTF-8: the one decoder (DecodeUtf8, with a policy for ill-formed bytes), the
// encoder (AppendUtf8) and the steps over continuation bytes that find where a
// code point starts. Every part of ftune that reads UTF-8 goes through these.
//
// Well-formed means what Unicode (and RFC 3629) says: no overlong forms, no
// surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no truncated or stray
// sequences. An ill-formed sequence is handled as the policy says:
//   kAssumeValid  the caller knows `s` is well-formed (a repaired text, a
//                 vocabulary string): only the lead byte is looked at, the
//                 fastest form. On ill-formed input the code point is
//                 unspecified, but nothing past the end of `s` is read.
//   kReplace      U+FFFD for each maximal ill-formed subpart (the Unicode and
//                 WHATWG practice, as Rust's from_utf8_lossy and JS's TextDecoder).
//   kEscapeByte   0xDC00 + the first byte, one byte at a time (Python's
//                 surrogateescape), so the bytes can be carried through.
// Under kReplace and kEscapeByte `valid` reports whether the sequence was
// well-formed, so a caller can also refuse ill-formed text or escape it its
// own way.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ft {

enum class Utf8Policy : uint8_t { kAssumeValid, kReplace, kEscapeByte };

// One decoded code point.
struct Utf8Char {
  uint32_t cp = 0;    // the code point, or what the policy gives for ill-formed bytes
  uint32_t len = 1;   // bytes consumed (1..4): the next code point starts at pos + len
  bool valid = true;  // well-formed (always true under kAssumeValid, which checks nothing)
};

// Whether `b` is a UTF-8 continuation byte (10xxxxxx).
inline bool IsUtf8Continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Byte length of the UTF-8 sequence that starts with `lead` as the lead byte
// says (1 for ASCII and stray bytes); no other byte is checked.
inline int Utf8SeqLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

namespace utf8_internal {

// kAssumeValid: decodes by the lead byte alone (p[0] >= 0x80), as
// Utf8SeqLength says; a sequence cut by the end of the text is its lead byte.
inline Utf8Char DecodeByLead(const uint8_t* p, size_t avail) {
  const uint32_t b0 = p[0];
  if (b0 >= 0xF0 && avail >= 4) {
    return {((b0 & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu), 4, true};
  }
  if (b0 >= 0xE0 && b0 < 0xF0 && avail >= 3) {
    return {((b0 & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu), 3, true};
  }
  if (b0 >= 0xC0 && b0 < 0xE0 && avail >= 2) return {((b0 & 0x1Fu) << 6) | (p[1] & 0x3Fu), 2, true};
  return {b0, 1, true};  // a stray continuation byte, or a cut sequence
}

// A well-formed sequence's length (its code point in *cp), or minus the length
// of its maximal ill-formed subpart.
inline int DecodeChecked(const uint8_t* p, size_t avail, uint32_t* cp) {
  const uint8_t b0 = p[0];
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return -1;
  }
  uint32_t v = b0 & (0x7Fu >> len);
  for (int k = 1; k < len; ++k) {
    const uint8_t lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
    if (static_cast<size_t>(k) >= avail || p[k] < lo_k || p[k] > hi_k) return -k;
    v = (v << 6) | (p[k] & 0x3Fu);
  }
  *cp = v;
  return len;
}

}  // namespace utf8_internal

// Decodes the code point that starts at byte `pos` of `s` (pos < s.size()).
inline Utf8Char DecodeUtf8(std::string_view s, size_t pos, Utf8Policy policy) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  if (p[0] < 0x80) return {p[0], 1, true};
  const size_t avail = s.size() - pos;
  if (policy == Utf8Policy::kAssumeValid) return utf8_internal::DecodeByLead(p, avail);
  uint32_t cp = 0;
  const int len = utf8_internal::DecodeChecked(p, avail, &cp);
  if (len > 0) return {cp, static_cast<uint32_t>(len), true};
  if (policy == Utf8Policy::kReplace) return {0xFFFD, static_cast<uint32_t>(-len), false};
  return {0xDC00u + p[0], 1, false};  // kEscapeByte
}

// Where the code point holding byte `pos` starts: steps back from `pos` over
// continuation bytes, but not below `floor`.
inline size_t Utf8CharStart(std::string_view s, size_t pos, size_t floor = 0) {
  while (pos > floor && IsUtf8Continuation(static_cast<uint8_t>(s[pos]))) --pos;
  return pos;
}

// The first byte at or after `pos` that is not a continuation byte (or s.size()).
inline size_t Utf8SkipContinuation(std::string_view s, size_t pos) {
  while (pos < s.size() && IsUtf8Continuation(static_cast<uint8_t>(s[pos]))) ++pos;
  return pos;
}

// Appends the UTF-8 encoding of `cp` (four bytes at most, so cp < 0x200000;
// surrogates are encoded as they are, in three bytes).
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace ft
