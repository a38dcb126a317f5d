// One training step of a job on a CUDA GPU, predicted without one (issue
// #33): the job's model (any shape: only config.json is read, no weights)
// runs one optimizer step — every micro-batch's forward and backward, the
// exact-sum fold's host copies, the gradient norm and AdamW, as
// Trainer::Step calls them — on the CUDA cost model
// (engine/model/cuda_cost.h), after one warm-up step that grows the
// workspaces. What it records is what the CUDA backend issues per category
// (launches, FLOPs, bytes), and from a GPU's published peaks the roofline
// time of each: `ft-train plan --gpu h100|h200|a100|l40s|4090` prints it.
//
// One rank's share: the micro-batches of `accumulation` (FSDP's gathers of
// other ranks' shards and the all-reduce are not in it).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine/job/job_spec.h"
#include "engine/model/cuda_cost.h"
#include "engine/model/model_config.h"

namespace ft {

struct StepCost {
  CostLedger ops;            // one optimizer step, per category
  int64_t tokens = 0;        // tokens a step trains on this rank (micro · seq · accumulation)
  int64_t parameters = 0;    // the model's parameters (6·N·tokens is a step's model FLOPs)
  int64_t device_bytes = 0;  // device memory the model, its activations and workspaces took
};

// Errors: what building the model or enabling its adapter reports
// (InvalidArgument for a target module the model lacks, ...).
StatusOr<StepCost> PredictCudaStep(const JobSpec& spec, const ModelConfig& config, int64_t micro_batch,
                                   int64_t accumulation);

// Bytes a step spends on conversions alone (typed staging, operand
// conversions, rounding passes, NF4 dequantization) and its kernel launches.
double ConversionBytes(const StepCost& cost);
int64_t Launches(const StepCost& cost);

// The table `ft-train plan --gpu` prints: per category calls, launches,
// GFLOP, GB and roofline ms on `gpu`, then the totals, the launches, the
// bytes converted, and the roofline's tokens/s and MFU bound.
std::string FormatStepCost(const StepCost& cost, const GpuSpec& gpu);

}  // namespace ft
