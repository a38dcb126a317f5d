// Per-test temporary paths, the one way tests make a scratch directory.
//
// Paths live under testing::TempDir() (TEST_TMPDIR under ctest) and carry the
// test binary's name (and shard), so test binaries (and shards of one)
// running side by side never share a directory.
//
// Thread safety: for a test's main thread.
#pragma once

#include <string>

namespace ft::testing_support {

// <testing::TempDir()>/<this test binary's name>[-shard<i>]-<name>.
std::string TempPath(const std::string& name);
// TempPath(name), emptied and created (any earlier contents are removed).
std::string FreshDir(const std::string& name);

}  // namespace ft::testing_support
