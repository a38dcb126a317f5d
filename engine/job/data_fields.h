// The field names of each data.format (engine/data/data_format.h) that a
// source's field mapping (job.yaml's data.train[i].fields,
// engine/data/field_map.h) may rename: the row-level keys, which of them a
// row must have, and whether its rows hold messages (whose "role" and
// "content" keys, and role values, may be renamed too).
//
// job_spec.cc refuses a mapping of any other key at parse time, with
// file:line; field_map.cc reads the same table. Thread safety: constants.
#pragma once

#include <array>
#include <string_view>

#include "engine/job/job_choices.h"

namespace ft {

struct FormatFields {
  DataFormat format;
  std::array<std::string_view, 5> keys;      // "" = unused slot
  std::array<std::string_view, 3> required;  // keys a row must have ("" = unused slot)
  bool messages;                             // rows hold {"role", "content"} messages
};

// clang-format off
inline constexpr FormatFields kFormatFields[] = {
    {DataFormat::kTokens, {"input_ids", "labels"}, {"input_ids"}, false},
    {DataFormat::kText, {"text"}, {"text"}, false},
    {DataFormat::kAlpaca, {"instruction", "input", "output"}, {"instruction", "output"}, false},
    {DataFormat::kChat, {"messages", "tools"}, {"messages"}, true},
    {DataFormat::kPreference, {"prompt", "chosen", "rejected"}, {"prompt", "chosen", "rejected"}, true},
};
// clang-format on

// The message keys a mapping may rename, and the role values it may map to.
inline constexpr std::array<std::string_view, 2> kMessageKeys = {"role", "content"};
inline constexpr std::array<std::string_view, 4> kMessageRoles = {"system", "user", "assistant", "tool"};

inline const FormatFields& FieldsOf(DataFormat format) {
  for (const FormatFields& f : kFormatFields) {
    if (f.format == format) return f;
  }
  return kFormatFields[0];  // unreachable: the table has every format
}

}  // namespace ft
