// Storage fencing for a job's output.dir (docs/ARCHITECTURE.md "Who owns
// output.dir").
//
// Every attempt of a job gets an epoch from ftd: unique and increasing per
// job. When its trainer starts, it writes <output.dir>/OWNER.json
// ({"job_id", "epoch", "pid", "host", "time_ms"}) atomically (a temporary
// named by epoch and pid, fsynced, renamed), and before every checkpoint
// write, rename, prune and final-output write it reads the token back
// (Check). When a newer epoch of the same job owns the directory, Check
// returns Aborted ("superseded"): the trainer stops at once without touching
// the directory again, and ft-train exits kExitSuperseded. A trainer started
// without an epoch (a plain `ft-train run`) is unfenced: it neither claims
// nor checks.
//
// The token names the job as well as the epoch: a directory another job
// owns is never taken (ftd refuses a second job for one output.dir at
// submit; this is the trainer's own guard). Claim refuses it as bad input
// naming that job, and Check sees another job's token as not ours
// (Aborted), so a trainer never writes, prunes or deletes (COMPLETE.json)
// in another job's directory. A token of an older epoch of the same job found
// by Check (two claims racing) is replaced by ours: the older trainer sees
// ours at its own next check.
//
// Thread safety: Check and Claim may be called from any thread (the
// checkpoint writer's included).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "common/status.h"

namespace ft {

struct OwnerToken {
  std::string job_id;
  int64_t epoch = 0;
  int64_t pid = 0;
  std::string host;
  int64_t time_ms = 0;
};

// <dir>/OWNER.json. NotFound when absent; Corruption when unreadable.
StatusOr<OwnerToken> ReadOwnerToken(const std::string& dir);

class OutputOwner {
 public:
  // An unfenced owner (epoch 0): Claim and Check always succeed.
  OutputOwner() = default;
  OutputOwner(std::string dir, std::string job_id, int64_t epoch);

  bool fenced() const { return epoch_ > 0; }
  int64_t epoch() const { return epoch_; }
  const std::string& job_id() const { return job_id_; }

  // Takes the directory (creating it): InvalidArgument naming the owner and
  // the fix when another job owns it; Aborted when a newer epoch of this job
  // already owns it; IOError when the token cannot be written.
  Status Claim();
  // OK while this epoch owns the directory; Aborted naming the newer owner
  // otherwise. Re-claims over an older epoch's token (see above).
  Status Check();

 private:
  Status WriteToken();
  Status Superseded(const OwnerToken& t) const;
  Status AnotherJobs(const OwnerToken& t) const;

  std::string dir_;
  std::string job_id_;
  int64_t epoch_ = 0;
  std::mutex mu_;
};

}  // namespace ft
