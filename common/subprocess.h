// Starting a child process with its output in a log file: the one fork/exec
// behind `ftctl up` (cli/embedded.cc) and the tests' Spawn
// (tests/support/process.h). Only libc is used.
//
// Everything the child needs (argv, environment, descriptors) is prepared
// before the fork, so between fork and exec the child makes only
// async-signal-safe calls (safe in a threaded parent). A close-on-exec pipe
// tells the parent whether exec worked, so a missing or non-executable
// program is an error of SpawnChild, not a silent exit of the child.
//
// Thread safety: SpawnChild may be called from any thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ft {

struct ChildOptions {
  // stderr (and stdout, unless !stdout_to_log) go here, appended; "" keeps the parent's.
  std::string log;
  std::vector<std::string> env;  // NAME=value entries added to (and overriding) the inherited ones
  bool stdout_to_log = true;     // false: stdout stays the parent's
  bool truncate_log = false;     // start the log empty instead of appending
  // {descriptor here, descriptor in the child} pairs, dup2'ed in the child
  // after the log (e.g. a pipe's read end as ft-train's --control-fd 3).
  std::vector<std::pair<int, int>> fds;
  // A process group of its own (setpgid), so a Ctrl-C at the terminal does not reach it.
  bool new_process_group = false;
};

// Starts argv[0] (a path: PATH is not searched) with `argv` as `options` say.
// Returns the child's pid once argv[0] is executing; the caller waits for it.
// Errors, each naming argv[0]: InvalidArgument (empty argv), IOError (the log
// cannot be opened: "cannot open log <path>: <reason>"), ResourceExhausted
// (fork failed), NotFound / FailedPrecondition ("cannot run <path>: <reason>"
// when exec fails: missing, not executable). After an exec failure the same
// line is in the log and the child has been reaped.
StatusOr<pid_t> SpawnChild(const std::vector<std::string>& argv, const ChildOptions& options);

}  // namespace ft
