// Starting a child process with its output in a log file: the one spawn
// behind `ftctl up` (cli/embedded.cc) and the tests' Spawn
// (tests/support/process.h). Only libc is used.
//
// The child is started with posix_spawn, not fork: no pthread_atfork handler
// runs in it. That matters in a parent that links an OpenMP runtime (the e2e
// tests, which train in-process): LLVM libomp 14's fork handler registers the
// child under /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>, a file exec never
// removes, and a later child given the same pid then aborts with "OMP: Error
// #15 ... already initialized" before it runs. A failed exec is an error of
// SpawnChild (posix_spawn reports it), not a silent exit of the child.
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
// (no process could be made), NotFound / FailedPrecondition ("cannot run <path>: <reason>"
// when exec fails: missing, not executable). After an exec failure the same
// line is in the log and the child has been reaped.
StatusOr<pid_t> SpawnChild(const std::vector<std::string>& argv, const ChildOptions& options);

}  // namespace ft
