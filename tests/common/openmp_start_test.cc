#include "common/openmp_start.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "tests/support/process.h"

namespace ft {
namespace {

using ::testing::HasSubstr;
using testing_support::FreshDir;
using testing_support::Proc;
using testing_support::Slurp;

std::string RegistrationPath(pid_t pid) {
  return "/dev/shm/__KMP_REGISTERED_LIB_" + std::to_string(pid) + "_" + std::to_string(getuid());
}

// With FT_OPENMP_START_CHILD set, this binary is the child the tests start: it
// says whether a registration under its pid survived static initialisation,
// runs a parallel region and exits, before any test runs.
int RunAsChildWhenAsked() {
  if (getenv("FT_OPENMP_START_CHILD") == nullptr) return 0;
  std::printf("pid=%d present=%d\n", getpid(), access(RegistrationPath(getpid()).c_str(), F_OK) == 0);
  int threads = 0;
#pragma omp parallel reduction(+ : threads)
  threads += 1;
  std::printf("threads=%d\n", threads);
  std::exit(0);  // libomp removes its registration at exit
}
// After kStaleOpenMpRegistrationChecked (the header above), as a child of this file would be.
[[maybe_unused]] const int kChild = RunAsChildWhenAsked();

// Starts this binary as the child after `write` (a shell command) has written
// the registration file "$f" of the pid the child will have; returns its log.
std::string RunChildAfter(const std::string& name, const std::string& write) {
  const std::string dir = FreshDir(name), log = dir + "/child.log";
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  EXPECT_GT(n, 0);
  const std::string script =
      "f=/dev/shm/__KMP_REGISTERED_LIB_$$_$(id -u) && " + write + " && exec \"$0\" --gtest_filter=-*";
  const StatusOr<pid_t> pid = SpawnChild({"/bin/sh", "-c", script, std::string(self, n > 0 ? n : 0)},
                                         {.log = log, .env = {"FT_OPENMP_START_CHILD=1"}});
  EXPECT_TRUE(pid.ok()) << pid.status().ToString();
  if (pid.ok()) {
    EXPECT_EQ((Proc{*pid, ""}.Wait()), 0) << Slurp(log);
  }
  return Slurp(log);
}

// What a process killed while libomp wrote its registration leaves: LLVM libomp
// 14 aborted the next process with that pid ("OMP: Error #15 ... unknown library
// already initialized"); the e2e tests failed so under TSan.
TEST(OpenMpStartTest, AnEmptyRegistrationLeftUnderOurPidIsRemovedBeforeTheFirstRegion) {
  const std::string log = RunChildAfter("empty", "head -c 1024 /dev/zero > \"$f\"");
  EXPECT_THAT(log, HasSubstr(" present=0\n"));
  EXPECT_THAT(log, HasSubstr("threads="));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("OMP: Error")));
}

// A complete one is libomp's to judge (it replaces a registration whose process is dead).
TEST(OpenMpStartTest, ACompleteRegistrationIsLeftToTheRuntime) {
  const std::string log = RunChildAfter("complete", "printf 0x10-cafe1234-libomp.so.5 > \"$f\"");
  EXPECT_THAT(log, HasSubstr(" present=1\n"));
  EXPECT_THAT(log, HasSubstr("threads="));
  const size_t at = log.find("pid=");
  ASSERT_NE(at, std::string::npos);
  unlink(RegistrationPath(std::stoi(log.substr(at + 4))).c_str());  // libgomp leaves it
}

}  // namespace
}  // namespace ft
