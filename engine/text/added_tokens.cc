#include "engine/text/added_tokens.h"

#include <algorithm>

#include "common/utf8.h"
#include "engine/text/unicode_text.h"

namespace ft {
namespace {

// Start of the code point that ends at s[end - 1].
size_t PrevCharStart(std::string_view s, size_t end) { return Utf8CharStart(s, end - 1); }

bool EndsWithWordChar(std::string_view s, size_t end) {
  if (end == 0) return false;
  size_t i = PrevCharStart(s, end);
  return text::IsWordChar(text::NextCodePoint(s, &i));
}

bool StartsWithWordChar(std::string_view s, size_t begin) {
  if (begin >= s.size()) return false;
  return text::IsWordChar(text::NextCodePoint(s, &begin));
}

// Start of the whitespace run that ends at `end` (HF's \s*$ on s[..end]).
size_t WhitespaceRunStart(std::string_view s, size_t end) {
  while (end > 0) {
    const size_t start = PrevCharStart(s, end);
    size_t i = start;
    if (!text::IsWhiteSpace(text::NextCodePoint(s, &i))) break;
    end = start;
  }
  return end;
}

// End of the whitespace run that starts at `begin` (HF's ^\s* on s[begin..]).
size_t WhitespaceRunEnd(std::string_view s, size_t begin) {
  while (begin < s.size()) {
    size_t i = begin;
    if (!text::IsWhiteSpace(text::NextCodePoint(s, &i))) break;
    begin = i;
  }
  return begin;
}

}  // namespace

void AddedTokenSplitter::Add(std::string_view pattern, int32_t index) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char c : pattern) {
    const uint64_t edge = (static_cast<uint64_t>(node) << 8) | c;
    auto it = edges_.find(edge);
    if (it == edges_.end()) {
      it = edges_.emplace(edge, static_cast<int32_t>(terminal_.size())).first;
      terminal_.push_back(-1);
    }
    node = it->second;
  }
  // The same content twice (HF keeps one entry per content): the first wins.
  if (terminal_[node] < 0) terminal_[node] = index;
  first_byte_[static_cast<uint8_t>(pattern[0])] = true;
  ++patterns_;
}

int32_t AddedTokenSplitter::LongestAt(std::string_view s, size_t i, size_t* len) const {
  int32_t node = 0, found = -1;
  for (size_t j = i; j < s.size(); ++j) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(s[j]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) {
      found = terminal_[node];
      *len = j + 1 - i;
    }
  }
  return found;
}

void AddedTokenSplitter::Split(std::string_view s, const std::vector<AddedToken>& tokens,
                               std::vector<TextSection>* out) const {
  size_t emitted = 0;  // end of the last section pushed
  size_t i = 0;
  while (i < s.size() && patterns_ > 0) {
    if (!first_byte_[static_cast<uint8_t>(s[i])]) {
      ++i;
      continue;
    }
    size_t len = 0;
    const int32_t index = LongestAt(s, i, &len);
    if (index < 0) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop;  // the search resumes after this match even when it is discarded
    const AddedToken& token = tokens[index];
    if (token.single_word && (EndsWithWordChar(s, start) || StartsWithWordChar(s, stop))) continue;
    if (token.lstrip) start = std::max(WhitespaceRunStart(s, start), emitted);
    if (token.rstrip) stop = WhitespaceRunEnd(s, stop);
    if (emitted < start) out->push_back({emitted, start, -1});
    out->push_back({start, stop, index});
    emitted = stop;
    i = std::max(i, stop);
  }
  if (emitted < s.size()) out->push_back({emitted, s.size(), -1});
}

}  // namespace ft
