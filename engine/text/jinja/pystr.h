// Python `str` semantics on UTF-8 std::strings, for the Jinja interpreter
// (engine/text/jinja/jinja.h): chat templates run under Python's jinja2 in Hugging Face,
// so lengths, indices and slices count code points, strip() knows Python's
// whitespace, and numbers print as Python prints them.
//
// Invalid UTF-8 bytes are treated as single code points U+FFFD-alike units
// (each byte counts as one character and is copied through unchanged), so no
// function here fails. Case mapping (upper/lower/title/capitalize) is
// ASCII-only: other characters are left as they are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ft::jinja {

// Byte offsets where each code point of `s` starts (size = code point count).
std::vector<size_t> CodePointStarts(std::string_view s);
int64_t CodePointCount(std::string_view s);
// Decodes the code point at byte `pos` (advances `pos`); invalid bytes yield
// 0xDC00 + byte (Python's surrogateescape) and advance by one.
uint32_t DecodeCodePoint(std::string_view s, size_t* pos);
void AppendUtf8(uint32_t cp, std::string* out);

// Python's str.isspace() for one code point.
bool IsPySpace(uint32_t cp);

// str.strip / lstrip / rstrip: without `chars`, Python whitespace; with
// `chars`, any of its code points.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep=None, maxsplit=-1) and str.rsplit. An empty `sep` is the
// caller's error to report (Python raises ValueError).
std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> PyRSplit(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit);
// str.splitlines(keepends=False) with Python's line boundaries.
std::vector<std::string> PySplitLines(std::string_view s);
// str.replace(old, new, count=-1); an empty `old` inserts between characters.
std::string PyReplace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count);
// str.find / rfind in code points (-1 when absent).
int64_t PyFind(std::string_view s, std::string_view sub, bool reverse);
// Non-overlapping occurrences (str.count).
int64_t PyCount(std::string_view s, std::string_view sub);

std::string AsciiUpper(std::string_view s);
std::string AsciiLower(std::string_view s);
std::string PyTitle(std::string_view s);       // str.title(), ASCII letters only
std::string PyCapitalize(std::string_view s);  // str.capitalize(), ASCII letters only

// repr(str): quotes and escapes as Python does ('abc', "it's", '\n').
std::string PyStrRepr(std::string_view s);
// repr(float) / str(float): shortest round-trip digits, "1.0", "1e+16",
// "1.5e-05", "inf", "nan".
std::string PyFloatRepr(double v);

// Python-style slice of `n` items: fills the chosen indices. A zero step is
// the caller's error to report.
std::vector<int64_t> SliceIndices(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                  int64_t step);

}  // namespace ft::jinja
