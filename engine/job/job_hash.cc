#include "engine/job/job_hash.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <functional>
#include <mutex>
#include <vector>

#include "common/file_util.h"

namespace ft {

std::string DataFileSha256(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "?";
  const std::string version = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
                              std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
                              std::to_string(st.st_mtim.tv_nsec) + ":" + std::to_string(st.st_ctim.tv_sec) +
                              "." + std::to_string(st.st_ctim.tv_nsec);
  static std::mutex mu;
  static std::map<std::string, std::pair<std::string, std::string>> known;  // path → {version, SHA-256}
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(path); it != known.end() && it->second.first == version)
      return it->second.second;
  }
  auto sha = Sha256File(path);
  if (!sha.ok()) return "?";
  const time_t newest = std::max(st.st_mtim.tv_sec, st.st_ctim.tv_sec);
  if (std::time(nullptr) - newest >= 2) {
    std::lock_guard<std::mutex> lock(mu);
    if (known.size() >= 1024) known.clear();
    known[path] = {version, *sha};
  }
  return *sha;
}

std::string SourcesSha256(const std::vector<std::string>& source_sha256s) {
  if (source_sha256s.size() == 1) return source_sha256s[0];
  std::string list;
  for (const std::string& sha : source_sha256s) list += sha + "\n";
  return Sha256Hex(list);
}

namespace {

// data.train as a list: each source's path, format, share and mapping (a single path hashes as its path).
std::string SourcesKey(const JobSpec& spec, const std::function<std::string(double)>& num) {
  if (spec.data.train_sources.size() == 1 && spec.data.train_sources[0].key == "data.train")
    return spec.data.train;
  std::string key;
  for (const JobSpec::DataSource& s : spec.data.train_sources) {
    key += s.path + "|" + std::string(EnumName(s.format)) + "|weight=" + num(s.weight) +
           "|epochs=" + num(s.epochs);
    for (const auto& [ours, theirs] : s.keys) key += "|" + ours + "<-" + theirs;
    for (const auto& [theirs, ours] : s.roles) key += "|role " + theirs + "->" + ours;
    key += "|" + s.chat_template + ";";
  }
  return key;
}

std::string DataSha256(const JobSpec& spec) {
  std::vector<std::string> shas;
  for (const JobSpec::DataSource& s : spec.data.train_sources) shas.push_back(DataFileSha256(s.path));
  return SourcesSha256(shas);
}

}  // namespace

std::map<std::string, std::string> JobMathKeys(const JobSpec& spec, const std::string& data_sha256) {
  auto num = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return std::string(buf);
  };
  std::string targets;
  std::vector<std::string> sorted = spec.adapter.target_modules;
  // all-linear hashes as the seven names it meant when it was the unwritten default (so a
  // checkpoint written then still resumes); model.path tells a fused family's apart.
  if (sorted == std::vector<std::string>{"all-linear"})
    sorted = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  std::sort(sorted.begin(), sorted.end());
  for (const auto& t : sorted) targets += (targets.empty() ? "" : ",") + t;
  const bool lora = spec.adapter.type == AdapterType::kLora;
  // A choice hashes as its job.yaml name (the table's), as it always has: a checkpoint's hash never changes.
  auto name = [](auto choice) { return std::string(EnumName(choice)); };
  std::map<std::string, std::string> m = {
      {"model.path", spec.model.path},
      {"model.quantization", name(spec.model.quantization)},
      {"model.dtype", name(spec.model.dtype)},
      {"adapter.type", name(spec.adapter.type)},
      {"data.train", SourcesKey(spec, num)},
      {"data.train (SHA-256)", data_sha256.empty() ? DataSha256(spec) : data_sha256},
      {"data.format", name(spec.data.format)},
      {"data.seq_len", std::to_string(spec.data.seq_len)},
      {"data.packing", spec.data.packing ? "true" : "false"},
      {"data.shuffle", spec.data.shuffle ? "true" : "false"},
      {"data.skip_bad_lines", spec.data.skip_bad_lines ? "true" : "false"},
      {"data.chat_template", spec.data.chat_template},
      {"train.global_batch_size", std::to_string(spec.train.global_batch_size)},
      {"train.lr", num(spec.train.lr)},
      {"train.lr_schedule", name(spec.train.lr_schedule)},
      {"train.warmup_steps", std::to_string(spec.train.warmup_steps)},
      {"train.weight_decay", num(spec.train.weight_decay)},
      {"train.max_grad_norm", num(spec.train.max_grad_norm)},
      {"train.adam_beta1", num(spec.train.adam_beta1)},
      {"train.adam_beta2", num(spec.train.adam_beta2)},
      {"train.adam_eps", num(spec.train.adam_eps)},
      {"train.seed", std::to_string(spec.train.seed)},
      {"train.attention", name(spec.train.attention)},
      {"train.gradient_sum", ExactGradientSum(spec) ? "exact" : "float"},
  };
  if (spec.data.val_fraction > 0) m["data.val_fraction"] = num(spec.data.val_fraction);
  if (spec.model.quantization == Quantization::kNf4)
    m["model.double_quant"] = spec.model.double_quant ? "true" : "false";
  if (spec.model.dtype == ComputeDType::kF16) {
    m["train.loss_scale_init"] = num(spec.train.loss_scale_init);
    m["train.loss_scale_growth_interval"] = std::to_string(spec.train.loss_scale_growth_interval);
  }
  if (spec.train.objective != TrainObjective::kSft) {  // SFT jobs hash as they always have
    m["train.objective"] = name(spec.train.objective);
    m["train.dpo.beta"] = num(spec.train.dpo.beta);
    m["train.dpo.loss"] = name(spec.train.dpo.loss);
    m["train.dpo.label_smoothing"] = num(spec.train.dpo.label_smoothing);
    if (spec.train.dpo.rpo_alpha != 0) m["train.dpo.rpo_alpha"] = num(spec.train.dpo.rpo_alpha);
    m["data.max_prompt_len"] = std::to_string(spec.data.max_prompt_len);
  }
  // Early stopping decides where the run ends (the checkpoints' step counts); jobs without it hash
  // as they always have. checkpoint.keep_best and output.adapter_from change no trained byte.
  if (const JobSpec::Train::EarlyStopping& e = spec.train.early_stopping; e.enabled) {
    m["train.early_stopping.metric"] = name(e.metric);
    m["train.early_stopping.patience"] = std::to_string(e.patience);
    m["train.early_stopping.min_delta"] = num(e.min_delta);
    m["train.eval_every_steps"] = std::to_string(spec.train.eval_every_steps);
    m["train.eval_max_batches"] = std::to_string(spec.train.eval_max_batches);
  }
  if (lora) {
    m["adapter.r"] = std::to_string(spec.adapter.r);
    m["adapter.alpha"] = num(spec.adapter.alpha);
    m["adapter.dropout"] = num(spec.adapter.dropout);
    m["adapter.rslora"] = spec.adapter.rslora ? "true" : "false";
    m["adapter.target_modules"] = targets;
    m["adapter.init"] = spec.adapter.init;
  }
  return m;
}

std::string JobHash(const JobSpec& spec, const std::string& data_sha256) {
  std::string canonical;
  for (const auto& [k, v] : JobMathKeys(spec, data_sha256)) canonical += k + "=" + v + "\n";
  return Sha256Hex(canonical);
}

}  // namespace ft
