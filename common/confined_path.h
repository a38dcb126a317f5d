// Path confinement: every file the trainer opens or creates must resolve,
// at the moment it is opened, to a place beneath one of the allowed roots
// (ftd's --allowed-root, handed to ft-train as --allowed-root flags).
//
// ConfinedPath() resolves a path as the kernel would (symlinks and ".." of its
// existing part, with realpath) and refuses a result outside every root; the
// caller then opens the *resolved* path, with O_NOFOLLOW on its last component
// (OpenConfined does both). A symlink inside a root that points out of it, or
// a parent directory swapped for such a symlink after submit, is refused when
// the file is opened, not only at submit. A symlink swapped in between the
// resolution and the open of the same call is the remaining window; the last
// component's O_NOFOLLOW closes it for that component.
//
// With no roots nothing is confined: paths are returned unchanged and opens
// follow symlinks as usual (ft-train run by hand, ftd without --allowed-root).
//
// Thread safety: SetProcessAllowedRoots() is called once, before other
// threads start; everything else is safe to call from any thread.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace ft {

// The resolved absolute form of `path` when it lies beneath one of `roots`
// (each resolved too); `path` unchanged when `roots` is empty. The part of
// `path` that does not exist yet is appended as written and must not hold "..".
// InvalidArgument naming the path, where it resolves to and the roots when it
// leads outside them (or through a symlink that leads nowhere).
StatusOr<std::string> ConfinedPath(const std::string& path, const std::vector<std::string>& roots);

// Whether the absolute, normalised `path` is `root` or lies beneath it,
// component by component ("/a/bc" is not beneath "/a/b"). Resolves nothing.
bool PathIsBeneath(const std::string& path, const std::string& root);

// The process's roots (ft-train: its --allowed-root flags). Empty by default.
void SetProcessAllowedRoots(std::vector<std::string> roots);
const std::vector<std::string>& ProcessAllowedRoots();
// ConfinedPath(path, ProcessAllowedRoots()).
StatusOr<std::string> Confine(const std::string& path);

// Opens `path` confined to the process's roots: open(2) of the resolved path
// with `flags` | O_CLOEXEC, plus O_NOFOLLOW when roots are set. Returns the
// descriptor (the caller closes it). NotFound when it does not exist,
// InvalidArgument when confinement refuses it or its last component became a
// symlink, IOError otherwise; each names the path.
StatusOr<int> OpenConfined(const std::string& path, int flags, int mode = 0644);

// Creates `dir` and its missing parents, confined to the process's roots
// (checked before anything is created). InvalidArgument when it exists and
// is not a directory (or confinement refuses it), IOError otherwise; each
// names the directory.
Status CreateDirectoriesConfined(const std::string& dir);
// Removes `path` and what it holds (symlinks inside are removed, not
// followed), confined to the process's roots; absent is OK. IOError or
// InvalidArgument naming the path.
Status RemoveAllConfined(const std::string& path);

}  // namespace ft
