// What a checkpoint says about the run that wrote it, readable without the
// engine: trainer_state.json's format, the step-N directory names and the
// listing of a checkpoint root. ftd reads these to reconcile what a trainer
// committed; the trainer writes them (engine/train/checkpoint.h holds the
// rest of the format: tensors, MANIFEST.json, atomic writes, pruning).
//
// Failure: Corruption naming the file for an unreadable or foreign
// trainer_state.json; InvalidArgument for a format version this build does
// not read. Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace ft {

// Written last into a checkpoint directory: only a directory that has it counts.
inline constexpr const char* kCheckpointManifest = "MANIFEST.json";
// The version of trainer_state.json and MANIFEST.json this build writes and reads.
inline constexpr int kCheckpointFormatVersion = 1;

// TrainerState::reason of checkpoint.every auto's checkpoints: at the interval, and the probe
// the step after one, which measures the fixed part of C (engine/job/checkpoint_interval.h).
inline constexpr char kAutoReason[] = "every_auto";
inline constexpr char kAutoProbeReason[] = "every_auto_probe";

// TrainerState::reason of the checkpoint checkpoint.keep_best writes at an evaluation that
// improved the metric (when no other checkpoint falls on that step).
inline constexpr char kBestReason[] = "best";

// What the run's evaluations decided so far (train.early_stopping, checkpoint.keep_best;
// engine/train/early_stopping.h): trainer_state.json's "evaluation", so a resumed run decides as
// the uninterrupted one. Absent in older checkpoints and in jobs that act on no evaluation: fresh.
struct EvalProgress {
  std::string metric;             // the job's train.early_stopping.metric name; "" = nothing tracked
  int64_t last_step = 0;          // the step of the last evaluation counted (0 = none)
  int64_t best_step = 0;          // the step of the best evaluation (0 = none yet)
  double best_value = 0;          // and its value
  int64_t since_improvement = 0;  // evaluations since the last improvement of more than min_delta
  std::string stop_reason;        // early stopping ended the run here ("" = it did not)
};

// The non-tensor state of a run (trainer_state.json).
struct TrainerState {
  int64_t step = 0;    // optimizer steps completed
  int64_t cursor = 0;  // sequences consumed: the data position
  // Rows each data.train source had given at `cursor` (engine/data/mixture.h's Positions; a
  // pure function of the cursor, recorded so a resume can check it). Empty in older checkpoints.
  std::vector<int64_t> source_positions;
  int64_t tokens_seen = 0;  // target tokens trained on
  int64_t micro_batch = 0;  // the plan that produced this state (informative)
  int64_t accumulation = 0;
  int64_t world = 1;
  double loss_scale = 1.0;                      // dynamic loss scale (fp16); 1 otherwise
  int64_t loss_scale_growth_tracker = 0;        // good steps in a row at this scale (fp16)
  int64_t skipped_steps = 0;                    // steps skipped for overflow (fp16): not Adam updates
  std::string job_hash;                         // SHA-256 of the job's math keys
  std::map<std::string, std::string> job_math;  // key -> value of every key that defines the math
  // key -> SHA-256 of each input file the run hashed ("data.chat_template", "model.path
  // (tokenizer.json)", ...): a resume on other contents is refused (absent in older checkpoints).
  std::map<std::string, std::string> inputs;
  double last_checkpoint_seconds = 0;        // measured write time of the previous checkpoint
  double mean_checkpoint_seconds = 0;        // and the mean of the recent ones
  double fixed_checkpoint_seconds = 0;       // the median of the recent back-to-back ones (every auto's C)
  std::vector<double> recent_fixed_seconds;  // those back-to-back writes, oldest first (at most 16;
                                             // an older file's fixed_checkpoint_seconds alone)
  int64_t checkpoints_since_probe = 0;       // every auto: automatic checkpoints since the last probe
  bool back_to_back = false;                 // written the step after the previous checkpoint
  std::string reason;                        // "every_steps", "every_minutes", "signal", "final", ...
  double interval_seconds = 0;               // every_auto: the interval in force when it was taken
  double mtbf_seconds = 0;                   // every_auto: the M it was chosen with
  int64_t epoch = 0;                         // the attempt that wrote it (0: a plain ft-train run)
  EvalProgress evaluation;                   // the evaluations' decisions up to `step`
};

// trainer_state.json text, and back (`file` names it in errors).
std::string TrainerStateToJson(const TrainerState& s);
StatusOr<TrainerState> TrainerStateFromJson(const std::string& text, const std::string& file);

// "step-00001234".
std::string CheckpointName(int64_t step);

struct CheckpointEntry {
  int64_t step = 0;
  std::string dir;
};
// step-* directories under root, newest first (temporary ones ignored).
std::vector<CheckpointEntry> ListCheckpoints(const std::string& root);

// The trainer_state.json of a checkpoint that has its manifest (sizes and
// checksums not verified: cheap enough for ftd's reconciliation).
StatusOr<TrainerState> ReadCheckpointState(const std::string& dir);

// The epoch of the checkpoint in `dir` (its trainer_state.json), or -1 when unreadable.
int64_t CheckpointEpoch(const std::string& dir);

// checkpoint.keep_best's checkpoint under `root`: the one at the best step the newest readable
// checkpoint records, when it is there (its state in *state when given). NotFound otherwise.
StatusOr<CheckpointEntry> BestCheckpoint(const std::string& root, TrainerState* state = nullptr);

}  // namespace ft
