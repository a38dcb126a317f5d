// Tokenizer throughput: encodes every document of a corpus (a JSON array of
// strings) with add_special_tokens=false, several passes, one thread, and
// prints one JSON line: bytes, tokens, the first (cold cache) and best pass.
//
//   tokenizer_bench TOKENIZER_DIR_OR_JSON CORPUS.json [PASSES]
//
// bench/tokenizer_vs_js.sh runs it beside the JS reference on the same corpus.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "engine/text/tokenizer.h"

namespace {
// CPU time of this thread: on a shared machine it is steadier than wall time.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_DIR_OR_JSON CORPUS.json [PASSES]\n", argv[0]);
    return 2;
  }
  const int passes = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
  const auto load_start = std::chrono::steady_clock::now();
  auto tok = ft::Tokenizer::Load(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", tok.status().ToString().c_str());
    return 2;
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  auto data = ft::ReadFileToString(argv[2]);
  if (!data.ok()) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", data.status().ToString().c_str());
    return 2;
  }
  const auto docs = nlohmann::json::parse(*data).get<std::vector<std::string>>();
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();

  size_t tokens = 0;
  uint32_t checksum = 0;
  double first = 0, best = 1e30, best_cpu = 1e30;
  for (int p = 0; p < passes; ++p) {
    size_t n = 0;
    uint32_t sum = 0;  // same rolling hash as tokenizer_vs_js.mjs
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ThreadCpuSeconds();
    for (const auto& d : docs) {
      const std::vector<int32_t> ids = (*tok)->Encode(d, false).value();
      n += ids.size();
      for (int32_t id : ids) sum = sum * 31u + static_cast<uint32_t>(id);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (p == 0) first = s;
    best = std::min(best, s);
    best_cpu = std::min(best_cpu, ThreadCpuSeconds() - cpu_start);
    tokens = n;
    checksum = sum;
  }
  nlohmann::json out = {{"impl", "ftune"},
                        {"docs", docs.size()},
                        {"bytes", bytes},
                        {"tokens", tokens},
                        {"checksum", checksum},
                        {"load_s", load_s},
                        {"first_s", first},
                        {"best_s", best},
                        {"best_cpu_s", best_cpu},
                        {"cpu_mb_per_s", bytes / best_cpu / 1e6},
                        {"mb_per_s", bytes / best / 1e6},
                        {"tokens_per_s", tokens / best}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
