// A leftover of LLVM's OpenMP runtime cleared before this process's first
// parallel region (common/).
//
// LLVM libomp (what clang's -fopenmp links, e.g. the sanitizer trees; GCC's
// libgomp has no such file) registers a process when OpenMP first starts, in
// /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>, and removes the file at a clean
// exit. A process killed while writing it (kill -9 right after a start, which
// ftune's preemption tests and real preemptions do) leaves it empty, and any
// later process given the same pid then aborts at its first parallel region:
// "OMP: Error #15: Initializing libomp.so.5, but found unknown library already
// initialized". Before this process has started OpenMP, a file under its own
// pid can only be such a leftover.
//
// Every file with an OpenMP region includes this header: its inline variable
// runs the check once per process, during static initialisation, before main
// and before any region. Success: the file is absent or a complete registration
// (libomp itself replaces one whose process is dead). An incomplete one is
// removed; a failure to remove it is ignored (libomp then reports it).
#pragma once

namespace ft {

// Removes an incomplete registration under this process's pid; true when one was removed.
bool ClearStaleOpenMpRegistration();

inline const bool kStaleOpenMpRegistrationChecked = ClearStaleOpenMpRegistration();

}  // namespace ft
