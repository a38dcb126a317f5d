// ResolvedJobYaml (engine/job/job_spec.h): the job.yaml ftd hands a worker
// (daemon/daemon_placement.cc). A worker reads it from a directory of its
// own, so every path the job names must arrive absolute, as the submitted
// file's directory resolved it, with the batch plan fixed for the attempt.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <string>

#include "engine/job/job_spec.h"

namespace ft {
namespace {

constexpr const char* kJob =
    "name: resolved\n"
    "model: {path: model}\n"
    "adapter: {type: lora, r: 4, alpha: 8, init: prev/adapter}\n"
    "data: {train: train.jsonl, eval: eval.jsonl, format: chat, chat_template: chat.jinja}\n"
    "train: {max_steps: 7, global_batch_size: 8}\n"
    "resources: {gpus: 4, min_gpus: 2}\n"
    "output: {dir: out}\n";

TEST(ResolvedJobYaml, EveryPathIsAbsoluteAndThePlanIsFixedAsFtdHandsItToAWorker) {
  auto submitted = ParseJobSpec(kJob, "/jobs/a/job.yaml");
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  const std::string resolved = ResolvedJobYaml(*submitted, kJob, /*micro_batch=*/2, /*accumulation=*/2,
                                               /*world=*/2);
  // The worker parses it from its own directory: the paths must not move.
  auto worker = ParseJobSpec(resolved, "/var/lib/ft-worker/attempt/job.yaml");
  ASSERT_TRUE(worker.ok()) << worker.status().ToString() << "\n" << resolved;
  EXPECT_EQ(worker->model.path, "/jobs/a/model");
  EXPECT_EQ(worker->adapter.init, "/jobs/a/prev/adapter");
  EXPECT_EQ(worker->data.train, "/jobs/a/train.jsonl");
  EXPECT_EQ(worker->data.eval, "/jobs/a/eval.jsonl");
  EXPECT_EQ(worker->data.chat_template, "/jobs/a/chat.jinja");
  EXPECT_EQ(worker->output.dir, "/jobs/a/out");
  // The attempt's plan, fixed; the job's length and the rest as submitted.
  EXPECT_EQ(worker->train.micro_batch_size, 2);
  EXPECT_EQ(worker->train.gradient_accumulation, 2);
  EXPECT_EQ(worker->resources.gpus, 2);
  EXPECT_FALSE(YAML::Load(resolved)["resources"]["min_gpus"].IsDefined()) << resolved;
  EXPECT_EQ(worker->train.max_steps, 7);
  EXPECT_EQ(worker->name, "resolved");
}

// Keys the job leaves unset stay unset (no empty path appears).
TEST(ResolvedJobYaml, UnsetPathsStayUnset) {
  const std::string job =
      "model: {path: m}\ndata: {train: t.jsonl}\ntrain: {max_steps: 3, global_batch_size: 4}\n"
      "output: {dir: o}\n";
  auto submitted = ParseJobSpec(job, "/jobs/b/job.yaml");
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  const YAML::Node resolved = YAML::Load(ResolvedJobYaml(*submitted, job, 4, 1, 1));
  EXPECT_EQ(resolved["model"]["path"].as<std::string>(), "/jobs/b/m");
  EXPECT_EQ(resolved["data"]["train"].as<std::string>(), "/jobs/b/t.jsonl");
  EXPECT_FALSE(resolved["data"]["eval"].IsDefined());
  EXPECT_FALSE(resolved["data"]["chat_template"].IsDefined());
  EXPECT_FALSE(resolved["adapter"].IsDefined());
}

}  // namespace
}  // namespace ft
