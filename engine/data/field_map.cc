#include "engine/data/field_map.h"

#include <algorithm>
#include <utility>

#include "engine/job/data_fields.h"

namespace ft {

FieldMap::FieldMap(DataFormat format, std::map<std::string, std::string> keys,
                   std::map<std::string, std::string> roles)
    : format_(format), keys_(std::move(keys)), roles_(std::move(roles)) {
  for (const auto& [ours, theirs] : keys_) {
    const bool message_key = std::find(kMessageKeys.begin(), kMessageKeys.end(), ours) != kMessageKeys.end();
    (message_key ? message_rename_ : row_rename_)[theirs] = ours;
  }
}

void FieldMap::Rename(nlohmann::ordered_json* object, const std::map<std::string, std::string>& rename) {
  if (rename.empty()) return;
  nlohmann::ordered_json renamed = nlohmann::ordered_json::object();
  for (auto item = object->begin(); item != object->end(); ++item) {
    auto it = rename.find(item.key());
    renamed[it == rename.end() ? item.key() : it->second] = std::move(item.value());
  }
  *object = std::move(renamed);
}

Status FieldMap::Apply(nlohmann::ordered_json* row, const std::string& where) const {
  if (empty() || !row->is_object()) return Status::OK();  // the encoder names a row that is no object
  const FormatFields& format = FieldsOf(format_);
  for (const auto& [ours, theirs] : keys_) {
    const bool required =
        std::find(format.required.begin(), format.required.end(), ours) != format.required.end();
    if (required && !row->contains(theirs)) {
      return Status::InvalidArgument(where + ": the row has no '" + theirs + "' (data fields map '" + ours +
                                     "' to it; fix the row or the source's fields)");
    }
  }
  Rename(row, row_rename_);
  if (!format.messages || (message_rename_.empty() && roles_.empty())) return Status::OK();
  for (std::string_view key : format.keys) {
    if (key.empty() || !row->contains(key) || !(*row)[std::string(key)].is_array()) continue;
    auto named = keys_.find(std::string(key));  // the row's own name for the list, in messages
    FT_RETURN_IF_ERROR(ApplyToMessages(&(*row)[std::string(key)], where,
                                       named == keys_.end() ? std::string(key) : named->second));
  }
  return Status::OK();
}

Status FieldMap::ApplyToMessages(nlohmann::ordered_json* list, const std::string& where,
                                 const std::string& name) const {
  for (size_t i = 0; i < list->size(); ++i) {
    nlohmann::ordered_json& message = (*list)[i];
    if (!message.is_object()) continue;  // the encoder names it
    for (const auto& [theirs, ours] : message_rename_) {
      if (!message.contains(theirs)) {
        return Status::InvalidArgument(where + ": '" + name + "'[" + std::to_string(i) + "] has no '" +
                                       theirs + "' (data fields map '" + ours +
                                       "' to it; fix the row or the source's fields)");
      }
    }
    Rename(&message, message_rename_);
    if (!message.contains("role") || !message["role"].is_string()) continue;
    auto role = roles_.find(message["role"].get<std::string>());
    if (role != roles_.end()) message["role"] = role->second;
  }
  return Status::OK();
}

}  // namespace ft
