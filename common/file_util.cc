#include "common/file_util.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "common/confined_path.h"

namespace ft {

namespace fs = std::filesystem;

namespace {
Status Errno(const std::string& path, const char* what) {
  return Status::IOError(path + ": " + what + ": " + std::strerror(errno));
}

std::string Hex(const unsigned char* digest, unsigned int n) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

using EvpCtx = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;
}  // namespace

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno(path, "write failed");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

Status WriteFileDurably(const std::string& path, const std::string& data) {
  FT_ASSIGN_OR_RETURN(int fd, OpenConfined(path, O_WRONLY | O_CREAT | O_TRUNC));
  if (Status s = WriteAll(fd, data.data(), data.size(), path); !s.ok()) {
    ::close(fd);
    return s;
  }
  if (::fsync(fd) != 0) {
    Status s = Errno(path, "fsync failed");
    ::close(fd);
    return s;
  }
  if (::close(fd) != 0) return Errno(path, "close failed");
  return Status::OK();
}

Status ReplaceFileAtomically(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FT_RETURN_IF_ERROR(WriteFileDurably(tmp, data));
  return RenameDurably(tmp, path);
}

StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size) {
  FT_ASSIGN_OR_RETURN(int fd, OpenConfined(path, O_RDONLY | O_NONBLOCK | O_NOCTTY));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = Errno(path, "fstat failed");
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISFIFO(st.st_mode)  ? "a FIFO"
                       : S_ISDIR(st.st_mode) ? "a directory"
                       : S_ISCHR(st.st_mode) ? "a character device"
                       : S_ISBLK(st.st_mode) ? "a block device"
                                             : "a socket";
    return Status::InvalidArgument(path + ": is " + kind + ", not a regular file; point it at a file");
  }
  // Back to blocking reads: a regular file never blocks, and the flag must not leak to callers.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

StatusOr<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  FT_ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size));
  auto too_big = [&](uint64_t n) {
    return Status::InvalidArgument(path + ": is " + std::to_string(n) + " bytes, over the limit of " +
                                   std::to_string(max_bytes >> 20) + " MiB for this file");
  };
  if (size > max_bytes) {
    ::close(fd);
    return too_big(size);
  }
  std::string out(static_cast<size_t>(size), '\0');
  size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (out.size() > max_bytes) break;  // grew while being read
      out.resize(std::min<uint64_t>(max_bytes + 1, out.size() + (64 << 10)));
    }
    const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      Status s = Errno(path, "read failed");
      ::close(fd);
      return s;
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  if (got > max_bytes) return too_big(got);
  out.resize(got);
  return out;
}

Status SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(dir, "cannot open directory");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno(dir, "fsync of directory failed");
  return Status::OK();
}

Status RenameDurably(const std::string& from_path, const std::string& to_path) {
  FT_ASSIGN_OR_RETURN(const std::string from, Confine(from_path));
  FT_ASSIGN_OR_RETURN(const std::string to, Confine(to_path));
  if (::rename(from.c_str(), to.c_str()) != 0) return Errno(from_path + " -> " + to_path, "rename failed");
  std::string parent = fs::path(to).parent_path().string();
  return SyncDirectory(parent.empty() ? "." : parent);
}

StatusOr<std::string> Sha256File(const std::string& path, uint64_t* size) {
  uint64_t expected = 0;
  FT_ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &expected));
  EvpCtx ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    ::close(fd);
    return Status::Internal("EVP sha256 init failed");
  }
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  for (;;) {
    const ssize_t got = ::read(fd, buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      Status s = Errno(path, "read failed");
      ::close(fd);
      return s;
    }
    if (got == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(got));
    total += static_cast<uint64_t>(got);
  }
  ::close(fd);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &n);
  if (size) *size = total;
  return Hex(digest, n);
}

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), digest, &n, EVP_sha256(), nullptr);
  return Hex(digest, n);
}

}  // namespace ft
