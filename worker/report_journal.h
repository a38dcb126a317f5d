// The worker's journal of attempt exits: <work_dir>/journal/<job>-e<epoch>.exit
// (rank r > 0 of a multi-rank attempt: <job>-e<epoch>-r<r>.exit),
// one serialized AttemptExited each (with its attempt credential: the
// directory is the worker's user's only), written durably before the report is
// sent. A worker restarted before ftd got the report (killed right after its
// trainer exited, or while ftd was down) puts the journal's exits into its
// next Register, so ftd learns how those attempts ended instead of treating
// them as lost; they are forgotten once ftd acknowledged that registration.
//
// Thread safety: thread-compatible (the worker calls it under its lock).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/ftune.pb.h"

namespace ft::worker {

// A job id made safe for a file name: every character but [A-Za-z0-9._-]
// becomes '_' ("job" when empty). Job files and journal entries use it.
std::string FileSafe(const std::string& id);

// "<FileSafe(job)>-e<epoch>", and "-r<rank>" for a rank > 0 of a multi-rank
// attempt: how a worker names an attempt's files (job file, journal entry).
std::string AttemptFileStem(const std::string& job_id, int64_t epoch, int rank);

class ReportJournal {
 public:
  explicit ReportJournal(std::string dir) : dir_(std::move(dir)) {}

  // Writes `e` durably (replacing an entry of the same attempt).
  Status Record(const ftune::v1::AttemptExited& e);
  // Every entry, oldest attempt first; unreadable entries are skipped (and logged).
  std::vector<ftune::v1::AttemptExited> Entries() const;
  // Removes the entry of one rank of an attempt (absent: nothing to do).
  void Forget(const std::string& job_id, int64_t epoch, int rank = 0);

 private:
  std::string Path(const std::string& job_id, int64_t epoch, int rank) const;
  std::string dir_;
};

}  // namespace ft::worker
