// A main for the fuzz targets without libFuzzer (any compiler): runs
// LLVMFuzzerTestOneInput once on every file named on the command line or
// found (recursively) in a directory named there, and prints how many ran.
// A crash, sanitizer report or hang fails the ctest that runs it.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz.h"

namespace {
int Run(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}
}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  int ran = 0;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg(argv[i]);
    std::vector<fs::path> files;
    if (fs::is_directory(arg)) {
      for (const auto& e : fs::recursive_directory_iterator(arg)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(arg);
    }
    for (const fs::path& f : files) {
      Run(f);
      ++ran;
    }
  }
  std::printf("replayed %d inputs\n", ran);
  return ran > 0 ? 0 : 1;  // an empty corpus is a broken test, not a pass
}
