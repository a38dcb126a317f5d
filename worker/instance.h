// This ft-worker's identity in its work dir:
//   <work_dir>/instance  a random value (128 bits, hex) made by the first
//                        ft-worker on this work dir and kept: Register.instance,
//                        the same after a restart, so ftd lets a restarted worker
//                        take back its id at once while refusing another process
//                        that registers the same --id (proto/ftune.proto).
//   <work_dir>/lock      held (flock) while the worker runs: two ft-workers on one
//                        work dir would share the instance, the job files and the
//                        exit journal.
//
// Thread safety: functions are thread-compatible; a WorkDirLock is owned by one thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"

namespace ft::worker {

// The work dir's instance (made and stored durably, owner-only, when absent or unreadable).
// IOError when it can be neither read nor written.
StatusOr<std::string> LoadOrCreateInstance(const std::string& work_dir);

class WorkDirLock {
 public:
  // Takes <work_dir>/lock, waiting up to `wait` for a holder that is going away (a worker being
  // restarted). FailedPrecondition naming the holder's pid and the fix when another process
  // keeps it; IOError when the lock file cannot be opened.
  static StatusOr<std::unique_ptr<WorkDirLock>> Acquire(const std::string& work_dir,
                                                        std::chrono::milliseconds wait);
  ~WorkDirLock();  // releases it
  WorkDirLock(const WorkDirLock&) = delete;
  WorkDirLock& operator=(const WorkDirLock&) = delete;

 private:
  explicit WorkDirLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace ft::worker
