#include "worker/metrics_tail.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>

namespace ft::worker {

namespace {

Status Errno(const std::string& what, const std::string& path) {
  return Status::IOError(path + ": " + what + ": " + std::strerror(errno));
}

}  // namespace

void MetricsTail::Reset() {
  offset_ = 0;
  partial_.clear();
  skipping_prefix_ = true;
}

Status MetricsTail::SkipExisting() { return ReadNew(nullptr, /*deliver=*/false); }

Status MetricsTail::Poll(std::vector<std::string>* lines) { return ReadNew(lines, /*deliver=*/true); }

Status MetricsTail::ReadNew(std::vector<std::string>* lines, bool deliver) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) return Errno("open", path_);
    if (ino_ != 0) Reset();  // removed: whatever appears next is a new file
    ino_ = 0;
    return Status::OK();
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = Errno("fstat", path_);
    ::close(fd);
    return s;
  }
  const bool replaced = ino_ != 0 && (st.st_ino != ino_ || st.st_dev != dev_);
  if (replaced || st.st_size < offset_) Reset();
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  char buf[64 * 1024];
  while (true) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), offset_);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = Errno("read", path_);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    offset_ += n;
    partial_.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string line = partial_.substr(start, nl - start);
    const size_t h = std::hash<std::string>()(line);
    if (skipping_prefix_ && seen_.count(h) != 0) continue;
    skipping_prefix_ = false;
    seen_.insert(h);
    if (deliver && !line.empty()) lines->push_back(std::move(line));
  }
  partial_.erase(0, start);
  return Status::OK();
}

}  // namespace ft::worker
