// One job per output.dir: the daemon's index of every job's output directory
// (canonical: absolute, normalised, symlinks resolved where they exist), so a
// submit whose output.dir equals, contains or lies inside another job's is
// refused with a lookup (log n per path component), never a scan of the jobs.
//
// Thread safety: none; the daemon keeps it under its lock.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <utility>

namespace ft {

// `dir` as the index keys it: absolute, lexically normal, symlinks resolved
// as far as the path exists (std::filesystem::weakly_canonical), no trailing
// '/'. "" for an empty path.
inline std::string OutputDirKey(const std::string& dir) {
  if (dir.empty()) return "";
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(dir, ec), ec);
  if (ec) p = std::filesystem::absolute(dir).lexically_normal();
  std::string key = p.string();
  while (key.size() > 1 && key.back() == '/') key.pop_back();
  return key;
}

class OutputDirs {
 public:
  // A directory another job writes that overlaps the one asked about.
  struct Overlap {
    std::string dir;    // the other job's output.dir (its key)
    std::string owner;  // what Add was given with it (a job id)
  };

  // Records that `owner` writes `key` (an OutputDirKey). A key already
  // present keeps its first owner (either one is enough to refuse a third).
  void Add(const std::string& key, const std::string& owner) { by_dir_.emplace(key, owner); }
  void Clear() { by_dir_.clear(); }
  size_t size() const { return by_dir_.size(); }

  // The recorded directory that equals `key`, lies above it or lies inside
  // it; false when none does.
  bool FindOverlap(const std::string& key, Overlap* out) const {
    // Equal, or an ancestor: each of the key's parents, up to "/".
    for (std::filesystem::path p(key);; p = p.parent_path()) {
      if (auto it = by_dir_.find(p.string()); it != by_dir_.end()) return Found(*it, out);
      if (!p.has_relative_path() || p.parent_path() == p) break;
    }
    // Inside it: keys starting with "<key>/" sort together, right after it.
    const std::string prefix = key == "/" ? key : key + "/";
    auto it = by_dir_.lower_bound(prefix);
    if (it != by_dir_.end() && it->first.compare(0, prefix.size(), prefix) == 0) return Found(*it, out);
    return false;
  }

 private:
  static bool Found(const std::pair<const std::string, std::string>& entry, Overlap* out) {
    *out = {entry.first, entry.second};
    return true;
  }

  std::map<std::string, std::string> by_dir_;  // key → owner
};

}  // namespace ft
