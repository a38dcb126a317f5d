#include "tests/support/temp_dir.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

namespace ft::testing_support {

namespace fs = std::filesystem;

std::string TempPath(const std::string& name) {
  std::string prefix = program_invocation_short_name;
  // A sharded test (GTEST_SHARD_INDEX, ft_add_test's SHARDS) runs as several
  // processes of one binary at once: each shard has directories of its own.
  if (const char* shard = std::getenv("GTEST_SHARD_INDEX")) prefix += std::string("-shard") + shard;
  return (fs::path(testing::TempDir()) / (prefix + "-" + name)).lexically_normal().string();
}

std::string FreshDir(const std::string& name) {
  const std::string d = TempPath(name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace ft::testing_support
