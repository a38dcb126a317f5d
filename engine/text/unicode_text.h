// Unicode text helpers for the tokenizer: UTF-8 validation and repair, the
// GPT-2 byte<->unicode map of byte-level BPE, Unicode normalization forms
// (through ICU), and the character classes Hugging Face tokenizers use.
//
// AlignedText carries, for every byte of a transformed text, the byte range of
// the original input it came from, so token offsets survive normalization.
// Tracking is optional: without it the helpers do no alignment work at all.
//
// Thread safety: free functions are reentrant; AlignedText is a value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/utf8.h"

namespace ft::text {

// ---- UTF-8 -----------------------------------------------------------------
// The decoder, encoder and lead-byte length are common/utf8.h's.
using ::ft::AppendUtf8;
using ::ft::Utf8SeqLength;

// Decodes the code point at s[*i] (s must be valid UTF-8) and advances *i.
inline uint32_t NextCodePoint(std::string_view s, size_t* i) {
  const Utf8Char c = DecodeUtf8(s, *i, Utf8Policy::kAssumeValid);
  *i += c.len;
  return c.cp;
}

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or values > U+10FFFF).
bool IsValidUtf8(std::string_view s);

// `bytes` with every ill-formed sequence replaced by U+FFFD, one per maximal
// subpart (the Unicode/WHATWG practice, same as Rust's from_utf8_lossy and JS's
// TextDecoder).
std::string Utf8Lossy(std::string_view bytes);

// ---- GPT-2 byte-level map ----------------------------------------------------
// The code point byte-level BPE uses for byte `b` ('Ġ' for ' ', ...).
uint32_t ByteToUnicode(uint8_t b);
// Inverse: the byte behind code point `cp`, or -1 when `cp` is not in the map.
int UnicodeToByte(uint32_t cp);
// Decodes a byte-level token string ("Ġhello") into raw bytes (" hello").
// Returns false when a character is outside the map.
bool ByteLevelToBytes(std::string_view token, std::string* out);
// Encodes raw bytes into the byte-level alphabet.
std::string BytesToByteLevel(std::string_view bytes);

// ---- character classes --------------------------------------------------------
// Unicode White_Space (Rust's char::is_whitespace, Oniguruma's \s).
bool IsWhiteSpace(uint32_t cp);
// Rust regex's \w: Alphabetic, marks, decimal digits, connector punctuation, Join_Control.
bool IsWordChar(uint32_t cp);

// ---- aligned text ---------------------------------------------------------------
struct SrcRange {
  int64_t begin = 0;
  int64_t end = 0;
};

struct AlignedText {
  std::string text;
  // Original byte range of each byte of `text`. Empty while text is an
  // unmodified slice of the original: then byte i came from [base+i, base+i+1).
  std::vector<SrcRange> align;
  int64_t base = 0;
  bool track = false;  // false: alignment is not maintained (ids only)

  SrcRange Src(size_t i) const {
    if (!align.empty()) return align[i];
    return {base + static_cast<int64_t>(i), base + static_cast<int64_t>(i) + 1};
  }
  // Original range covered by bytes [b, e) of text (e > b).
  SrcRange SrcSpan(size_t b, size_t e) const { return {Src(b).begin, Src(e - 1).end}; }
  // Materialises `align` (when tracking) before an edit.
  void MaterializeAlignment();
  // Bytes [b, e) as a new AlignedText with the same tracking.
  AlignedText Slice(size_t b, size_t e) const;
  // Appends bytes [b, e) of `other` with their alignment.
  void AppendFrom(const AlignedText& other, size_t b, size_t e);
  // Appends `bytes`, all attributed to original range `r`.
  void AppendWithSrc(std::string_view bytes, SrcRange r);
};

// A new AlignedText over `s` (original offsets start at `base`). Ill-formed
// UTF-8 is repaired (U+FFFD) with its alignment kept.
AlignedText MakeAlignedText(std::string_view s, int64_t base, bool track);

// ---- normalization -----------------------------------------------------------------
enum class NormForm { kNFC, kNFD, kNFKC, kNFKD };
// Normalizes `t` in place. Returns false (and leaves `t` alone) when ICU fails.
bool Normalize(NormForm form, AlignedText* t);
// Full Unicode lowercase mapping per character (Rust's char::to_lowercase).
void Lowercase(AlignedText* t);

}  // namespace ft::text
