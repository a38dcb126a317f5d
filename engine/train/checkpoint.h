// Checkpoints: the unit of resumability (shared/DESIGN.md "Checkpoints").
//
// A checkpoint is <root>/step-00001234/ holding
//   adapter_model.safetensors + adapter_config.json   (LoRA; loadable by PEFT)
//   model.safetensors + config.json                   (full fine-tunes)
//   optimizer.safetensors                             (Adam moments, "<param>.exp_avg[_sq]")
//   trainer_state.json                                (step, cursor, tokens, plan, job math, ...)
//   MANIFEST.json                                     (size + SHA-256 of every file; written last)
// It is written under a temporary name (.tmp-step-….e<epoch>.<pid>), every
// file and the directory fsynced, then renamed into place; only a directory
// whose manifest verifies counts. Writing happens from host copies
// (CheckpointContents), so a background thread can write while training
// continues.
//
// Ownership (docs/ARCHITECTURE.md "Who owns output.dir"): every write,
// rename and removal is preceded by the caller's fence (OutputOwner::Check),
// so a superseded trainer stops before touching the directory. Removal is
// atomic: a checkpoint is renamed to .trash-step-….e<epoch>.<pid> first, so
// an interrupted prune never leaves a step-* directory without its manifest.
//
// Thread safety: the free functions are thread-compatible; CheckpointWriter
// is used from one trainer thread (its worker thread is internal).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "engine/job/checkpoint_state.h"

namespace ft {

struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct CheckpointContents {
  TrainerState state;
  std::vector<HostTensor> model;      // adapter (PEFT keys) or full weights (HF names)
  std::vector<HostTensor> optimizer;  // "<param>.exp_avg", "<param>.exp_avg_sq"
  std::string adapter_config_json;    // LoRA: adapter_config.json text
  std::string model_config_json;      // full: config.json text
};

// OK while the caller may write in the directory; Aborted once superseded.
using Fence = std::function<Status()>;

// Writes `c` as <root>/step-N atomically (see above); `fence` (optional) is
// checked before the write starts and again before the rename. An existing
// step-N that verifies and has the same job_hash is kept as it is (training
// is deterministic: it holds this state); a damaged one is replaced only
// after the new one is complete. `seconds` (optional) receives the wall time.
Status WriteCheckpoint(const std::string& root, const CheckpointContents& c, const Fence& fence = {},
                       double* seconds = nullptr);

// OK when <dir>/MANIFEST.json exists and every file it lists has its size
// and SHA-256; Corruption naming the file otherwise.
Status VerifyCheckpoint(const std::string& dir);

// Reads a verified checkpoint back into host copies.
StatusOr<CheckpointContents> ReadCheckpoint(const std::string& dir);

// The newest checkpoint that verifies, or NotFound. Each damaged one skipped
// on the way is described in *skipped (file and reason).
StatusOr<CheckpointEntry> FindNewestValidCheckpoint(const std::string& root,
                                                    std::vector<std::string>* skipped);

// What retention may remove.
struct Retention {
  int64_t keep = 1;                        // newest checkpoints kept
  std::vector<std::string> protect;        // never removed: e.g. the one just written
  std::function<std::string()> committed;  // ftd's committed checkpoint, read when the prune runs
  int64_t epoch = 0;                       // the pruner's epoch: a newer epoch's checkpoints and temporaries
                                           // are never touched (0: unfenced, every epoch is older)
  Fence fence;                             // checked before each removal
};
// Removes all but the `keep` newest checkpoints (never a protected one or a
// newer epoch's), each by rename to a trash name and then deletion, and the
// temporaries and trash left by this or older epochs' processes.
Status PruneCheckpoints(const std::string& root, const Retention& r);

// Writes checkpoints on a background thread, one at a time.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(std::string root);
  ~CheckpointWriter();  // waits for a write in flight

  // Waits for the previous write, then starts writing `c` and pruning by
  // `r` (which protects the new checkpoint too). The previous write's status
  // is returned (OK for the first).
  Status Submit(CheckpointContents c, Retention r);
  // Waits for the write in flight; returns its status.
  Status Wait();
  // Seconds the last finished write took (0 before the first).
  double last_seconds();
  // The mean of the last kRecentWrites finished writes' seconds (0 before the first): one write
  // time is noisy (a slow fsync), their mean is the checkpoint's expected cost.
  double mean_seconds();
  static constexpr size_t kRecentWrites = 16;
  // The last kRecentWrites back-to-back writes' seconds, oldest first (state.back_to_back: one
  // step after the previous checkpoint); their median (MedianSeconds, 0 before the first) is
  // the checkpoint's fixed cost. A write's time also grows with the time since the previous one
  // (its fsync flushes what the node wrote meanwhile), a part that costs the same per second
  // whatever the interval; the fixed part is what an interval trades against lost work.
  std::vector<double> recent_fixed();
  // Starts from a resumed run's measurements: its mean write time (0: none) stands in for the
  // kRecentWrites writes until new ones replace it; its back-to-back writes continue as they
  // were. Call before the first Submit.
  void Seed(double mean_seconds, const std::vector<double>& recent_fixed);
  // True when no write is in flight (a Submit would not wait).
  bool idle();

  struct Completed {
    int64_t step = 0;
    double seconds = 0;
    std::string reason;
    std::string dir;
    double interval_seconds = 0;  // TrainerState::interval_seconds and mtbf_seconds
    double mtbf_seconds = 0;
    bool back_to_back = false;  // TrainerState::back_to_back
  };
  // Checkpoints made durable since the last call, oldest first.
  std::vector<Completed> TakeCompleted();

 private:
  void Loop();

  std::string root_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;                  // GUARDED_BY(mu_)
  bool has_job_ = false;               // GUARDED_BY(mu_)
  bool quit_ = false;                  // GUARDED_BY(mu_)
  CheckpointContents job_;             // GUARDED_BY(mu_)
  Retention retention_;                // GUARDED_BY(mu_)
  Status last_status_;                 // GUARDED_BY(mu_)
  double last_seconds_ = 0;            // GUARDED_BY(mu_)
  std::deque<double> recent_seconds_;  // GUARDED_BY(mu_), at most kRecentWrites
  std::deque<double> recent_fixed_;    // GUARDED_BY(mu_), back-to-back writes, at most kRecentWrites
  std::vector<Completed> completed_;   // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace ft
