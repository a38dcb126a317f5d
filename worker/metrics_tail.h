// Follows a line-oriented file that another process appends to (ft-train's
// metrics.jsonl) and returns each complete line once.
//
// Lines already in the file when following starts are not returned (call
// SkipExisting() before the writer starts). A trailing line without its
// newline is held back until the newline arrives. When the file shrinks or is
// replaced (another inode: ft-train rewrites it on resume, keeping only the
// lines of the restored steps), it is read again from the start, and its
// leading lines that were seen before are skipped, so kept lines are not
// returned twice while everything the writer appends afterwards is.
//
// Thread safety: one thread at a time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/status.h"

namespace ft::worker {

class MetricsTail {
 public:
  explicit MetricsTail(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  // Marks every line the file holds now as seen. A missing file is fine.
  Status SkipExisting();

  // Appends the complete lines (without their '\n') that arrived since the
  // last call to *lines. OK when the file does not exist (yet); IOError when
  // it exists but cannot be read.
  Status Poll(std::vector<std::string>* lines);

 private:
  // Reads from offset_ to the end into partial_, splitting off complete lines.
  Status ReadNew(std::vector<std::string>* lines, bool deliver);
  void Reset();

  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;  // 0: not opened yet
  int64_t offset_ = 0;
  std::string partial_;              // bytes after the last '\n'
  bool skipping_prefix_ = false;     // after a reset: skip lines seen before
  std::unordered_set<size_t> seen_;  // hashes of every line seen
};

}  // namespace ft::worker
