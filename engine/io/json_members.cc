#include "engine/io/json_members.h"

#include <map>

namespace ft {

using nlohmann::json;

std::optional<JsonMembers> ObjectMembers(std::string_view text, const std::vector<std::string>& path) {
  // nlohmann reports an object's members at depth (the object's depth + 1); `keys[d]` is the key
  // last seen at depth d and `is_object[d]` whether the container opened at depth d is an object.
  const size_t depth = path.size() + 1;  // of the members wanted
  std::vector<std::string> keys;
  std::vector<bool> is_object;
  JsonMembers members;
  auto on_path = [&] {
    if (is_object.size() < depth || !is_object[depth - 1]) return false;
    for (size_t i = 0; i < path.size(); ++i) {
      if (keys[i + 1] != path[i]) return false;
    }
    return true;
  };
  auto callback = [&](int d, json::parse_event_t event, json& parsed) {
    const size_t at = static_cast<size_t>(d);
    if (keys.size() <= at) keys.resize(at + 1);
    if (is_object.size() <= at) is_object.resize(at + 1);
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) {
      is_object[at] = event == json::parse_event_t::object_start;
    } else if (event == json::parse_event_t::key) {
      keys[at] = parsed.get<std::string>();
    } else if (at == depth && on_path()) {  // a member's value is complete
      members.emplace_back(keys[at], parsed);
    }
    return true;
  };
  const json whole = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (whole.is_discarded() || !whole.is_object()) return std::nullopt;
  return members;
}

std::optional<RepeatedKey> FindRepeatedKey(const JsonMembers& members) {
  std::map<std::string_view, size_t> seen;
  for (size_t i = 0; i < members.size(); ++i) {
    auto [it, fresh] = seen.emplace(members[i].first, i);
    if (!fresh) return RepeatedKey{members[i].first, it->second, i};
  }
  return std::nullopt;
}

}  // namespace ft
