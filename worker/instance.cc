#include "worker/instance.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/file_util.h"
#include "common/logging.h"
#include "common/secret.h"

namespace ft::worker {

namespace fs = std::filesystem;

namespace {

constexpr size_t kInstanceBytes = 16;

bool IsInstance(const std::string& text) {
  return text.size() == 2 * kInstanceBytes && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

StatusOr<std::string> LoadOrCreateInstance(const std::string& work_dir) {
  const std::string path = (fs::path(work_dir) / "instance").string();
  if (auto text = ReadFileToString(path, 1024); text.ok()) {
    std::string value = *text;
    while (!value.empty() && (value.back() == '\n' || value.back() == '\r')) value.pop_back();
    if (IsInstance(value)) return value;
    FT_LOG(WARN) << path << ": not an ft-worker instance (32 hex digits); making a new one";
  }
  FT_ASSIGN_OR_RETURN(std::string fresh, RandomHex(kInstanceBytes));
  FT_RETURN_IF_ERROR(ReplaceFileAtomically(path, fresh + "\n"));
  std::error_code ec;
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write, ec);  // only the worker's user
  return fresh;
}

StatusOr<std::unique_ptr<WorkDirLock>> WorkDirLock::Acquire(const std::string& work_dir,
                                                            std::chrono::milliseconds wait) {
  const std::string path = (fs::path(work_dir) / "lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError(path + ": cannot open the work dir's lock: " + std::strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const Status s = Status::IOError(path + ": cannot lock the work dir: " + std::strerror(errno));
      ::close(fd);
      return s;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      auto holder = ReadFileToString(path, 64);
      ::close(fd);
      return Status::FailedPrecondition(
          "work dir " + work_dir + " is in use by another ft-worker (pid " +
          (holder.ok() && !holder->empty() ? holder->substr(0, holder->find('\n')) : std::string("unknown")) +
          "); give each ft-worker its own --work-dir (and --id)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // The holder's pid, for the message above (the lock itself is the flock).
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    FT_LOG(DEBUG) << path << ": cannot record this worker's pid: " << std::strerror(errno);
  }
  return std::unique_ptr<WorkDirLock>(new WorkDirLock(fd));
}

WorkDirLock::~WorkDirLock() { ::close(fd_); }

}  // namespace ft::worker
