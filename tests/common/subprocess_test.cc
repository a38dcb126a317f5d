#include "common/subprocess.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "tests/support/process.h"

namespace ft {
namespace {

using ::testing::HasSubstr;
using testing_support::FreshDir;
using testing_support::Proc;
using testing_support::Slurp;

// Runs `script` under /bin/sh -c and returns its exit code.
int RunSh(const std::string& script, const ChildOptions& options) {
  const StatusOr<pid_t> pid = SpawnChild({"/bin/sh", "-c", script}, options);
  EXPECT_TRUE(pid.ok()) << pid.status().ToString();
  return pid.ok() ? Proc{*pid, ""}.Wait() : -1;
}

TEST(SubprocessTest, ChildWritesStdoutAndStderrToTheLogAndItsExitStatusComesBack) {
  const std::string log = FreshDir("sh-log") + "/child.log";
  EXPECT_EQ(RunSh("echo hi; echo oops >&2; exit 3", {.log = log}), 3);
  EXPECT_EQ(Slurp(log), "hi\noops\n");
}

TEST(SubprocessTest, LogIsAppendedToUnlessTruncateIsAsked) {
  const std::string log = FreshDir("append") + "/child.log";
  std::ofstream(log) << "before\n";
  EXPECT_EQ(RunSh("echo hi", {.log = log}), 0);
  EXPECT_EQ(Slurp(log), "before\nhi\n");
  EXPECT_EQ(RunSh("echo again", {.log = log, .truncate_log = true}), 0);
  EXPECT_EQ(Slurp(log), "again\n");
}

// Reads what is in the pipe `read_fd` once every write end is closed.
std::string Drain(int read_fd) {
  std::string out;
  char buf[256];
  for (ssize_t n; (n = read(read_fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(read_fd);
  return out;
}

TEST(SubprocessTest, StdoutStaysOutOfTheLogWhenAskedAndExtraDescriptorsComeAfterTheLog) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  const std::string log = FreshDir("stdout-kept") + "/child.log";
  // fd 1 -> the pipe: the extra descriptors are set up after the log.
  EXPECT_EQ(
      RunSh("echo to-stdout; echo to-stderr >&2", {.log = log, .stdout_to_log = false, .fds = {{fds[1], 1}}}),
      0);
  close(fds[1]);
  EXPECT_EQ(Drain(fds[0]), "to-stdout\n");
  EXPECT_EQ(Slurp(log), "to-stderr\n");
}

TEST(SubprocessTest, EnvEntriesOverrideAndAddToTheInheritedEnvironment) {
  ASSERT_EQ(setenv("FT_SUBPROCESS_TEST_KEPT", "kept", 1), 0);
  ASSERT_EQ(setenv("FT_SUBPROCESS_TEST_SET", "inherited", 1), 0);
  const std::string log = FreshDir("env") + "/child.log";
  EXPECT_EQ(RunSh("echo $FT_SUBPROCESS_TEST_KEPT $FT_SUBPROCESS_TEST_SET $FT_SUBPROCESS_TEST_NEW",
                  {.log = log, .env = {"FT_SUBPROCESS_TEST_SET=override", "FT_SUBPROCESS_TEST_NEW=new"}}),
            0);
  EXPECT_EQ(Slurp(log), "kept override new\n");
}

TEST(SubprocessTest, ExtraDescriptorsReachTheChildUnderTheirNewNumbers) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  const std::string log = FreshDir("fds") + "/child.log";
  EXPECT_EQ(RunSh("echo through-fd-7 >&7", {.log = log, .fds = {{fds[1], 7}}}), 0);
  close(fds[1]);
  EXPECT_EQ(Drain(fds[0]), "through-fd-7\n");
}

TEST(SubprocessTest, NewProcessGroupPutsTheChildInAGroupOfItsOwn) {
  const std::string dir = FreshDir("pgid");
  for (const bool own_group : {false, true}) {
    const StatusOr<pid_t> pid = SpawnChild({"/bin/sh", "-c", "exec sleep 600"},
                                           {.log = dir + "/sleep.log", .new_process_group = own_group});
    ASSERT_TRUE(pid.ok()) << pid.status().ToString();
    // SpawnChild returns once the child has exec'ed, after its setpgid.
    EXPECT_EQ(getpgid(*pid), own_group ? *pid : getpgrp());
    kill(*pid, SIGKILL);
    EXPECT_EQ((Proc{*pid, ""}.Wait()), 128 + SIGKILL);
  }
}

TEST(SubprocessTest, MissingExecutableIsAClearErrorAndTheLogSaysSoToo) {
  const std::string log = FreshDir("missing") + "/child.log";
  const StatusOr<pid_t> pid = SpawnChild({"/nonexistent/ft-no-such-binary", "--flag"}, {.log = log});
  ASSERT_FALSE(pid.ok());
  EXPECT_TRUE(pid.status().IsNotFound()) << pid.status().ToString();
  EXPECT_EQ(pid.status().message(), "cannot run /nonexistent/ft-no-such-binary: No such file or directory");
  EXPECT_EQ(Slurp(log), pid.status().message() + "\n");
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1) << "the failed child was not reaped";
}

TEST(SubprocessTest, NonExecutableFileIsRefused) {
  const std::string dir = FreshDir("not-executable");
  std::ofstream(dir + "/script") << "#!/bin/sh\necho never\n";
  const StatusOr<pid_t> pid = SpawnChild({dir + "/script"}, {.log = dir + "/child.log"});
  ASSERT_FALSE(pid.ok());
  EXPECT_THAT(pid.status().message(), HasSubstr("cannot run " + dir + "/script: Permission denied"));
}

TEST(SubprocessTest, UnopenableLogIsAnErrorBeforeAnythingRuns) {
  const std::string dir = FreshDir("bad-log");
  const StatusOr<pid_t> pid =
      SpawnChild({"/bin/sh", "-c", "touch " + dir + "/ran"}, {.log = dir + "/no-such-dir/child.log"});
  ASSERT_FALSE(pid.ok());
  EXPECT_TRUE(pid.status().IsIOError()) << pid.status().ToString();
  EXPECT_THAT(pid.status().message(),
              HasSubstr("cannot open log " + dir + "/no-such-dir/child.log for /bin/sh"));
  EXPECT_FALSE(std::ifstream(dir + "/ran").good());
}

// The write end of a pipe that a pthread_atfork child handler writes to, had
// it run in a spawned child.
int g_atfork_probe_fd = -1;
void WriteAtforkProbe() {
  if (g_atfork_probe_fd >= 0) {
    [[maybe_unused]] const ssize_t n = write(g_atfork_probe_fd, "x", 1);
  }
}

// LLVM libomp 14 registers a forked child in /dev/shm from its atfork handler
// and a later child with a reused pid aborts ("OMP: Error #15"): the e2e tests,
// which link libomp, failed so under TSan. SpawnChild must run no handler.
TEST(SubprocessTest, NoForkHandlerRunsInTheChild) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
  g_atfork_probe_fd = fds[1];
  static const int registered = pthread_atfork(nullptr, nullptr, WriteAtforkProbe);
  ASSERT_EQ(registered, 0);
  EXPECT_EQ(RunSh("exit 0", {}), 0);
  g_atfork_probe_fd = -1;
  close(fds[1]);
  char c;
  EXPECT_EQ(read(fds[0], &c, 1), 0) << "a pthread_atfork child handler ran in the spawned child";
  close(fds[0]);
}

TEST(SubprocessTest, EmptyArgvIsRefused) {
  const StatusOr<pid_t> pid = SpawnChild({}, {});
  ASSERT_FALSE(pid.ok());
  EXPECT_TRUE(pid.status().IsInvalidArgument());
}

}  // namespace
}  // namespace ft
