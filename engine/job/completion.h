// The completion record: <output.dir>/COMPLETE.json, written last by a
// trainer that finished every step, after its outputs (adapter/, model/,
// merged/) are in place:
//   {"format": "ftune-complete", "job_id", "job_hash", "epoch", "steps",
//    "files": {"adapter/adapter_model.safetensors": {"bytes", "sha256"}, ...},
//    "stop_reason"?: why it ended before train.max_steps (early stopping),
//    "adapter_step"?: the step the output weights are from when not `steps`
//    (output.adapter_from: best)}
// It is how a finished run is recognised when its report was lost: ftd
// (reconciliation) and a re-started trainer read it, and a record whose
// job_hash is another job's never counts.
//
// Thread safety: free functions, thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace ft {

struct CompletionRecord {
  std::string job_id;
  std::string job_hash;
  int64_t epoch = 0;
  int64_t steps = 0;
  struct File {
    uint64_t bytes = 0;
    std::string sha256;
  };
  std::map<std::string, File> files;  // relative to the output directory
  std::string stop_reason;            // "" = the run trained every step
  int64_t adapter_step = 0;           // the step the outputs' weights are from (0 = steps)
};

// Writes COMPLETE.json atomically for every file under `output_dirs`
// (relative to `output_dir`, e.g. "adapter"), with their sizes and SHA-256.
Status WriteCompletion(const std::string& output_dir, CompletionRecord record,
                       const std::vector<std::string>& output_dirs);

// COMPLETE.json as written. NotFound when absent; Corruption when unreadable.
StatusOr<CompletionRecord> ReadCompletion(const std::string& output_dir);

// OK when COMPLETE.json exists, names `job_hash`, and every file it lists
// exists with its size (and, with `checksums`, its SHA-256). NotFound when
// there is none; FailedPrecondition (naming the file or the other job)
// otherwise.
StatusOr<CompletionRecord> VerifyCompletion(const std::string& output_dir, const std::string& job_hash,
                                            bool checksums);

// Removes COMPLETE.json (atomically: a rename to a trash name first). OK when absent.
Status RemoveCompletion(const std::string& output_dir);

}  // namespace ft
