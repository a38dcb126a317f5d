// The members of a JSON object in file order, repeated keys kept: parsers
// (nlohmann's included) keep only the last of a repeated key, so a file
// that names a tensor twice would silently load whichever came last.
//
// Thread safety: a pure function.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ft {

using JsonMembers = std::vector<std::pair<std::string, nlohmann::json>>;

// The members of the object reached from the top level by `path` (empty: the
// top-level object itself; {"weight_map"}: the object under its "weight_map"
// key), in the order the text gives them. nullopt when `text` is not JSON;
// empty when there is no such object.
std::optional<JsonMembers> ObjectMembers(std::string_view text, const std::vector<std::string>& path);

// The first key that `members` holds twice, with the indexes of both
// members; nullopt when every key is unique.
struct RepeatedKey {
  std::string key;
  size_t first = 0;
  size_t second = 0;
};
std::optional<RepeatedKey> FindRepeatedKey(const JsonMembers& members);

}  // namespace ft
