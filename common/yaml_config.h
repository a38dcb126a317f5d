// YAML configuration files with errors that point at the line.
//
// Loads a YAML file with yaml-cpp and reads typed fields from it. Every error
// names the file, the line and column (1-based), the dotted key path, and what
// to do about it, e.g.
//   job.yaml:7:9: train.lr: expected a number, got 'fast'
//   job.yaml:12:3: unknown key 'learning_rate' in train (did you mean 'lr'?)
// No yaml-cpp exception escapes this module.
//
// Thread safety: a YamlMap is a read-only view; concurrent reads are safe.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ft {

// Bounds on a YAML document, checked before yaml-cpp builds its tree (a node
// costs it ~250 bytes: one 1 MiB file of "[a,a,a,...]" took ~260 MB, and a
// deep nest recurses as deep). The defaults suit hand-written configuration
// (job.yaml, client.yaml): a few hundred nodes, a few levels.
struct YamlLimits {
  size_t max_bytes = size_t{256} << 10;
  int64_t max_nodes = 10'000;  // scalars, nulls, aliases, lists and mappings
  int max_depth = 32;          // lists and mappings inside each other
};

// OK when `text` stays within `limits`: its size, then its nodes and nesting,
// counted by yaml-cpp's event parser (no tree is built; it stops at the first
// node past a limit). InvalidArgument naming `what` (a file, with line and
// column, or a --set flag), the limit and the fix otherwise. A syntax error
// is left to the parse that follows (it stops there too).
Status CheckYamlLimits(std::string_view text, const std::string& what, const YamlLimits& limits = {});

// A mapping node in a YAML file, with the file name and key path kept for
// error messages. `path` is "" for the document root.
class YamlMap {
 public:
  YamlMap(YAML::Node node, std::string file, std::string path)
      : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {}

  // Parses `text` (named `file` in messages) within the default YamlLimits
  // (CheckYamlLimits, before any tree is built); the root must be a mapping
  // without a repeated key (InvalidArgument naming both lines).
  static StatusOr<YamlMap> Parse(std::string_view text, std::string file);
  // Reads and parses a file. NotFound/IOError when unreadable.
  static StatusOr<YamlMap> LoadFile(const std::string& file);

  bool Has(std::string_view key) const;

  // Typed getters. A missing or null key leaves *out untouched and returns OK
  // (so defaults set by the caller stay), unless `required` is set, in which
  // case it is InvalidArgument naming the key. A value of the wrong type is
  // InvalidArgument with file:line:col. A number must be finite: .inf, .nan and
  // values beyond a double's range are InvalidArgument naming the key.
  Status Get(std::string_view key, std::string* out, bool required = false) const;
  Status Get(std::string_view key, int64_t* out, bool required = false) const;
  Status Get(std::string_view key, double* out, bool required = false) const;
  Status Get(std::string_view key, bool* out, bool required = false) const;
  Status Get(std::string_view key, std::vector<std::string>* out, bool required = false) const;
  // Like Get(string) but the value must be one of `allowed`.
  Status GetEnum(std::string_view key, const std::vector<std::string>& allowed, std::string* out) const;

  // The mapping under `key`; NotFound when absent or null, InvalidArgument when
  // not a mapping or when it repeats a key (Parse checks the root the same way).
  StatusOr<YamlMap> Child(std::string_view key) const;

  // The mappings of the list under `key` (each named "<path>.<key>[i]" in messages); NotFound
  // when absent or null, InvalidArgument when it is not a list or an item is not a mapping or
  // repeats a key.
  StatusOr<std::vector<YamlMap>> ChildList(std::string_view key) const;
  // Whether the value under `key` is a list.
  bool IsList(std::string_view key) const;

  // InvalidArgument for the first key not in `known`, with its location and
  // the closest known key as a suggestion.
  Status CheckKnownKeys(const std::vector<std::string>& known) const;

  // "file:line:col" of the value under `key`, or of this mapping when key is empty or absent.
  std::string Where(std::string_view key = {}) const;
  // Dotted path of `key` under this mapping, e.g. "train.lr".
  std::string KeyPath(std::string_view key) const;

  const std::string& file() const { return file_; }
  const YAML::Node& node() const { return node_; }

 private:
  std::optional<YAML::Node> Lookup(std::string_view key) const;
  Status TypeError(std::string_view key, std::string_view expected) const;
  // Get(double) without the finite-number rule.
  Status GetAnyNumber(std::string_view key, double* out, bool required) const;
  // InvalidArgument naming both places when a key of this mapping repeats.
  Status CheckDuplicateKeys() const;

  YAML::Node node_;
  std::string file_;
  std::string path_;
};

// `text` (a YAML document whose root is a mapping) with each override
// "a.b.c=VALUE" applied in order, as the merged document's YAML text. VALUE is
// read as YAML (1e-4 a number, true a bool, [q_proj, v_proj] a list, anything
// else a string); mappings missing on the path are created. InvalidArgument
// naming the override ("--set a.b=...: ...") when it is not KEY=VALUE, its
// value is not YAML or a key on its path holds a value that is not a
// mapping; the text's own YAML errors name the file's line as Parse does.
// Bounded before anything is built: each KEY at most kMaxOverrideKeyParts
// parts and kMaxOverrideKeyBytes bytes, each VALUE within the YamlLimits,
// and the text with every override at most YamlLimits::max_bytes (each an
// InvalidArgument naming the override, the limit and the fix).
constexpr size_t kMaxOverrideKeyParts = 8;
constexpr size_t kMaxOverrideKeyBytes = 256;
StatusOr<std::string> ApplyYamlOverrides(std::string_view text, const std::string& file,
                                         const std::vector<std::string>& overrides);

// Levenshtein distance, for "did you mean" suggestions.
size_t EditDistance(std::string_view a, std::string_view b);
// The closest candidate to `word`, or "" when none is reasonably close.
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace ft
