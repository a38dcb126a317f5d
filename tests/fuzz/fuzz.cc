#include "tests/fuzz/fuzz.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "engine/text/tokenizer.h"

namespace ft::fuzz {

namespace fs = std::filesystem;

std::vector<std::string> SplitParts(std::string_view input, size_t max_parts) {
  std::vector<std::string> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t nul = input.find('\0');
    if (nul == std::string_view::npos) break;
    parts.emplace_back(input.substr(0, nul));
    input.remove_prefix(nul + 1);
  }
  parts.emplace_back(input);
  return parts;
}

std::string ScratchFile(const std::string& name, std::string_view contents) {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    const fs::path d = fs::path(tmp && *tmp ? tmp : "/tmp") / ("ftune-fuzz-" + std::to_string(getpid()));
    fs::create_directories(d);
    return d.string();
  }();
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(contents.data(), contents.size());
  return path;
}

std::string DataPath(const std::string& name) { return std::string(FT_FUZZ_DATA_DIR) + "/" + name; }

const Tokenizer& DataTokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    auto t = Tokenizer::Load(DataPath("tokenizer.json"));
    if (!t.ok()) std::abort();
    return std::move(*t);
  }();
  return *tokenizer;
}

}  // namespace ft::fuzz
