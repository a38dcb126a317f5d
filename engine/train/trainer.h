// The training loop of ft-train: builds the model from a job, walks the data
// in global batches split into micro-batches, and applies optimizer steps
// with the math of shared/DESIGN.md (loss = Σ token CE over the global batch ÷
// its target tokens, so the micro-batch plan never changes the result).
//
// Multi-rank (DDP, issue #14): every rank of a job runs a Trainer with the
// same job and a Collective connecting the ranks. Each replicates the model,
// trains on its share of every global batch (rank r: sequences
// cursor + r·A·micro .. + (r+1)·A·micro, A = accumulation, so data order and
// dropout masks depend on the global sample index only), and all-reduces the
// gradients and the loss before the update, which every rank then applies
// identically. Rank 0 alone owns output.dir: it claims it, chooses the
// checkpoint to resume from (every rank loads it), writes metrics,
// checkpoints and outputs. Stop and checkpoint requests arriving at any rank
// are agreed on at each step boundary, so all ranks checkpoint and stop
// together.
//
// Thread safety: one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "engine/data/dataset.h"
#include "engine/data/mixture.h"
#include "engine/dist/collective.h"
#include "engine/dist/exact_sum.h"
#include "engine/job/checkpoint_interval.h"
#include "engine/job/exit_codes.h"
#include "engine/job/job_hash.h"
#include "engine/job/job_spec.h"
#include "engine/model/model.h"
#include "engine/text/tokenizer.h"
#include "engine/train/checkpoint.h"
#include "engine/train/early_stopping.h"
#include "engine/train/metrics_log.h"
#include "engine/train/objective.h"
#include "engine/train/optimizer.h"
#include "engine/train/output_owner.h"
#include "engine/train/reference_logprobs.h"
#include "engine/train/train_control.h"

namespace ft {

struct StepMetrics {
  int64_t step = 0;      // 1 = first optimizer step
  double loss = 0;       // token-weighted mean over the global batch, before the update
  double lr = 0;         // the rate this update used
  double grad_norm = 0;  // before clipping
  int64_t tokens = 0;    // target tokens in the global batch
  double tokens_per_s = 0;
  double step_seconds = 0;
  int64_t peak_bytes = 0;  // tracked peak since start
  std::map<std::string, int64_t>
      peak_by_category;     // weights, adapter, gradients, optimizer, activations, workspace
  int64_t tokens_seen = 0;  // target tokens trained on in the run so far, this step's included
  double loss_scale = 1;    // the scale this step's loss was multiplied by (fp16; 1 otherwise)
  bool skipped = false;     // fp16 gradients overflowed: no update (grad_norm is then not finite)
  // Of step_seconds, the time the ops waited for copy-stream transfers (the
  // memory techniques' copies not hidden behind compute; 0 without them).
  double copy_wait_seconds = 0;
  // Several ranks: of step_seconds, the time spent all-reducing the gradients
  // and the loss (host copies included); 0 with one rank.
  double allreduce_seconds = 0;
  double gather_seconds =
      0;  // FSDP: the step's all-gathers of frozen-weight shards (in forward and backward)
  // The objective's sums but the loss, each ÷ the step's normaliser (DPO: rewards and logps).
  std::map<std::string, double> objective_metrics;
};

// One evaluation on data.eval (a metrics.jsonl line of its own:
// {"step", "eval_loss", "eval_tokens", "eval_seconds"}).
struct EvalMetrics {
  int64_t step = 0;     // optimizer steps applied to the evaluated weights
  double loss = 0;      // Σ token cross-entropies over the evaluated rows ÷ their target tokens
  int64_t tokens = 0;   // target tokens evaluated
  int64_t batches = 0;  // micro-batches evaluated
  double seconds = 0;
  // The objective's other means (DPO: TRL's eval_rewards/*, eval_logps/*; engine/train/objective.h).
  std::map<std::string, double> objective_metrics;
};

struct BatchPlan {
  int64_t micro_batch = 0;
  int64_t accumulation = 0;
  int64_t world = 1;
};

// How Run() ended (besides failing).
enum class RunOutcome {
  kFinished,   // all steps done, outputs written
  kPreempted,  // a stop request: state checkpointed, process should exit "preempted"
};

class Trainer {
 public:
  // Loads the model, data and optional init adapter named by `spec`.
  // Every error names the file and field at fault. `ranks` connects this
  // rank to the others of a multi-rank job (null: one rank); its world must
  // equal resources.gpus. `control` (optional, not owned; set_control's)
  // is polled while the data is prepared (each line, and within a chat
  // template's render): a stop request ends Create with Cancelled within
  // about a second, before anything was written. The input files are
  // stamped before they are read (CheckInputs); one that changed while it
  // was loaded fails Create as CheckInputs does.
  static StatusOr<std::unique_ptr<Trainer>> Create(const JobSpec& spec,
                                                   std::unique_ptr<Collective> ranks = nullptr,
                                                   TrainControl* control = nullptr);

  // Runs one optimizer step. When `control` has a stop request whose deadline
  // does not leave time to finish this step's accumulation, the step is
  // abandoned (nothing changes) and *interrupted is set. FailedPrecondition
  // naming the step when the loss or the gradient norm is not finite (nothing
  // is applied), except an fp16 overflow, which skips the update by design.
  // InvalidArgument (CheckInputs) when an input file changed under the run:
  // checked after the step's data is read, before the update.
  Status Step(StepMetrics* metrics, bool* interrupted = nullptr);
  // OK while every input the run read is as it was when first read: the
  // data (data.train, data.eval), data.chat_template, and model.path's
  // config.json, weights and (when used) tokenizer files. A stat per file;
  // a file whose stat moved is hashed again (weights are not hashed: any
  // move fails). Otherwise InvalidArgument naming the job file, the key, the
  // file and both SHA-256s (or the stat fields that moved) and the fix
  // (engine/data/file_identity.h). Run checks it after every step, before
  // every checkpoint and before COMPLETE.json, so no checkpoint or output
  // ever holds a mix of old and new inputs.
  Status CheckInputs();
  // Evaluates the current weights on data.eval: the rows in file order (no
  // shuffle) in micro-batches of the plan's size, at most
  // train.eval_max_batches of them (0 = all), forward only without dropout.
  // Changes no weight, optimizer, data cursor or random state, so training is
  // bit-identical with and without evaluation. When `control` has a pending
  // stop, the evaluation is abandoned between micro-batches and *interrupted
  // is set. FailedPrecondition when the job has no data.eval.
  Status Evaluate(EvalMetrics* metrics, bool* interrupted = nullptr);
  // Resumes from the newest valid checkpoint under <output.dir>/checkpoints
  // (or `resume_dir` when set; see set_fencing), runs the remaining steps with checkpoints at
  // the job's cadence and on requests, writes <output.dir>/metrics.jsonl and a
  // progress line per step on stderr, then a final checkpoint and the outputs
  // (adapter/, model/ for full fine-tunes, merged/ when output.merge), and
  // COMPLETE.json last (engine/job/completion.h).
  // With data.eval, an evaluation line follows the step line of every
  // train.eval_every_steps-th step and of the last step. train.early_stopping
  // ends the run (finished) at the evaluation that reaches its patience: an
  // "early_stop" line, the final checkpoint and outputs of that step, and the
  // reason in COMPLETE.json; checkpoint.keep_best checkpoints each best
  // evaluation's step and retention keeps it (engine/train/early_stopping.h).
  // Aborted when a newer epoch took output.dir (fenced runs): nothing more
  // was written. FailedPrecondition when training diverges (Step's check, or
  // a non-finite weight when a checkpoint is taken): no such checkpoint and no
  // output is written.
  StatusOr<RunOutcome> Run(const std::string& resume_dir = "");
  // Writes the final outputs only (each directory atomically).
  Status WriteOutputs();

  // Makes this an attempt of `job_id` at `epoch` (> 0) under ftd: Run()
  // claims output.dir (engine/train/output_owner.h) and checks it before every
  // step and write. Resume then never loses the job: `resume_dir` (ftd's
  // committed checkpoint) or a newer verified one, whichever attempt wrote
  // it; the newest verified one when the committed one is missing or damaged;
  // step 0 when none verifies. A metrics "resume" event says which and why.
  // A COMPLETE.json of this job's math ends the run at once (finished).
  void set_fencing(const std::string& job_id, int64_t epoch);

  // Checkpoint state: host copies of everything resume needs, and back.
  CheckpointContents Capture(const std::string& reason);
  // Restores a checkpoint. InvalidArgument naming the job key when the
  // checkpoint was made with different training math, or naming the input
  // and both SHA-256s when an input it recorded (CheckInputs' hashed files)
  // now holds other contents.
  Status Restore(const CheckpointContents& c, const std::string& from);

  // Where stop/checkpoint requests come from (not owned; may be null).
  void set_control(TrainControl* control) { control_ = control; }
  std::string checkpoint_root() const;

  // Called in Step() after the gradients of the global batch are complete and
  // before clipping and the update (tests compare gradients with a reference).
  void set_grad_hook(std::function<void(int64_t step)> hook) { grad_hook_ = std::move(hook); }
  // checkpoint.every auto: the mean time between preemptions of the workers this run is on (ftd's
  // estimate, ft-train --mtbf-seconds); unset or 0, the prior (engine/job/checkpoint_interval.h).
  void set_mtbf_seconds(double seconds) { mtbf_seconds_ = seconds; }

  Model& model() { return *model_; }
  const Mixture& data() const { return *data_; }
  const Mixture* eval_data() const { return eval_data_.get(); }  // null without data.eval or val_fraction
  // DPO on a full fine-tune: the stored reference (null otherwise).
  const ReferenceLogProbs* reference() const { return reference_.get(); }
  AdamWOptimizer& optimizer() { return *optimizer_; }
  const BatchPlan& plan() const { return plan_; }
  int64_t total_steps() const { return total_steps_; }
  int64_t steps_done() const { return optimizer_->step(); }
  // The loss scale of the next step (1 unless model.dtype is fp16).
  double loss_scale() const { return loss_scale_; }
  // Rank 0 of a multi-rank job (or the only rank): the one that writes.
  bool leader() const { return ranks_->rank() == 0; }

 private:
  Trainer() = default;

  JobSpec spec_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamWOptimizer> optimizer_;
  std::unique_ptr<Tokenizer> tokenizer_;  // text, alpaca and chat formats; outlives data_
  std::unique_ptr<Mixture> data_;
  std::unique_ptr<ReferenceLogProbs> reference_;       // DPO on a full fine-tune: the stored reference
  std::unique_ptr<ReferenceLogProbs> eval_reference_;  // ... and data.eval's
  std::unique_ptr<Objective> objective_;               // what a step minimises (spec.train.objective)
  std::unique_ptr<Mixture> eval_data_;                 // data.eval (or val_fraction's rows), or null
  BatchPlan plan_;
  int64_t total_steps_ = 0;
  std::unique_ptr<Collective> ranks_;          // the job's ranks (SingleRank when alone)
  std::unique_ptr<ExactSum<float>> grad_sum_;  // train.gradient_sum exact: the step's gradients
  // Every gradient, flat, in host memory: page-locked (Backend::AllocHost, counted as host
  // gradients), so a micro-batch's copies run at the link's speed with no staging on a GPU.
  DeviceBuffer grad_host_;
  // FoldGradients' fold of grad_host_ into grad_sum_, running on its own thread while the next
  // micro-batch computes; declared after both (a std::async future's destructor waits for it).
  std::future<void> fold_;
  // Whether a stop request asks this one rank to abandon its step after `done` micro-batches
  // (the rest would not fit in the request's deadline).
  bool StopMidStep(int64_t done);
  // DPO on a full fine-tune: the reference log-probabilities of `data` (read from `path`)
  // (engine/train/reference_logprobs.h), read or computed with the weights as loaded; keyed by
  // what they depend on. Null otherwise.
  StatusOr<std::unique_ptr<ReferenceLogProbs>> StoredReference(const Dataset& data, const std::string& path);
  // Every gradient to grad_host_ (to_host) or back from it.
  void CopyGradients(bool to_host);
  // train.gradient_sum exact: this micro-batch's gradients copied to the host and zeroed on the
  // device; their fold into grad_sum_ (ExactSum::Add: 20 ns a value a core, 0.4 s for an 8B
  // model's r 16 adapter on 2 cores) runs on another thread while the next micro-batch computes.
  // The sum is the same whenever the fold runs (ExactSum is order-independent); WaitForFold is
  // called before anything else reads or writes grad_host_ or grad_sum_.
  void FoldGradients();
  void WaitForFold();
  // Exact sums of a one-term step (one rank, one micro-batch): the sum of one gradient is that
  // gradient (every float lies on ExactSum's grid) except that a -0 sums to +0 (and an infinity
  // to NaN: the step then fails or is skipped as it would have). The gradients stay on the
  // device, their -0s made +0 there (MakeZerosPositive), instead of a round trip through host
  // memory and a fold of every value: the same bits, without ~15 ns of host work a value.
  bool OneTermGradientSum() const;
  void MakeZerosPositive();
  DeviceBuffer zeros_;  // MakeZerosPositive's +0s, as many as the largest trainable tensor
  // The step's gradients and `loss` summed over every micro-batch of every rank (exactly, or in
  // fp32 with train.gradient_sum float), left in the trainable params' grads; `loss_sum` its sum.
  Status SumGradients(ExactSum<double>* loss, double* loss_sum);
  // Multi-rank: whether any rank wants `flags` (each 0 or 1), agreed by every rank.
  Status Agree(std::vector<double>* flags);
  // The steps of Create: the model with its weights and adapter (sharded under FSDP), the
  // training (and evaluation) data with the step count, the optimizer.
  Status BuildModel(const ModelConfig& config, std::shared_ptr<Backend> backend);
  Status OpenData(const ModelConfig& config);
  // Stamps (and hashes, the small ones) the files the run will read, before any is read; the
  // data files join once opened (their Dataset hashed them).
  Status WatchInputs();
  // A stop request at control_ (for data preparation); unset without one.
  std::function<bool()> StopRequested() const;
  // Restore's check of the inputs `saved` recorded against what this run read.
  Status CheckRestoredInputs(const TrainerState& saved, const std::string& from) const;
  void BuildOptimizer(std::shared_ptr<Backend> backend);
  // The steps of Run: claim output.dir (true when the job is complete already), resume and open
  // the log, then step, with requests, checkpoints and evaluations between steps, and finish
  // (the final checkpoint and outputs).
  StatusOr<RunOutcome> RunSteps(const std::string& resume_dir);
  StatusOr<bool> ClaimOutput();
  Status StartLog(const std::string& resume_dir);
  // A checkpoint (and stop) asked for through the control channel, agreed by every rank.
  enum class Request { kNone, kCheckpointed, kStop };
  StatusOr<Request> HandleRequest();
  // Logs the checkpoints made durable meanwhile and starts one when due after `step` (true then).
  StatusOr<bool> CheckpointDue(int64_t step, std::chrono::steady_clock::time_point last_checkpoint);
  // checkpoint.every: auto: whether the Young/Daly interval from C (CheckpointCost: the fixed
  // part of recent writes) and mtbf_seconds_ has passed `seconds` after the last checkpoint, or
  // a back-to-back probe is due (rank 0's vote; it notes the interval in metrics.jsonl when it
  // moves).
  StatusOr<bool> AutoIntervalPassed(int64_t step, double seconds);
  // After an automatic checkpoint: whether the next step's is a probe (ProbeDue).
  void AfterAutoCheckpoint(bool back_to_back);
  // The recent back-to-back write times: the writer's, or the resumed checkpoint's before it writes.
  std::vector<double> RecentFixed();
  // C as measured: the median of RecentFixed() and the mean of the recent writes (the writer's,
  // or the resumed checkpoint's before it writes).
  CheckpointCost MeasuredCost();
  // Whether a checkpoint of `step` comes the step after this process's last one.
  bool BackToBack(int64_t step) const { return last_written_step_ >= 0 && step == last_written_step_ + 1; }
  Status Finish();
  Status ResumeIfPossible(const std::string& resume_dir);
  // The checkpoint to resume from ("" = step 0): `committed` or the newest
  // verified one; a fenced run also records the resume note for metrics.
  std::string ChooseResumePoint(const std::string& committed);
  // True when COMPLETE.json shows this job finished (fenced runs); removes a stale one.
  StatusOr<bool> AlreadyComplete();
  // Rank 0 appends `line` to metrics.jsonl (other ranks: OK, nothing written).
  Status Log(const MetricsLine& line);
  // The metrics.jsonl line of a step.
  MetricsLine StepLine(const StepMetrics& m) const;
  // fp16: after a step, halves the loss scale on overflow, or doubles it
  // after loss_scale_growth_interval good steps in a row (torch's GradScaler).
  void UpdateLossScale(bool overflow);
  Status CheckpointNow(const std::string& reason, bool wait);
  // Logs which promise a resume from `saved` keeps: byte-identical training (same micro-batch
  // size, exact sums) or within 1e-6 (another micro-batch size, or fp32 sums at a new split).
  void LogResumeGuarantee(const TrainerState& saved) const;
  // output.merge: the base model with the adapter folded in, written to <output.dir>/merged.
  Status WriteMerged(const ModelOptions& options);
  // One event line per checkpoint made durable since the last call: the worker reports these as
  // committed, so a failed write fails the run.
  Status LogCompletedCheckpoints();
  Status OpenMetrics();
  // Evaluates when `step` is due (every eval_every_steps, and the last), logs the line and, when the
  // job acts on evaluations, records its verdict (ActOnEvaluation).
  Status EvaluateIfDue(int64_t step);
  // Folds evaluation `e` into eval_progress_: a new best asks for a checkpoint (keep_best), a
  // stop is noted in its stop_reason.
  Status ActOnEvaluation(const EvalMetrics& e);
  // After a resume: the evaluation of the resumed step when it was due and not counted (a stop
  // request abandoned it before the checkpoint), so the verdicts follow the uninterrupted run's.
  Status EvaluateMissedStep();
  // Early stopping ended the run: its event line and stderr note (again on each resume that finds it).
  Status LogEarlyStop();
  // output.adapter_from: best: the best checkpoint's weights into the model (rank 0, after the
  // final checkpoint), so the outputs are the best evaluation's. Its step (0 = the last step's).
  StatusOr<int64_t> LoadBestWeights();
  // A checkpoint's trainable values into the model (Restore's and LoadBestWeights' part).
  Status UploadWeights(const CheckpointContents& c, const std::string& from, bool moments);

  int64_t cursor_ = 0;                  // sequences consumed
  int64_t tokens_seen_ = 0;             // target tokens trained on
  double micro_seconds_ = 0;            // measured time of one micro-batch (moving average)
  double mtbf_seconds_ = 0;             // checkpoint.every auto's M (set_mtbf_seconds; 0 = the prior)
  double restored_mean_c_ = 0;          // the resumed checkpoint's mean write time (0: none)
  std::vector<double> restored_fixed_;  // and its recent back-to-back write times (C's fixed part)
  int64_t last_written_step_ = -1;      // the step of this process's last checkpoint (-1: none yet)
  int64_t auto_since_fixed_ =
      0;                        // automatic checkpoints since the last back-to-back one (kept across resumes)
  bool probe_due_ = false;      // AfterAutoCheckpoint: checkpoint the next step
  double auto_interval_s_ = 0;  // the auto interval in force (its checkpoints record it)
  double noted_interval_s_ = -1;      // the auto interval last written to metrics.jsonl
  EvalProgress eval_progress_;        // what the evaluations decided so far (checkpointed)
  bool best_checkpoint_due_ = false;  // keep_best: this step's evaluation is the best so far
  double loss_scale_ = 1;       // fp16's dynamic loss scale (train.loss_scale_init, then halved/doubled)
  int64_t growth_tracker_ = 0;  // good fp16 steps in a row at this scale
  std::function<void(int64_t)> grad_hook_;
  TrainControl* control_ = nullptr;
  InputFiles inputs_;                                                     // what the run read: CheckInputs
  std::unique_ptr<OutputOwner> owner_ = std::make_unique<OutputOwner>();  // unfenced until set_fencing
  std::string committed_dir_;               // the checkpoint ftd committed: retention keeps it
  std::optional<MetricsLine> resume_note_;  // fenced runs: a "resume" event for metrics.jsonl
  std::unique_ptr<MetricsLog> metrics_;     // rank 0, once open
  // Last: its destructor waits for a write in flight, which uses the members above.
  std::unique_ptr<CheckpointWriter> writer_;
};

// The model's options for `spec` on `backend` (dtype, NF4, checkpointing,
// offloads, attention form; one rank: no sharding) and its optimizer's
// hyperparameters: what a trainer builds, and what the cost model
// (engine/train/step_cost.h) runs.
ModelOptions JobModelOptions(const JobSpec& spec, std::shared_ptr<Backend> backend);
// train.attention as the backend's route request (flash and naive: ours).
AttentionRouteRequest AttentionRequest(AttentionKind kind);
OptimizerConfig JobOptimizerConfig(const JobSpec& spec);

// Chooses micro-batch and accumulation for `spec` (micro × accumulation ×
// world = global_batch_size exactly): the job's numbers when given, else the
// planner's choice for `device_bytes`. InvalidArgument when impossible,
// ResourceExhausted when nothing fits.
StatusOr<BatchPlan> ChooseBatchPlan(const JobSpec& spec, const ModelConfig& model, int64_t device_bytes,
                                    int64_t world = 1);

// Which side of data.val_fraction's split a source is opened for (DatasetOptions::holdout).
struct DataSplit {
  double holdout = 0;
  bool held_out = false;
};

// A data source of the job (data.train or data.eval, or one of their list's)
// through the job's pipeline: the source's format, field mapping and chat
// template (else data.chat_template), seq_len, packing, skip_bad_lines. For
// text, alpaca, chat and preference text the model's tokenizer is loaded into
// *tokenizer unless it already holds one. Errors name the file (and line) at
// fault; Cancelled when `stop_requested` (optional, polled per line and within
// template renders) said so.
StatusOr<std::unique_ptr<Dataset>> OpenJobSource(const JobSpec& spec, const ModelConfig& config,
                                                 const JobSpec::DataSource& source, const DataSplit& split,
                                                 std::unique_ptr<Tokenizer>* tokenizer,
                                                 const std::function<bool()>& stop_requested = {});
// Every source of `sources` (OpenJobSource), mixed (engine/data/mixture.h); errors name the source's key.
StatusOr<std::unique_ptr<Mixture>> OpenJobMixture(const JobSpec& spec, const ModelConfig& config,
                                                  const std::vector<JobSpec::DataSource>& sources,
                                                  Mixture::Mode mode, const DataSplit& split,
                                                  std::unique_ptr<Tokenizer>* tokenizer,
                                                  const std::function<bool()>& stop_requested = {});

}  // namespace ft
