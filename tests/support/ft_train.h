// Test support for tests that run the real ft-train binary (FT_TRAIN_BIN) on
// small jobs: a shared random model, a job writer, ft-train processes and
// metrics reading, on top of tests/support/process.h. Every path lives under
// testing::TempDir(), prefixed with the test binary's name, so test binaries
// running side by side never share a directory.
//
// Thread safety: for a test's main thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace ft::testing_support {

// A tiny-llama model with random weights, made once per test binary.
const std::string& ModelDir();

// Writes <dir>/job.yaml (and data.jsonl beside it): LoRA with dropout and
// shuffling across several epochs, so the data cursor and the counter-based
// RNG are both exercised; output.dir is <dir>/out. Returns the job's path.
std::string WriteJob(const std::string& dir, const std::string& train_extra = "", int64_t every_steps = 3,
                     int64_t steps = 48, int64_t keep = 3);

// WriteJob's job as DPO (train.objective: dpo, beta 0.2) on 40 preference pairs of token ids
// written to <dir>/pairs.jsonl; `adapter` replaces the LoRA adapter line when given (e.g.
// "adapter: {type: full}").
std::string WriteDpoJob(const std::string& dir, const std::string& train_extra, int64_t every_steps,
                        int64_t steps, int64_t keep, const std::string& adapter = "");

// Makes the job at `job` (written by WriteJob) train on a mixture of three token sources:
// data.jsonl (weight 0.6) and two more written beside it, b.jsonl (0.3) and c.jsonl (0.1), 40
// rows each. WriteMixtureJob: WriteJob's job so changed.
void UseMixture(const std::string& job);
std::string WriteMixtureJob(const std::string& dir, const std::string& train_extra, int64_t every_steps,
                            int64_t steps, int64_t keep);

// Starts ft-train with `args`; its stderr is appended to <dir>/stderr.txt.
pid_t Spawn(const std::string& dir, const std::vector<std::string>& args);
// Starts ft-train with `args` + {"--control-fd", "3"}: fd 3 is the read end
// of a pipe whose write end (close-on-exec) goes to *control.
pid_t SpawnWithControl(const std::string& dir, std::vector<std::string> args, int* control);
// Waits for `pid`: its exit code, or 128 + the signal that killed it.
int WaitExit(pid_t pid);
// ft-train run JOB to its end.
int RunToEnd(const std::string& dir, const std::string& job);

// The step lines of <out>/metrics.jsonl, in order.
std::vector<nlohmann::json> StepLines(const std::string& out);
// The event lines of <out>/metrics.jsonl whose "event" is `event`, in order.
std::vector<nlohmann::json> EventLines(const std::string& out, const std::string& event);

}  // namespace ft::testing_support
