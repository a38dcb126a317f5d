// ft-train: the training engine's command line (the same binary the worker spawns).
//
//   ft-train run JOB.yaml [--resume DIR] [--control-fd N] [--stop-grace S]
//                         [--job-id ID --epoch N] [--allowed-root DIR ...]
//                         [--world N --rank R --rendezvous HOST:PORT [--dist-host ADDR]
//                          [--dist-backend gloo|nccl]]
//                                              train locally, no daemon; resumes from
//                                              the newest valid checkpoint (with an
//                                              epoch: an attempt under ftd, fenced);
//                                              with --world, one rank of a DDP job
//                                              (one process per rank; rank 0 serves
//                                              the rendezvous at HOST:PORT); with
//                                              --allowed-root, every file the run
//                                              opens or writes must resolve under
//                                              one of them when opened (ftd's roots)
//   ft-train plan JOB.yaml --device-memory 24GiB [--device cpu|cuda] [--world N] [--gpu h100|...]
//                                              memory breakdown and batch plan (config.json only);
//                                              with --gpu the CUDA step's predicted cost (step_cost.h)
//   ft-train make-model (--preset tiny-llama | --config CONFIG.json) --out DIR [--dtype f32|bf16] [--seed N]
//   ft-train tokenize --model DIR|tokenizer.json [--add-special-tokens] [--decode]
//   ft-train tokenize --job JOB.yaml [--set k=v]...   index the job's data; rows, tokens, shares
//                                              JSON strings in on stdin, id arrays out (or back)
//   ft-train generate --model DIR [--adapter DIR] [--prompt TEXT] [--chat] ...
//                                              text from the model, streamed (generate_command.h)
//
// Exit codes (engine/job/exit_codes.h): 0 finished; 1 failed (reason on stderr);
// 2 bad input or usage (an input file changed during the run among them); 3
// preempted: stopped after a checkpoint on SIGTERM, SIGUSR1, SIGINT or a
// "stop" on the control channel (or stopped while preparing the data, before
// anything was trained); 4 superseded: a newer
// epoch owns output.dir; 5 environment: an I/O error (disk full, file gone);
// 6 rank lost: one rank of a multi-rank run whose peers or rendezvous failed.
// An I/O error while an input the job names (data.train, model.path, ...) is
// gone is the job's (2), not the environment's: retrying would not help.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "common/confined_path.h"
#include "common/device_kind.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "engine/command/generate_command.h"
#include "engine/command/tokenize_command.h"
#include "engine/io/hf_model.h"
#include "engine/job/exit_codes.h"
#include "engine/job/job_spec.h"
#include "engine/job/planner.h"
#include "engine/model/compute_dtype.h"
#include "engine/model/memory.h"
#include "engine/train/step_cost.h"
#include "engine/train/trainer.h"

namespace ft {

// --dist-backend: how the ranks of a multi-rank run talk.
enum class DistBackend { kGloo, kNccl };
template <>
struct EnumTraits<DistBackend> {
  static constexpr std::string_view kWhat = "--dist-backend";
  static constexpr EnumEntry<DistBackend> kTable[] = {
      {"gloo", DistBackend::kGloo, "TCP, any device (the default)"},
      {"nccl", DistBackend::kNccl, "CUDA ranks, one GPU each"},
  };
};

}  // namespace ft

namespace {

int Fail(const ft::Status& s, bool multi_rank = false) {
  std::fprintf(stderr, "ft-train: %s\n", s.ToString().c_str());
  if (s.IsAborted()) return ft::kExitSuperseded;
  // A stop while the data was prepared: nothing was trained or written, the last checkpoint stands.
  if (s.code() == ft::Status::Code::kCancelled) return ft::kExitPreempted;
  // Collectives and the rendezvous fail Unavailable (engine/dist/collective.h).
  if (multi_rank && s.code() == ft::Status::Code::kUnavailable) return ft::kExitRankLost;
  if (s.code() == ft::Status::Code::kIOError) return ft::kExitEnvironment;
  const bool bad_input =
      s.IsInvalidArgument() || s.IsNotFound() || s.code() == ft::Status::Code::kUnimplemented;
  return bad_input ? ft::kExitBadInput : ft::kExitFailed;
}

// `s` unchanged, unless it is an I/O error and an input file the job names is
// gone: then NotFound naming the key and the path, so the job fails with the
// reason instead of being retried as an environment failure without end.
ft::Status ExplainMissingInput(const ft::Status& s, const ft::JobSpec& spec) {
  if (s.code() != ft::Status::Code::kIOError) return s;
  for (const auto& [key, path] : ft::JobInputPaths(spec)) {
    std::error_code ec;
    if (path.empty() || std::filesystem::exists(path, ec) || ec) continue;
    return ft::Status::NotFound(spec.file + ": " + key + ": '" + path + "' no longer exists (" +
                                std::string(s.message()) +
                                "); restore it or submit the job again with another path");
  }
  return s;
}

// OK when every root is an existing directory; they become the process's roots.
ft::Status SetRoots(const std::vector<std::string>& roots) {
  for (const std::string& r : roots) {
    std::error_code ec;
    if (!std::filesystem::is_directory(r, ec)) {
      return ft::Status::InvalidArgument("--allowed-root " + r + ": not a directory");
    }
  }
  ft::SetProcessAllowedRoots(roots);
  return ft::Status::OK();
}

struct RunFlags {
  std::string job_file;
  std::vector<std::string> overrides;  // --set KEY=VALUE
  std::string resume_dir;
  int control_fd = -1;
  double stop_grace = 10;
  std::string job_id;
  int64_t epoch = 0;
  int world = 1;           // ranks of a multi-rank job
  int rank = 0;            // this process's rank
  std::string rendezvous;  // host:port of rank 0's store
  std::string dist_host;   // the address the other ranks reach this one at ("" = the host name's)
  double dist_timeout = 120;
  ft::DistBackend dist_backend = ft::DistBackend::kGloo;
  std::vector<std::string> allowed_roots;  // --allowed-root: confine every open to these
  double mtbf_seconds = 0;                 // checkpoint.every auto's M (0 = the prior)
};

int RunJob(const RunFlags& flags) {
  ft::TrainControl control;
  control.InstallSignalHandlers(flags.stop_grace);  // before loading: a signal during loading still counts
  if (flags.control_fd >= 0) control.StartControlFd(flags.control_fd);
  auto job = ft::LoadJobWithOverrides(flags.job_file, flags.overrides);
  if (!job.ok()) return Fail(job.status());
  // After the job file (the worker's, outside the roots): from here on every open is confined.
  if (ft::Status s = SetRoots(flags.allowed_roots); !s.ok()) return Fail(s);
  std::unique_ptr<ft::Collective> ranks;
  if (flags.world > 1) {
    ft::RendezvousSpec r;
    r.rank = flags.rank;
    r.world = flags.world;
    r.address = flags.rendezvous;
    r.host = flags.dist_host;
    // The attempt's namespace: ranks of another attempt at the same address never pair up.
    r.name =
        "ftune/" + (flags.epoch > 0 ? flags.job_id + "/" + std::to_string(flags.epoch) : std::string("run"));
    r.timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.dist_timeout * 1000));
    auto connected = flags.dist_backend == ft::DistBackend::kNccl ? ft::ConnectNccl(r) : ft::ConnectGloo(r);
    if (!connected.ok()) {
      return Fail(connected.status().WithContext("--rendezvous " + flags.rendezvous), /*multi_rank=*/true);
    }
    ranks = std::move(*connected);
  } else if (flags.rank != 0) {
    return Fail(ft::Status::InvalidArgument("--rank " + std::to_string(flags.rank) + " needs --world > 1"));
  }
  auto trainer = ft::Trainer::Create(job->spec, std::move(ranks), &control);  // a stop while loading counts
  if (!trainer.ok()) return Fail(ExplainMissingInput(trainer.status(), job->spec), flags.world > 1);
  (*trainer)->set_mtbf_seconds(flags.mtbf_seconds);
  if (flags.epoch > 0) (*trainer)->set_fencing(flags.job_id, flags.epoch);
  auto outcome = (*trainer)->Run(flags.resume_dir);
  if (!outcome.ok()) return Fail(ExplainMissingInput(outcome.status(), job->spec), flags.world > 1);
  if (*outcome == ft::RunOutcome::kPreempted) return ft::kExitPreempted;
  std::fprintf(stderr, "ft-train: finished %lld steps; outputs in %s\n",
               static_cast<long long>((*trainer)->steps_done()), job->spec.output.dir.c_str());
  return ft::kExitFinished;
}

// libgomp's idle threads spin by default, which steals the cores OpenBLAS and
// the other ranks need on a loaded machine (measured: 2-10x slower steps).
// The policy is read when the library loads, so set it and re-exec once.
void PreferPassiveOpenMpThreads(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // only returns on failure: carry on as we are
}

// The CUDA step's cost on `gpu` (engine/train/step_cost.h) for the plan's micro-batch and accumulation.
int PrintGpuCost(const ft::JobSpec& spec, const ft::ModelConfig& config, const ft::BatchPlanChoice& plan,
                 const ft::GpuSpec& gpu) {
  auto cost = ft::PredictCudaStep(spec, config, plan.micro_batch, plan.accumulation);
  if (!cost.ok()) return Fail(cost.status());
  std::printf("%s", ft::FormatStepCost(*cost, gpu).c_str());
  return ft::kExitFinished;
}

int Plan(const std::string& job_file, const std::vector<std::string>& overrides,
         const std::string& device_memory, std::string device, int64_t world, const std::string& gpu_key) {
  auto job = ft::LoadJobWithOverrides(job_file, overrides);
  if (!job.ok()) return Fail(job.status());
  const ft::JobSpec* spec = &job->spec;
  auto config = ft::ReadHfConfig(spec->model.path);
  if (!config.ok()) return Fail(config.status());
  std::optional<ft::GpuSpec> gpu;
  if (!gpu_key.empty()) {
    auto found = ft::FindGpu(gpu_key);
    if (!found.ok()) return Fail(found.status().WithContext("--gpu"));
    gpu = *found;
    device = "cuda";
  }
  int64_t bytes = 0;
  if (!device_memory.empty()) {
    auto parsed = ft::ParseBytes(device_memory);
    if (!parsed.ok()) return Fail(parsed.status().WithContext("--device-memory"));
    bytes = *parsed;
  } else if (gpu) {
    bytes = gpu->memory_bytes;
  } else {
    auto host = ft::HostAvailableBytes();
    if (!host.ok()) return Fail(host.status());
    bytes = *host;
  }
  auto kind = ft::ParseDeviceKind(device);
  if (!kind.ok()) return Fail(kind.status().WithContext("--device"));
  ft::PlanRequest request = ft::PlanRequestFromJob(*spec, *config, *kind, world);
  ft::BatchPlanChoice choice;
  if (spec->train.micro_batch_size > 0) {
    // A fixed micro-batch: report its memory and whether it fits.
    choice = {spec->train.micro_batch_size,
              spec->train.global_batch_size / (spec->train.micro_batch_size * world), world,
              ft::PredictMemory(request, spec->train.micro_batch_size), bytes};
  } else {
    auto chosen = ft::ChooseMicroBatch(request, bytes);
    if (!chosen.ok()) return Fail(chosen.status());
    choice = *chosen;
  }
  std::printf("%s", ft::FormatPlan(request, choice).c_str());
  if (choice.memory.total() > bytes) {
    std::printf("does NOT fit: micro_batch_size %lld needs %s\n", static_cast<long long>(choice.micro_batch),
                ft::FormatBytes(choice.memory.total()).c_str());
    return ft::kExitFailed;
  }
  return gpu ? PrintGpuCost(*spec, *config, choice, *gpu) : ft::kExitFinished;
}

int MakeModel(const std::string& preset, const std::string& config_file, const std::string& out,
              ft::DType dtype, uint64_t seed, int64_t vocab) {
  // A preset, or a real architecture's config.json (or the directory holding one); random weights.
  std::string what = preset;
  auto read = [&]() -> ft::StatusOr<ft::ModelConfig> {
    if (config_file.empty()) return ft::PresetModelConfig(preset);
    what = config_file;
    if (std::filesystem::is_directory(what)) what = (std::filesystem::path(what) / "config.json").string();
    FT_ASSIGN_OR_RETURN(std::string text, ft::ReadFileToString(what));
    return ft::ParseHfConfig(text, what);
  };
  auto config = read();
  if (!config.ok()) return Fail(config.status());
  if (vocab > 0) config->vocab_size = vocab;
  // Streamed: each tensor made and written a chunk at a time, never the whole model in memory.
  ft::Status s = ft::WriteRandomHfModel(out, *config, dtype, seed);
  if (!s.ok()) return Fail(s);
  std::fprintf(stderr, "ft-train: wrote %s model to %s\n", what.c_str(), out.c_str());
  return 0;
}

// ft-train run's options into *flags.
CLI::App* AddRunCommand(CLI::App& app, RunFlags* flags) {
  CLI::App* run =
      app.add_subcommand("run", "train a job.yaml locally (resuming from its newest valid checkpoint)");
  run->add_option("job", flags->job_file, "job.yaml")->required();
  run->add_option("--set", flags->overrides,
                  "override a job.yaml key, e.g. --set train.lr=1e-4 --set data.seq_len=1024 (repeatable)");
  run->add_option("--resume", flags->resume_dir,
                  "resume from this checkpoint directory instead of the newest");
  run->add_option("--control-fd", flags->control_fd,
                  "read JSON-line control commands from this file descriptor");
  run->add_option("--stop-grace", flags->stop_grace,
                  "seconds a stop signal allows to finish the current step");
  run->add_option("--mtbf-seconds", flags->mtbf_seconds,
                  "checkpoint.every auto: the mean time between preemptions of this run's workers (ftd "
                  "hands it over; default: the 1-hour prior)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--job-id", flags->job_id, "the job this run is an attempt of (with --epoch)");
  run->add_option("--epoch", flags->epoch,
                  "the attempt's fencing epoch: claim output.dir, stop when a newer epoch owns it")
      ->check(CLI::PositiveNumber);
  run->add_option("--world", flags->world, "ranks of a multi-rank (DDP) job: one ft-train per rank")
      ->check(CLI::Range(1, 65536));
  run->add_option("--rank", flags->rank, "this process's rank, 0 .. world-1 (rank 0 writes the outputs)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--rendezvous", flags->rendezvous,
                  "HOST:PORT where rank 0 serves the rendezvous store (every rank gives the same)");
  run->add_option("--dist-host", flags->dist_host,
                  "the address the other ranks reach this rank at (default: the host name's)");
  run->add_option_function<std::string>(
         "--dist-backend",
         [flags](const std::string& name) { flags->dist_backend = *ft::ParseEnum<ft::DistBackend>(name); },
         "collectives over gloo (TCP, any device; default) or nccl (CUDA ranks, one GPU each)")
      ->check(CLI::IsMember(ft::EnumNameList<ft::DistBackend>()));
  run->add_option("--dist-timeout", flags->dist_timeout,
                  "seconds to wait for the other ranks (rendezvous and each collective)")
      ->check(CLI::PositiveNumber);
  run->add_option("--allowed-root", flags->allowed_roots,
                  "confine every file the run opens or writes to these directories, checked when each is "
                  "opened (repeatable; ft-worker passes ftd's --allowed-root)");
  return run;
}

// ft-train generate's options into *gen.
CLI::App* AddGenerateCommand(CLI::App& app, ft::GenerateFlags* gen) {
  CLI::App* generate = app.add_subcommand("generate", "generate text with a model and an adapter (streamed)");
  generate->add_option("--model", gen->model.model_dir, "base (or merged) HF model directory")->required();
  generate->add_option("--adapter", gen->model.adapter_dir,
                       "PEFT adapter directory (e.g. OUTPUT_DIR/adapter)");
  generate->add_option("--prompt", gen->prompt, "the prompt (default: --prompt-file, else stdin)")
      ->each([gen](const std::string&) { gen->has_prompt = true; });
  generate->add_option("--prompt-file", gen->prompt_file, "a file holding the prompt");
  generate->add_flag("--chat", gen->prompt_options.chat,
                     "render the prompt as a user message with the chat template");
  generate->add_option("--system", gen->prompt_options.system, "with --chat: a system message");
  generate->add_option("--chat-var", gen->chat_vars,
                       "with --chat: a template variable, KEY=VALUE (repeatable)");
  generate->add_option("--max-new-tokens", gen->generate.max_new_tokens, "tokens to generate at most")
      ->check(CLI::PositiveNumber);
  generate->add_option("--temperature", gen->generate.sampling.temperature, "0 = greedy (default)");
  generate->add_option("--top-k", gen->generate.sampling.top_k, "sample among the k likeliest (0 = all)");
  generate->add_option("--top-p", gen->generate.sampling.top_p, "nucleus sampling threshold (1 = off)");
  generate->add_option("--seed", gen->generate.sampling.seed, "sampling seed (same seed, same text)");
  generate->add_option("--stop", gen->generate.stop, "stop when the text contains this (repeatable)");
  generate->add_option("--device", gen->device, ft::EnumNames<ft::DeviceKind>(" | "))
      ->check(CLI::IsMember(ft::EnumNameList<ft::DeviceKind>()));
  generate->add_option("--dtype", gen->dtype, ft::EnumNames<ft::ComputeDType>(" | "))
      ->check(CLI::IsMember(ft::EnumNameList<ft::ComputeDType>()));
  generate->add_flag("--nf4", gen->model.nf4, "hold the base weights in NF4 (as QLoRA trained on them)");
  generate->add_flag("--json", gen->json, "print one JSON object at the end instead of streaming");
  return generate;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ft-train: ftune's training engine"};
  app.require_subcommand(1);
  std::string log_level = "info";
  bool log_json = false;
  app.add_option("--log-level", log_level, "debug | info | warn | error");
  app.add_flag("--log-json", log_json, "log one JSON object per line");

  RunFlags flags;
  CLI::App* run = AddRunCommand(app, &flags);

  auto* plan = app.add_subcommand("plan", "print the memory breakdown and batch plan of a job");
  std::string plan_job, device_memory, plan_device = "cpu";
  int64_t plan_world = 1;
  plan->add_option("job", plan_job, "job.yaml")->required();
  std::vector<std::string> plan_overrides;
  plan->add_option("--set", plan_overrides, "override a job.yaml key, as for run (repeatable)");
  plan->add_option("--device-memory", device_memory,
                   "memory of one device, e.g. 24GiB (default: this host's)");
  plan->add_option("--device", plan_device, ft::EnumNames<ft::DeviceKind>(" | "))
      ->check(CLI::IsMember(ft::EnumNameList<ft::DeviceKind>()));
  plan->add_option("--world", plan_world, "number of ranks")->check(CLI::PositiveNumber);
  std::string plan_gpu;
  plan->add_option("--gpu", plan_gpu,
                   "also predict the CUDA step on this GPU (its memory unless --device-memory): launches, "
                   "FLOPs, bytes and roofline time per op category")
      ->check(CLI::IsMember([] {
        std::vector<std::string> keys;
        for (const ft::GpuSpec& g : ft::KnownGpus()) keys.emplace_back(g.key);
        return keys;
      }()));

  auto* make = app.add_subcommand("make-model", "write a random-initialised HF model directory");
  std::string preset = "tiny-llama", config_file, out;
  ft::DType dtype = ft::DType::kF32;
  uint64_t seed = 1234;
  int64_t vocab = 0;
  auto* preset_opt = make->add_option("--preset", preset, "tiny-llama | tiny-qwen2 | tiny-tied | bench");
  make->add_option("--config", config_file,
                   "an HF config.json (or its directory) to take the architecture from, e.g. Llama-3-8B's")
      ->excludes(preset_opt);
  make->add_option("--out", out, "output directory")->required();
  make->add_option("--dtype", dtype, "f32 | bf16")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, ft::DType>{{"f32", ft::DType::kF32}, {"bf16", ft::DType::kBF16}}));
  make->add_option("--seed", seed, "random seed");
  make->add_option("--vocab", vocab, "override vocab_size");

  PreferPassiveOpenMpThreads(argv);
  auto* tokenize = app.add_subcommand("tokenize", "tokenize JSON strings from stdin (one per line)");
  std::string tokenizer_path;
  bool add_special = false, decode = false;
  std::string tokenize_job;
  std::vector<std::string> tokenize_overrides;
  auto* model_option = tokenize->add_option("--model", tokenizer_path, "model directory or tokenizer.json");
  tokenize
      ->add_option(
          "--job", tokenize_job,
          "index a job's data (every source) and print each source's rows, tokens and realised share")
      ->excludes(model_option);
  tokenize->add_option("--set", tokenize_overrides, "override a job.yaml key, as for run (repeatable)");
  tokenize->add_flag("--add-special-tokens", add_special, "apply the post-processor (e.g. BOS)");
  tokenize->add_flag("--decode", decode, "read id arrays and print strings instead");

  ft::GenerateFlags gen;
  CLI::App* generate = AddGenerateCommand(app, &gen);

  CLI11_PARSE(app, argc, argv);
  auto level = ft::log::ParseLevel(log_level);
  if (!level.ok()) return Fail(level.status());
  ft::log::Configure({*level, log_json, "ft-train"});
  if (*run) return RunJob(flags);
  if (*tokenize && !tokenize_job.empty()) return ft::RunDataReport(tokenize_job, tokenize_overrides);
  if (*tokenize && tokenizer_path.empty())
    return Fail(ft::Status::InvalidArgument("tokenize: give --model or --job"));
  if (*tokenize) return ft::RunTokenizeCommand(tokenizer_path, add_special, decode);
  if (*generate) return ft::RunGenerateCommand(gen);
  if (*plan) return Plan(plan_job, plan_overrides, device_memory, plan_device, plan_world, plan_gpu);
  if (*make) return MakeModel(preset, config_file, out, dtype, seed, vocab);
  return ft::kExitBadInput;
}
