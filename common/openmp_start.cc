#include "common/openmp_start.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <regex>
#include <string>

namespace ft {

namespace {

// What libomp writes: "<flag address>-<flag value>-<library file name>", NUL-padded.
bool CompleteRegistration(const std::string& text) {
  static const std::regex kRegistration("0x[0-9a-fA-F]+-[0-9a-fA-F]+-[^-\\s]+");
  return std::regex_match(text, kRegistration);
}

}  // namespace

bool ClearStaleOpenMpRegistration() {
  const std::string path =
      "/dev/shm/__KMP_REGISTERED_LIB_" + std::to_string(getpid()) + "_" + std::to_string(getuid());
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  char buffer[1024];
  ssize_t n;
  do {
    n = read(fd, buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  close(fd);
  if (n < 0) return false;
  if (CompleteRegistration(std::string(buffer, strnlen(buffer, static_cast<size_t>(n))))) return false;
  return unlink(path.c_str()) == 0;
}

}  // namespace ft
