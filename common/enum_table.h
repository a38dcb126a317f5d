// Named choices: every enum a user spells in a file or on a command line
// (job.yaml's model.dtype, resources.device, ...) has one table of
// {name, value, one-line meaning}, and that table alone drives parsing, the
// "one of ..." error, printing, hashing and the docs' key lists.
//
//   enum class Color { kRed, kBlue };
//   template <> struct EnumTraits<Color> {
//     static constexpr std::string_view kWhat = "color";
//     static constexpr EnumEntry<Color> kTable[] = {{"red", Color::kRed, "warm"}, {"blue", Color::kBlue,
//     "cold"}};
//   };
//   ParseEnum<Color>("blue")  -> Color::kBlue
//   ParseEnum<Color>("green") -> InvalidArgument "color 'green' is not one of: red, blue"
//   EnumName(Color::kRed)     -> "red"
//
// Success: ParseEnum returns the value whose name equals the text exactly.
// Failure: InvalidArgument naming what was read, the text (escaped: it may
// come from an untrusted file) and every accepted name; callers prefix the
// file, line and key. Thread safety: pure functions over constant tables.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/untrusted_text.h"

namespace ft {

template <typename E>
struct EnumEntry {
  std::string_view name;  // as written in files and on command lines
  E value;
  std::string_view meaning;  // one line, for --help and the docs
};

// Specialise with kWhat (what the value is, e.g. "model.dtype") and kTable.
template <typename E>
struct EnumTraits;

// The name of `value` ("?" for a value missing from the table: a bug).
template <typename E>
std::string_view EnumName(E value) {
  for (const EnumEntry<E>& e : EnumTraits<E>::kTable) {
    if (e.value == value) return e.name;
  }
  return "?";
}

// Every name, joined by `separator` ("cpu, cuda").
template <typename E>
std::string EnumNames(std::string_view separator = ", ") {
  std::string out;
  for (const EnumEntry<E>& e : EnumTraits<E>::kTable) {
    if (!out.empty()) out += separator;
    out += e.name;
  }
  return out;
}

// Every name, in the table's order (e.g. for a command line's list of accepted values).
template <typename E>
std::vector<std::string> EnumNameList() {
  std::vector<std::string> out;
  for (const EnumEntry<E>& e : EnumTraits<E>::kTable) out.emplace_back(e.name);
  return out;
}

// The value named `text`; InvalidArgument "<what> '<text>' is not one of: a, b" otherwise.
template <typename E>
StatusOr<E> ParseEnum(std::string_view text) {
  for (const EnumEntry<E>& e : EnumTraits<E>::kTable) {
    if (e.name == text) return e.value;
  }
  return Status::InvalidArgument(std::string(EnumTraits<E>::kWhat) + " '" + EscapeControlChars(text, 64) +
                                 "' is not one of: " + EnumNames<E>());
}

}  // namespace ft
