// Field mapping (job.yaml's data.train[i].fields): a source's rows use their
// own names for a format's keys (ShareGPT's {"conversations": [{"from":
// "human", "value": ...}]}, Alpaca variants' "question"/"answer"), and a
// FieldMap renames them to the format's (engine/job/data_fields.h lists which
// keys each format has) before the row is encoded, so such data trains with
// no conversion script and the same tokens as converted data.
//
// Apply renames in place, keeping each object's key order: the row's keys;
// then, in formats whose rows hold messages, each message's role and content
// keys and its role value (through `roles`; a value not listed is kept).
// Failure: InvalidArgument "<where>: ..." naming the row's missing key and
// the mapping that wanted it, when the row lacks a key the format requires
// (or a message lacks a mapped role or content key). Thread safety: immutable
// after construction; Apply may run concurrently.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "engine/job/job_choices.h"

namespace ft {

class FieldMap {
 public:
  FieldMap() = default;
  // `keys`: the format's key -> the row's; `roles`: a row's role value -> the format's.
  FieldMap(DataFormat format, std::map<std::string, std::string> keys,
           std::map<std::string, std::string> roles);

  bool empty() const { return keys_.empty() && roles_.empty(); }
  Status Apply(nlohmann::ordered_json* row, const std::string& where) const;

 private:
  // Renames the keys of `object` named in `rename` (the row's name -> the format's), in place.
  static void Rename(nlohmann::ordered_json* object, const std::map<std::string, std::string>& rename);
  Status ApplyToMessages(nlohmann::ordered_json* list, const std::string& where,
                         const std::string& name) const;

  DataFormat format_ = DataFormat::kText;
  std::map<std::string, std::string> keys_, roles_;
  std::map<std::string, std::string> row_rename_, message_rename_;  // the row's name -> the format's
};

}  // namespace ft
