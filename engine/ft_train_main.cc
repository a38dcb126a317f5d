// ft-train: the training engine's command line (the same binary the worker spawns).
//
//   ft-train run JOB.yaml                      train locally, no daemon
//   ft-train make-model --preset tiny-llama --out DIR [--dtype f32|bf16] [--seed N]
//
// Exit codes: 0 finished; 1 failed (reason on stderr); 2 bad input or usage.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/logging.h"
#include "engine/hf_model.h"
#include "engine/job_spec.h"
#include "engine/trainer.h"

namespace {

int Fail(const ft::Status& s) {
  std::fprintf(stderr, "ft-train: %s\n", s.ToString().c_str());
  return s.IsInvalidArgument() || s.IsNotFound() || s.code() == ft::Status::Code::kUnimplemented ? 2 : 1;
}

int RunJob(const std::string& job_file) {
  auto spec = ft::LoadJobSpec(job_file);
  if (!spec.ok()) return Fail(spec.status());
  auto trainer = ft::Trainer::Create(*spec);
  if (!trainer.ok()) return Fail(trainer.status());
  ft::Status s = (*trainer)->Run();
  if (!s.ok()) return Fail(s);
  std::fprintf(stderr, "ft-train: finished %lld steps; outputs in %s\n",
               static_cast<long long>((*trainer)->steps_done()), spec->output.dir.c_str());
  return 0;
}

int MakeModel(const std::string& preset, const std::string& out, const std::string& dtype, uint64_t seed,
              int64_t vocab) {
  auto config = ft::PresetModelConfig(preset);
  if (!config.ok()) return Fail(config.status());
  if (vocab > 0) config->vocab_size = vocab;
  ft::Model model(*config, {});
  ft::RandomInitModel(&model, seed);
  ft::Status s = ft::SaveHfModel(out, model, dtype == "bf16" ? ft::DType::kBF16 : ft::DType::kF32);
  if (!s.ok()) return Fail(s);
  std::fprintf(stderr, "ft-train: wrote %s model to %s\n", preset.c_str(), out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ft-train: ftune's training engine"};
  app.require_subcommand(1);
  std::string log_level = "info";
  bool log_json = false;
  app.add_option("--log-level", log_level, "debug | info | warn | error");
  app.add_flag("--log-json", log_json, "log one JSON object per line");

  auto* run = app.add_subcommand("run", "train a job.yaml locally");
  std::string job_file;
  run->add_option("job", job_file, "job.yaml")->required();

  auto* make = app.add_subcommand("make-model", "write a random-initialised HF model directory");
  std::string preset = "tiny-llama", out, dtype = "f32";
  uint64_t seed = 1234;
  int64_t vocab = 0;
  make->add_option("--preset", preset, "tiny-llama | tiny-qwen2 | tiny-tied | bench");
  make->add_option("--out", out, "output directory")->required();
  make->add_option("--dtype", dtype, "f32 | bf16")->check(CLI::IsMember({"f32", "bf16"}));
  make->add_option("--seed", seed, "random seed");
  make->add_option("--vocab", vocab, "override vocab_size");

  CLI11_PARSE(app, argc, argv);
  auto level = ft::log::ParseLevel(log_level);
  if (!level.ok()) return Fail(level.status());
  ft::log::Configure({*level, log_json, "ft-train"});
  if (*run) return RunJob(job_file);
  if (*make) return MakeModel(preset, out, dtype, seed, vocab);
  return 2;
}
