// The identity of the input files a run reads (training data, chat template,
// tokenizer, model files), so that a file changed under a run fails it
// instead of training on a silent mix of old and new contents.
//
// A file is identified by its stamp (device, inode, size, mtime and ctime,
// nanoseconds) taken before the run first read it and, for files the run
// hashed, the SHA-256 of the contents it read. Check() stats every file (a
// few microseconds each, cheap enough for every step); only a file whose
// stamp moved is read again: same contents (touched, copied back, replaced by
// an identical copy) keep the run going, other contents fail it.
//
// Failure: InvalidArgument (the job's input is wrong; another attempt would
// mix the same way), e.g.
//   data.train: /d/train.jsonl changed during the run: SHA-256 3f1a... at
//   start, 9bc0... now; the job cannot go on (or resume) on a silent mix of
//   old and new data: restore the file or submit a new job
// and for a file not hashed (model weights, too large to hash) the stamp
// fields that moved ("size 1024 -> 2048, modified ...").
//
// Thread safety: one thread at a time (Check updates the stamps it re-reads).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace ft {

struct FileStamp {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;  // last modification
  int64_t ctime_ns = 0;  // last status change: a write or a rename even when mtime is set back
  bool operator==(const FileStamp&) const = default;
};

// The stamp of `path` now (stat, following links). NotFound when it is gone,
// IOError naming the path otherwise.
StatusOr<FileStamp> StampFile(const std::string& path);

// What moved between two stamps, e.g. "size 10 -> 12, inode 5 -> 9" ("" when none).
std::string DescribeStampChange(const FileStamp& before, const FileStamp& after);

class InputFiles {
 public:
  // Watches `path`, read for `key` (a job.yaml key, e.g. "data.train" or
  // "model.path (tokenizer.json)"; "": messages name the path alone). `stamp` is the file as it was before
  // the run read it; `sha256` the hash of the contents read ("" when not hashed: then any move of its stamp
  // fails the run). A path already watched is not added twice.
  void Add(const std::string& key, const std::string& path, const FileStamp& stamp,
           const std::string& sha256);
  // Stamps `path`, then hashes it when `hash` is set, and Add()s it. Call
  // before the file is read; Check() afterwards tells whether it changed
  // meanwhile. Errors as StampFile's and Sha256File's.
  Status Watch(const std::string& key, const std::string& path, bool hash);

  // OK when every watched file still has its stamp, or has moved but holds
  // the same contents (its new stamp is kept). Otherwise InvalidArgument
  // naming the key, the file and both hashes (or the stamp fields that moved,
  // or that it is gone), and the fix.
  Status Check();

  // key -> SHA-256 of every hashed file (what a checkpoint records).
  std::map<std::string, std::string> Hashes() const;
  bool empty() const { return files_.empty(); }

 private:
  struct Watched {
    std::string key;
    std::string path;
    FileStamp stamp;
    std::string sha256;
  };
  Status CheckOne(Watched& w);
  std::vector<Watched> files_;
};

}  // namespace ft
