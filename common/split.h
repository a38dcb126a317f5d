// Splitting a list on a separator, as written: empty fields are kept ("a,,b" → "a", "", "b"; "a," →
// "a", ""), and an empty text has none. Header-only.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace ft {

inline std::vector<std::string> SplitOn(std::string_view text, char separator) {
  std::vector<std::string> out;
  for (size_t start = 0; !text.empty() && start <= text.size();) {
    const size_t end = std::min(text.find(separator, start), text.size());
    out.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace ft
