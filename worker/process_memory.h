// Resident memory of a process tree, read from /proc: what the CPU device
// reports as "used" while a trainer runs with a fixed --cpu-memory.
//
// The tree of `root` is `root`, every process descended from it (by parent
// pid) and every process in its process group (ft-train runs in its own group,
// so a helper re-parented to init still counts). Each process's resident set
// is /proc/<pid>/statm's second field times the page size; pages shared
// between processes of the tree (libraries, copy-on-write) count once per
// process, so the sum may overstate a forked tree slightly.
//
// Success: the sum in bytes (0 when `root` has already gone). Failure:
// Unavailable when /proc cannot be listed. Processes that exit while being
// read are skipped. Thread-safe (no state).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace ft::worker {

StatusOr<int64_t> ProcessTreeResidentBytes(pid_t root);

// The sum over several trees, each process counted once. Errors as above.
StatusOr<int64_t> ProcessTreesResidentBytes(const std::vector<pid_t>& roots);

}  // namespace ft::worker
