// Test helper: waits for a process the test did not start (a trainer, its
// child) to end.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace ft::worker::testing_util {

// True once `pid` has exited (no such process, or a zombie its new parent has
// not reaped yet) within `timeout`; false while it still runs.
inline bool GoneWithin(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::string stat;
    std::getline(std::ifstream("/proc/" + std::to_string(pid) + "/stat"), stat);
    const size_t paren = stat.rfind(')');
    if (stat.empty() || (paren != std::string::npos && stat.compare(paren, 4, ") Z ") == 0)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace ft::worker::testing_util
