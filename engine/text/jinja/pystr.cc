#include "engine/text/jinja/pystr.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/utf8.h"

namespace ft::jinja {

uint32_t DecodeCodePoint(std::string_view s, size_t* pos) {
  const Utf8Char c = DecodeUtf8(s, *pos, Utf8Policy::kEscapeByte);
  *pos += c.len;
  return c.cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {  // an invalid byte carried through
    out->push_back(static_cast<char>(cp - 0xDC00));
  } else {
    ft::AppendUtf8(cp, out);
  }
}

std::vector<size_t> CodePointStarts(std::string_view s) {
  std::vector<size_t> starts;
  starts.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    starts.push_back(pos);
    DecodeCodePoint(s, &pos);
  }
  return starts;
}

int64_t CodePointCount(std::string_view s) {
  int64_t n = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    DecodeCodePoint(s, &pos);
    ++n;
  }
  return n;
}

bool IsPySpace(uint32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  if (cp >= 0x1C && cp <= 0x20) return true;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

struct Cp {
  uint32_t cp;
  size_t begin, end;  // bytes
};

std::vector<Cp> Decode(std::string_view s) {
  std::vector<Cp> out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t b = pos;
    const uint32_t cp = DecodeCodePoint(s, &pos);
    out.push_back({cp, b, pos});
  }
  return out;
}

bool IsLineBreak(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
         cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

bool IsAsciiAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<Cp> cps = Decode(s);
  std::vector<uint32_t> set;
  if (chars) {
    for (const Cp& c : Decode(*chars)) set.push_back(c.cp);
  }
  auto strip = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : IsPySpace(cp);
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b].cp)) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1].cp)) --e;
  }
  if (b == e) return "";
  return std::string(s.substr(cps[b].begin, cps[e - 1].end - cps[b].begin));
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  const std::vector<Cp> cps = Decode(s);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && IsPySpace(cps[i].cp)) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(cps[i].begin));
      break;
    }
    const size_t b = i;
    while (i < cps.size() && !IsPySpace(cps[i].cp)) ++i;
    out.emplace_back(s.substr(cps[b].begin, cps[i - 1].end - cps[b].begin));
  }
  return out;
}

std::vector<std::string> PyRSplit(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::vector<Cp> cps = Decode(s);
  size_t i = cps.size();
  while (true) {
    while (i > 0 && IsPySpace(cps[i - 1].cp)) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(0, cps[i - 1].end));
      break;
    }
    const size_t e = i;
    while (i > 0 && !IsPySpace(cps[i - 1].cp)) --i;
    out.emplace_back(s.substr(cps[i].begin, cps[e - 1].end - cps[i].begin));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> PySplitLines(std::string_view s) {
  std::vector<std::string> out;
  const std::vector<Cp> cps = Decode(s);
  size_t line_begin = 0;  // byte offset
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!IsLineBreak(cps[i].cp)) continue;
    out.emplace_back(s.substr(line_begin, cps[i].begin - line_begin));
    if (cps[i].cp == '\r' && i + 1 < cps.size() && cps[i + 1].cp == '\n') ++i;
    line_begin = cps[i].end;
  }
  if (line_begin < s.size()) out.emplace_back(s.substr(line_begin));
  return out;
}

std::string PyReplace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count) {
  std::string out;
  if (old_s.empty()) {
    const std::vector<Cp> cps = Decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(new_s);
        ++done;
      }
      if (i < cps.size()) out.append(s.substr(cps[i].begin, cps[i].end - cps[i].begin));
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old_s, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(new_s);
    pos = hit + old_s.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

int64_t PyFind(std::string_view s, std::string_view sub, bool reverse) {
  const size_t hit = reverse ? s.rfind(sub) : s.find(sub);
  if (hit == std::string_view::npos) return -1;
  return CodePointCount(s.substr(0, hit));
}

int64_t PyCount(std::string_view s, std::string_view sub) {
  if (sub.empty()) return CodePointCount(s) + 1;
  int64_t n = 0;
  size_t pos = 0;
  while ((pos = s.find(sub, pos)) != std::string_view::npos) {
    ++n;
    pos += sub.size();
  }
  return n;
}

std::string AsciiUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    if (IsAsciiAlpha(c)) {
      c = prev_cased ? AsciiLower(std::string_view(&c, 1))[0] : AsciiUpper(std::string_view(&c, 1))[0];
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out = AsciiLower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
  return out;
}

std::string PyStrRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  char buf[16];
  while (pos < s.size()) {
    const size_t b = pos;
    const uint32_t cp = DecodeCodePoint(s, &pos);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      out += buf;
    } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
      std::snprintf(buf, sizeof(buf), "\\udc%02x", cp - 0xDC00);
      out += buf;
    } else if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
               (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF || cp == 0x1680) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      out += buf;
    } else {
      out.append(s.substr(b, pos - b));
    }
  }
  out.push_back(quote);
  return out;
}

std::string PyFloatRepr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
  const size_t e_pos = sci.find('e');
  std::string mant = sci.substr(0, e_pos);
  const int exp10 = std::stoi(sci.substr(e_pos + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  const int n = static_cast<int>(digits.size());
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(decpt - n, '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  const int e = decpt - 1;
  std::snprintf(buf, sizeof(buf), "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
  return out + buf;
}

std::vector<int64_t> SliceIndices(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                  int64_t step) {
  std::vector<int64_t> out;
  int64_t b, e;
  if (step > 0) {
    b = start ? (*start < 0 ? std::max<int64_t>(*start + n, 0) : std::min(*start, n)) : 0;
    e = stop ? (*stop < 0 ? std::max<int64_t>(*stop + n, 0) : std::min(*stop, n)) : n;
    for (int64_t i = b; i < e; i += step) out.push_back(i);
  } else {
    b = start ? (*start < 0 ? std::max<int64_t>(*start + n, -1) : std::min(*start, n - 1)) : n - 1;
    e = stop ? (*stop < 0 ? std::max<int64_t>(*stop + n, -1) : std::min(*stop, n - 1)) : -1;
    for (int64_t i = b; i > e; i += step) out.push_back(i);
  }
  return out;
}

}  // namespace ft::jinja
