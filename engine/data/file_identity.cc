#include "engine/data/file_identity.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "common/file_util.h"

namespace ft {

namespace {

int64_t Nanoseconds(const timespec& t) { return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec; }

// "2026-12-02 18:30:01.123456789 UTC" of a stamp's time.
std::string TimeText(int64_t ns) {
  const time_t seconds = static_cast<time_t>(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[64];
  std::snprintf(text, sizeof(text), "%04d-%02d-%02d %02d:%02d:%02d.%09lld UTC", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(ns % 1'000'000'000));
  return text;
}

const char kFix[] =
    "; the job cannot go on (or resume) on a silent mix of old and new inputs: restore the file or "
    "submit a new job";

}  // namespace

StatusOr<FileStamp> StampFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IOError(path + ": stat failed: " + std::strerror(err));
  }
  return FileStamp{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                   static_cast<int64_t>(st.st_size), Nanoseconds(st.st_mtim), Nanoseconds(st.st_ctim)};
}

std::string DescribeStampChange(const FileStamp& before, const FileStamp& after) {
  std::string out;
  auto note = [&out](const std::string& what, const std::string& a, const std::string& b) {
    if (a != b) out += (out.empty() ? "" : ", ") + what + " " + a + " -> " + b;
  };
  note("device", std::to_string(before.device), std::to_string(after.device));
  note("inode", std::to_string(before.inode), std::to_string(after.inode));
  note("size", std::to_string(before.size), std::to_string(after.size));
  note("modified", TimeText(before.mtime_ns), TimeText(after.mtime_ns));
  if (out.empty()) note("status changed", TimeText(before.ctime_ns), TimeText(after.ctime_ns));
  return out;
}

void InputFiles::Add(const std::string& key, const std::string& path, const FileStamp& stamp,
                     const std::string& sha256) {
  for (const Watched& w : files_) {
    if (w.path == path) return;
  }
  files_.push_back({key, path, stamp, sha256});
}

Status InputFiles::Watch(const std::string& key, const std::string& path, bool hash) {
  FT_ASSIGN_OR_RETURN(const FileStamp stamp, StampFile(path));
  if (!hash) {
    Add(key, path, stamp, "");
    return Status::OK();
  }
  FT_ASSIGN_OR_RETURN(const std::string sha, Sha256File(path));
  Add(key, path, stamp, sha);
  return Status::OK();
}

Status InputFiles::Check() {
  for (Watched& w : files_) FT_RETURN_IF_ERROR(CheckOne(w));
  return Status::OK();
}

Status InputFiles::CheckOne(Watched& w) {
  StatusOr<FileStamp> now = StampFile(w.path);
  if (now.ok() && *now == w.stamp) return Status::OK();
  const std::string what = w.key.empty() ? w.path : w.key + ": " + w.path;
  if (!now.ok() && now.status().IsNotFound()) {  // worded as ft-train's missing-input message
    const std::string quoted = (w.key.empty() ? "" : w.key + ": ") + "'" + w.path + "'";
    return Status::InvalidArgument(quoted + " no longer exists (removed during the run)" + kFix);
  }
  FT_RETURN_IF_ERROR(now.status());
  if (w.sha256.empty()) {
    return Status::InvalidArgument(what + " changed during the run (" + DescribeStampChange(w.stamp, *now) +
                                   ")" + kFix);
  }
  FT_ASSIGN_OR_RETURN(const std::string sha, Sha256File(w.path));
  if (sha != w.sha256) {
    return Status::InvalidArgument(what + " changed during the run: SHA-256 " + w.sha256 + " at start, " +
                                   sha + " now" + kFix);
  }
  w.stamp = *now;  // the same bytes under a new stamp (touched, or replaced by a copy)
  return Status::OK();
}

std::map<std::string, std::string> InputFiles::Hashes() const {
  std::map<std::string, std::string> out;
  for (const Watched& w : files_) {
    if (!w.sha256.empty()) out[w.key] = w.sha256;
  }
  return out;
}

}  // namespace ft
