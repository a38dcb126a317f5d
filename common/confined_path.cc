#include "common/confined_path.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace ft {

namespace fs = std::filesystem;

namespace {

std::vector<std::string>& Roots() {
  static std::vector<std::string> roots;
  return roots;
}

std::string RootList(const std::vector<std::string>& roots) {
  std::string list;
  for (const std::string& r : roots) list += (list.empty() ? "" : ", ") + r;
  return list;
}

// realpath(3) of `p`; "" with errno set when it fails.
std::string RealPath(const fs::path& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

// `path` made absolute, its existing part resolved by realpath, the rest appended.
StatusOr<fs::path> Resolve(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("an empty path names no file");
  std::error_code ec;
  fs::path existing = fs::absolute(path, ec);
  if (ec) return Status::IOError(path + ": cannot make absolute: " + ec.message());
  std::vector<fs::path> tail;
  struct stat st {};
  while (::lstat(existing.c_str(), &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) {
      return Status::IOError(path + ": cannot resolve " + existing.string() + ": " + std::strerror(errno));
    }
    if (!existing.has_relative_path()) break;
    tail.push_back(existing.filename());
    existing = existing.parent_path();
  }
  fs::path out = RealPath(existing);
  if (out.empty()) {
    return Status::InvalidArgument(
        path + ": " + existing.string() +
        " cannot be resolved (a symlink that leads nowhere?): " + std::strerror(errno));
  }
  for (auto it = tail.rbegin(); it != tail.rend(); ++it) {
    if (*it == "..") {
      return Status::InvalidArgument(path + ": '..' after the part that does not exist yet (" +
                                     existing.string() + ") cannot be checked; write the path without it");
    }
    if (it->empty() || *it == ".") continue;
    out /= *it;
  }
  return out;
}

}  // namespace

StatusOr<std::string> ConfinedPath(const std::string& path, const std::vector<std::string>& roots) {
  if (roots.empty()) return path;
  FT_ASSIGN_OR_RETURN(fs::path resolved, Resolve(path));
  for (const std::string& root : roots) {
    const std::string r = RealPath(root);
    if (!r.empty() && PathIsBeneath(resolved.string(), r)) return resolved.string();
  }
  return Status::InvalidArgument(path + ": resolves to " + resolved.string() +
                                 ", outside the allowed roots (" + RootList(roots) +
                                 "); a symlink or a moved directory leads out of them: put the real file "
                                 "or directory under a root");
}

bool PathIsBeneath(const std::string& path, const std::string& root) {
  const fs::path p(path), r(root);
  auto [ri, pi] = std::mismatch(r.begin(), r.end(), p.begin(), p.end());
  return ri == r.end() || (std::next(ri) == r.end() && ri->empty());
}

void SetProcessAllowedRoots(std::vector<std::string> roots) { Roots() = std::move(roots); }

const std::vector<std::string>& ProcessAllowedRoots() { return Roots(); }

StatusOr<std::string> Confine(const std::string& path) { return ConfinedPath(path, Roots()); }

StatusOr<int> OpenConfined(const std::string& path, int flags, int mode) {
  FT_ASSIGN_OR_RETURN(std::string resolved, Confine(path));
  const bool confined = !Roots().empty();
  const int fd = ::open(resolved.c_str(), flags | O_CLOEXEC | (confined ? O_NOFOLLOW : 0), mode);
  if (fd >= 0) return fd;
  if (errno == ENOENT || errno == ENOTDIR) return Status::NotFound(path + ": cannot open file: no such file");
  if (errno == ELOOP && confined) {
    return Status::InvalidArgument(path + ": became a symlink while being opened (allowed roots " +
                                   RootList(Roots()) + "); put the real file under a root");
  }
  return Status::IOError(path + ": cannot open: " + std::strerror(errno));
}

Status CreateDirectoriesConfined(const std::string& dir) {
  if (dir.empty()) return Status::InvalidArgument("an empty path names no directory; give a directory");
  FT_ASSIGN_OR_RETURN(std::string resolved, Confine(dir));
  std::error_code ec;
  if (fs::exists(resolved, ec) && !fs::is_directory(resolved, ec)) {
    return Status::IOError(dir + ": exists and is not a directory; cannot create it");
  }
  fs::create_directories(resolved, ec);
  if (ec) return Status::IOError(dir + ": cannot create directory: " + ec.message());
  return Status::OK();
}

Status RemoveAllConfined(const std::string& path) {
  FT_ASSIGN_OR_RETURN(std::string resolved, Confine(path));
  std::error_code ec;
  fs::remove_all(resolved, ec);
  if (ec) return Status::IOError(path + ": cannot delete: " + ec.message());
  return Status::OK();
}

}  // namespace ft
