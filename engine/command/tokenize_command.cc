#include "engine/command/tokenize_command.h"

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/job/exit_codes.h"
#include "engine/job/hf_config.h"
#include "engine/text/tokenizer.h"
#include "engine/train/trainer.h"

namespace ft {
namespace {

using nlohmann::json;

// One input line -> one output line; false (with *error set) on bad input.
bool ProcessLine(const Tokenizer& tok, const std::string& line, bool add_special_tokens, bool decode,
                 std::string* out, std::string* error) {
  json in = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (decode) {
    if (!in.is_array()) {
      *error = "expected a JSON array of token ids";
      return false;
    }
    std::vector<int32_t> ids;
    for (const json& id : in) {
      if (!id.is_number_integer()) {
        *error = "expected a JSON array of integer token ids";
        return false;
      }
      ids.push_back(id.get<int32_t>());
    }
    *out = json(tok.Decode(ids, /*skip_special_tokens=*/false))
               .dump(-1, ' ', false, json::error_handler_t::replace);
    return true;
  }
  if (!in.is_string()) {
    *error = "expected a JSON string";
    return false;
  }
  auto ids = tok.Encode(in.get_ref<const std::string&>(), add_special_tokens);
  if (!ids.ok()) {
    *error = ids.status().message();
    return false;
  }
  *out = json(*ids).dump();
  return true;
}

}  // namespace

int RunTokenizeCommand(const std::string& model_or_file, bool add_special_tokens, bool decode) {
  auto tok = Tokenizer::Load(model_or_file);
  if (!tok.ok()) {
    std::fprintf(stderr, "ft-train tokenize: %s\n", tok.status().ToString().c_str());
    return kExitBadInput;
  }
  std::cin.tie(nullptr);  // (no sync_with_stdio(false): it would replace redirected stream buffers)
  std::string line, out, error;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    if (!ProcessLine(**tok, line, add_special_tokens, decode, &out, &error)) {
      std::fprintf(stderr, "ft-train tokenize: stdin line %lld: %s\n", static_cast<long long>(n),
                   error.c_str());
      return kExitBadInput;
    }
    std::cout << out << '\n';
  }
  std::cout.flush();
  return 0;
}

namespace {

// One mixture's table: a line per source, then the whole.
void PrintMixture(const char* what, const Mixture& m, int64_t rows_trained) {
  std::printf("%s: %d source%s, %lld rows a pass\n", what, m.sources(), m.sources() == 1 ? "" : "s",
              static_cast<long long>(m.size()));
  const std::vector<int64_t> positions = m.Positions(rows_trained);
  std::printf("  %-16s %8s %9s %11s %11s %8s %9s  %s\n", "source", "rows", "examples", "tokens", "targets",
              "share", "realised", "path");
  for (int k = 0; k < m.sources(); ++k) {
    const Dataset& d = m.source(k);
    std::printf("  %-16s %8lld %9lld %11lld %11lld %7.2f%% %8.2f%%  %s\n", m.key(k).c_str(),
                static_cast<long long>(d.size()), static_cast<long long>(d.examples()),
                static_cast<long long>(d.total_tokens()),
                static_cast<long long>(d.CountTargets(0, d.size(), false, 0)), 100 * m.share(k),
                rows_trained > 0 ? 100.0 * static_cast<double>(positions[k]) / rows_trained : 0.0,
                d.path().c_str());
  }
}

}  // namespace

int RunDataReport(const std::string& job_file, const std::vector<std::string>& overrides) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "ft-train tokenize: %s\n", s.ToString().c_str());
    return kExitBadInput;
  };
  auto job = LoadJobWithOverrides(job_file, overrides);
  if (!job.ok()) return fail(job.status());
  const JobSpec& spec = job->spec;
  auto config = ReadHfConfig(spec.model.path);
  if (!config.ok()) return fail(config.status());
  std::unique_ptr<Tokenizer> tokenizer;
  auto train = OpenJobMixture(spec, *config, spec.data.train_sources, Mixture::Mode::kInterleave,
                              {spec.data.val_fraction, false}, &tokenizer);
  if (!train.ok()) return fail(train.status());
  const int64_t steps = spec.train.max_steps > 0
                            ? spec.train.max_steps
                            : spec.train.epochs * (((*train)->size() + spec.train.global_batch_size - 1) /
                                                   spec.train.global_batch_size);
  const int64_t rows = steps * spec.train.global_batch_size;
  std::printf("%s: %lld steps x %lld rows = %lld rows trained\n", job_file.c_str(),
              static_cast<long long>(steps), static_cast<long long>(spec.train.global_batch_size),
              static_cast<long long>(rows));
  PrintMixture("data.train", **train, rows);
  if (JobHasEval(spec)) {
    const bool held = spec.data.val_fraction > 0;
    auto eval = OpenJobMixture(spec, *config, held ? spec.data.train_sources : spec.data.eval_sources,
                               Mixture::Mode::kConcatenate, {spec.data.val_fraction, held}, &tokenizer);
    if (!eval.ok()) return fail(eval.status());
    PrintMixture(held ? "data.val_fraction (held out)" : "data.eval", **eval, (*eval)->size());
  }
  return 0;
}

}  // namespace ft
