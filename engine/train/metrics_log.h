// A run's <output.dir>/metrics.jsonl (lines: engine/job/metrics_line.h),
// written by rank 0's trainer.
//
// Open keeps the lines of the steps a resumed state holds and drops what a
// killed run logged past them (atomically: a kill during Open loses no kept
// line). Every Write checks the owner's fence first (a superseded trainer
// writes nothing: Aborted) and adds the owner's epoch to the line.
//
// Failure: every call returns the first error with the file named (IOError
// for a failed write or flush, e.g. a full disk): the trainer fails the run
// with it rather than go on with a log the worker reads checkpoints from.
// Thread safety: one trainer thread.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

#include "common/status.h"
#include "engine/job/metrics_line.h"

namespace ft {

class MetricsLog {
 public:
  // `fence` (optional) is checked before every line; `epoch` > 0 is written into every line.
  MetricsLog(std::string path, std::function<Status()> fence, int64_t epoch);

  // Truncates the log to the lines of steps ≤ `keep_through` and opens it for appending.
  Status Open(int64_t keep_through);
  bool is_open() const { return out_.is_open(); }
  // Appends `line` (flushed before returning).
  Status Write(MetricsLine line);

 private:
  std::string path_;
  std::function<Status()> fence_;
  int64_t epoch_ = 0;
  std::ofstream out_;
};

}  // namespace ft
