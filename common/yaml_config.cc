#include "common/yaml_config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

namespace ft {

namespace {

std::string Location(const std::string& file, const YAML::Mark& mark) {
  if (mark.is_null()) return file;
  return file + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

std::string Scalar(const YAML::Node& node) {
  return node.IsScalar() ? node.Scalar() : std::string("<") + (node.IsMap() ? "mapping" : "sequence") + ">";
}

// Stops yaml-cpp's event parser at the first node past a limit (thrown by
// LimitCounter, caught by CheckYamlLimits: it never leaves this file).
struct LimitExceeded {
  std::string message;
};

// Counts a document's nodes and nesting as yaml-cpp's parser reports them.
class LimitCounter : public YAML::EventHandler {
 public:
  LimitCounter(const YamlLimits& limits, const std::string& what) : limits_(limits), what_(what) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    Node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Open(mark);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Open(mark);
  }
  void OnMapEnd() override { --depth_; }

 private:
  void Node(const YAML::Mark& mark) {
    if (++nodes_ <= limits_.max_nodes) return;
    throw LimitExceeded{Location(what_, mark) + ": more than " + std::to_string(limits_.max_nodes) +
                        " YAML nodes (values, lists, mappings); at most " +
                        std::to_string(limits_.max_nodes) +
                        " are accepted: a configuration names its data files, it does not hold data"};
  }
  void Open(const YAML::Mark& mark) {
    Node(mark);
    if (++depth_ <= limits_.max_depth) return;
    throw LimitExceeded{Location(what_, mark) + ": lists and mappings nested more than " +
                        std::to_string(limits_.max_depth) + " deep; at most " +
                        std::to_string(limits_.max_depth) + " levels are accepted: flatten it"};
  }

  const YamlLimits& limits_;
  const std::string& what_;
  int64_t nodes_ = 0;
  int depth_ = 0;
};

// An override as messages show it: at most 80 bytes of it.
std::string ShortOverride(const std::string& text) {
  return "--set " + (text.size() <= 80 ? text : text.substr(0, 80) + "...");
}

}  // namespace

Status CheckYamlLimits(std::string_view text, const std::string& what, const YamlLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return Status::InvalidArgument(
        what + ": " + std::to_string(text.size()) + " bytes; at most " +
        std::to_string(limits.max_bytes >> 10) +
        " KiB are accepted: a configuration names its data files, it does not hold data");
  }
  std::istringstream in{std::string(text)};
  LimitCounter counter(limits, what);
  try {
    YAML::Parser parser(in);
    parser.HandleNextDocument(counter);
  } catch (const LimitExceeded& e) {
    return Status::InvalidArgument(e.message);
  } catch (const YAML::Exception&) {
    // A syntax error: the parse that follows reports it with its line (and stops there too).
  }
  return Status::OK();
}

StatusOr<YamlMap> YamlMap::Parse(std::string_view text, std::string file) {
  FT_RETURN_IF_ERROR(CheckYamlLimits(text, file));
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(Location(file, e.mark) + ": YAML syntax error: " + e.msg);
  }
  if (!root.IsMap()) {
    return Status::InvalidArgument(file + ": expected a mapping of keys at the top level");
  }
  YamlMap map(root, std::move(file), "");
  FT_RETURN_IF_ERROR(map.CheckDuplicateKeys());
  return map;
}

namespace {

// The dotted key of an override (before its '='), bounded before it is split:
// at most kMaxOverrideKeyBytes bytes and kMaxOverrideKeyParts parts.
StatusOr<std::vector<std::string>> OverrideKey(const std::string& override_text, size_t eq) {
  const std::string what = ShortOverride(override_text);
  if (eq == std::string::npos || eq == 0) {
    return Status::InvalidArgument(what + ": expected KEY=VALUE with a dotted key, e.g. train.lr=1e-4");
  }
  const size_t parts =
      static_cast<size_t>(std::count(override_text.begin(), override_text.begin() + eq, '.')) + 1;
  if (eq > kMaxOverrideKeyBytes || parts > kMaxOverrideKeyParts) {
    return Status::InvalidArgument(
        what + ": the key has " + std::to_string(parts) + " parts and " + std::to_string(eq) +
        " bytes; a key has at most " + std::to_string(kMaxOverrideKeyParts) + " parts and " +
        std::to_string(kMaxOverrideKeyBytes) + " bytes: name a key of the job, e.g. train.lr=1e-4");
  }
  std::vector<std::string> path;
  std::stringstream keys(override_text.substr(0, eq));
  for (std::string k; std::getline(keys, k, '.');) path.push_back(k);
  if (override_text[eq - 1] == '.' ||
      std::any_of(path.begin(), path.end(), [](const std::string& k) { return k.empty(); })) {
    return Status::InvalidArgument(what + ": empty key in the dotted path");
  }
  return path;
}

// Sets root[path] = value for one override; `what` names it in errors.
Status ApplyOverride(YAML::Node root, const std::string& override_text) {
  const std::string what = ShortOverride(override_text);
  const size_t eq = override_text.find('=');
  FT_ASSIGN_OR_RETURN(const std::vector<std::string> path, OverrideKey(override_text, eq));
  const std::string value_text = override_text.substr(eq + 1);
  FT_RETURN_IF_ERROR(CheckYamlLimits(value_text, what + " (its value)"));
  YAML::Node value;
  try {
    value = YAML::Load(value_text);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(what + ": the value is not YAML: " + e.msg);
  }
  YAML::Node node = root;
  std::string at;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    at += (at.empty() ? "" : ".") + path[i];
    YAML::Node child = node[path[i]];
    if (!child.IsDefined() || child.IsNull()) {
      node[path[i]] = YAML::Node(YAML::NodeType::Map);
      child = node[path[i]];
    } else if (!child.IsMap()) {
      return Status::InvalidArgument(what + ": '" + at + "' is not a mapping, so it has no key '" +
                                     path[i + 1] + "'");
    }
    node.reset(child);
  }
  node[path.back()] = value;
  return Status::OK();
}

}  // namespace

StatusOr<std::string> ApplyYamlOverrides(std::string_view text, const std::string& file,
                                         const std::vector<std::string>& overrides) {
  size_t total = text.size();
  for (const std::string& o : overrides) total += o.size();
  if (const size_t max = YamlLimits().max_bytes; total > max) {
    return Status::InvalidArgument(file + " with its --set overrides: " + std::to_string(total) +
                                   " bytes; at most " + std::to_string(max >> 10) +
                                   " KiB are accepted: put data in files the job names, not in --set values");
  }
  FT_ASSIGN_OR_RETURN(YamlMap parsed, YamlMap::Parse(text, file));
  YAML::Node root = YAML::Clone(parsed.node());
  try {
    for (const std::string& o : overrides) FT_RETURN_IF_ERROR(ApplyOverride(root, o));
    YAML::Emitter out;
    out << root;
    return std::string(out.c_str()) + "\n";
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(file + ": cannot apply --set overrides: " + e.msg);
  }
}

StatusOr<YamlMap> YamlMap::LoadFile(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::NotFound(file + ": cannot open file");
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Status::IOError(file + ": read failed");
  return Parse(buf.str(), file);
}

std::optional<YAML::Node> YamlMap::Lookup(std::string_view key) const {
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    if (it->first.IsScalar() && it->first.Scalar() == key) {
      if (it->second.IsNull()) return std::nullopt;
      return it->second;
    }
  }
  return std::nullopt;
}

bool YamlMap::Has(std::string_view key) const { return Lookup(key).has_value(); }

std::string YamlMap::KeyPath(std::string_view key) const {
  if (path_.empty()) return std::string(key);
  if (key.empty()) return path_;
  return path_ + "." + std::string(key);
}

std::string YamlMap::Where(std::string_view key) const {
  if (!key.empty()) {
    if (auto v = Lookup(key)) return Location(file_, v->Mark());
  }
  return Location(file_, node_.Mark());
}

Status YamlMap::TypeError(std::string_view key, std::string_view expected) const {
  auto v = Lookup(key);
  return Status::InvalidArgument(Where(key) + ": " + KeyPath(key) + ": expected " + std::string(expected) +
                                 ", got '" + (v ? Scalar(*v) : "") + "'");
}

#define FT_YAML_GET_(key, out, required, expected, check)                                                    \
  auto v = Lookup(key);                                                                                      \
  if (!v) {                                                                                                  \
    if (required) return Status::InvalidArgument(Where() + ": missing required key '" + KeyPath(key) + "'"); \
    return Status::OK();                                                                                     \
  }                                                                                                          \
  if (!(check)) return TypeError(key, expected);                                                             \
  try {                                                                                                      \
    *out = v->as<std::remove_pointer_t<decltype(out)>>();                                                    \
  } catch (const YAML::Exception&) {                                                                         \
    return TypeError(key, expected);                                                                         \
  }                                                                                                          \
  return Status::OK()

Status YamlMap::Get(std::string_view key, std::string* out, bool required) const {
  FT_YAML_GET_(key, out, required, "a string", v->IsScalar());
}
Status YamlMap::Get(std::string_view key, int64_t* out, bool required) const {
  FT_YAML_GET_(key, out, required, "an integer", v->IsScalar());
}
Status YamlMap::Get(std::string_view key, double* out, bool required) const {
  double value = *out;
  FT_RETURN_IF_ERROR(GetAnyNumber(key, &value, required));
  if (auto v = Lookup(key); v && !std::isfinite(value)) {
    return Status::InvalidArgument(
        Where(key) + ": " + KeyPath(key) + ": '" + Scalar(*v) +
        "' is not a finite number; write a finite number (e.g. 1e-4), not .inf or .nan");
  }
  *out = value;
  return Status::OK();
}
Status YamlMap::GetAnyNumber(std::string_view key, double* out, bool required) const {
  FT_YAML_GET_(key, out, required, "a number", v->IsScalar());
}
Status YamlMap::Get(std::string_view key, bool* out, bool required) const {
  FT_YAML_GET_(key, out, required, "true or false", v->IsScalar());
}
Status YamlMap::Get(std::string_view key, std::vector<std::string>* out, bool required) const {
  FT_YAML_GET_(key, out, required, "a list of strings", v->IsSequence());
}
#undef FT_YAML_GET_

Status YamlMap::GetEnum(std::string_view key, const std::vector<std::string>& allowed,
                        std::string* out) const {
  std::string value = *out;
  FT_RETURN_IF_ERROR(Get(key, &value));
  if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : " | ") + a;
    std::string hint = ClosestMatch(value, allowed);
    return Status::InvalidArgument(Where(key) + ": " + KeyPath(key) + ": '" + value + "' is not one of " +
                                   list + (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
  }
  *out = value;
  return Status::OK();
}

StatusOr<YamlMap> YamlMap::Child(std::string_view key) const {
  auto v = Lookup(key);
  if (!v) return Status::NotFound(Where() + ": no '" + KeyPath(key) + "' section");
  if (!v->IsMap()) return TypeError(key, "a mapping of keys");
  YamlMap child(*v, file_, KeyPath(key));
  FT_RETURN_IF_ERROR(child.CheckDuplicateKeys());
  return child;
}

bool YamlMap::IsList(std::string_view key) const {
  auto v = Lookup(key);
  return v && v->IsSequence();
}

StatusOr<std::vector<YamlMap>> YamlMap::ChildList(std::string_view key) const {
  auto v = Lookup(key);
  if (!v) return Status::NotFound(Where() + ": no '" + KeyPath(key) + "' list");
  if (!v->IsSequence()) return TypeError(key, "a list");
  std::vector<YamlMap> items;
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string path = KeyPath(key) + "[" + std::to_string(i) + "]";
    if (!(*v)[i].IsMap()) {
      return Status::InvalidArgument(Location(file_, (*v)[i].Mark()) + ": " + path +
                                     ": expected a mapping of keys, got '" + Scalar((*v)[i]) + "'");
    }
    YamlMap item((*v)[i], file_, path);
    FT_RETURN_IF_ERROR(item.CheckDuplicateKeys());
    items.push_back(std::move(item));
  }
  return items;
}

Status YamlMap::CheckDuplicateKeys() const {
  // yaml-cpp keeps every pair of a mapping, and a lookup finds the first: a
  // repeated key would silently lose its later value.
  std::map<std::string, YAML::Mark> seen;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    if (!it->first.IsScalar()) continue;
    const std::string& key = it->first.Scalar();
    auto [first, inserted] = seen.emplace(key, it->first.Mark());
    if (inserted) continue;
    return Status::InvalidArgument(Location(file_, it->first.Mark()) + ": " + KeyPath(key) +
                                   ": duplicate key (first at " + Location(file_, first->second) +
                                   "); YAML keeps only one of them: remove one");
  }
  return Status::OK();
}

Status YamlMap::CheckKnownKeys(const std::vector<std::string>& known) const {
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : "<non-scalar key>";
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string hint = ClosestMatch(key, known);
    std::string where = Location(file_, it->first.Mark());
    std::string section = path_.empty() ? "the top level" : path_;
    return Status::InvalidArgument(where + ": unknown key '" + key + "' in " + section +
                                   (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
  }
  return Status::OK();
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = static_cast<size_t>(-1);
  for (const auto& c : candidates) {
    size_t d = EditDistance(word, c);
    // Substring matches ("learning_rate" vs "lr" is not one; "max_step" vs "max_steps" is).
    if (c.find(word) != std::string::npos || std::string(word).find(c) != std::string::npos)
      d = std::min<size_t>(d, 1);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  size_t limit = std::max<size_t>(2, word.size() / 2);
  return best_d <= limit ? best : std::string();
}

}  // namespace ft
