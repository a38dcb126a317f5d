#include "worker/process_memory.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

namespace ft::worker {

namespace {

struct ProcInfo {
  pid_t ppid = 0;
  pid_t pgrp = 0;
};

// ppid and process group from /proc/<pid>/stat ("pid (comm) state ppid pgrp ...";
// comm may hold spaces and parentheses, so parse after the last ')'). False when it has gone.
bool ReadStat(pid_t pid, ProcInfo* info) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!in || !std::getline(in, text)) return false;
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  char state = 0;
  int ppid = 0, pgrp = 0;
  if (std::sscanf(text.c_str() + close + 1, " %c %d %d", &state, &ppid, &pgrp) != 3) return false;
  info->ppid = ppid;
  info->pgrp = pgrp;
  return true;
}

// Resident bytes of one process; 0 when it has gone.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/statm");
  long long size_pages = 0, resident_pages = 0;
  if (!(in >> size_pages >> resident_pages)) return 0;
  return static_cast<int64_t>(resident_pages) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

StatusOr<int64_t> ProcessTreesResidentBytes(const std::vector<pid_t>& roots) {
  if (roots.empty()) return int64_t{0};
  std::map<pid_t, ProcInfo> procs;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(name));
    ProcInfo info;
    if (ReadStat(pid, &info)) procs[pid] = info;
  }
  if (ec) return Status::Unavailable("/proc: cannot list processes: " + ec.message());
  std::multimap<pid_t, pid_t> children;  // ppid → pid
  for (const auto& [pid, info] : procs) children.emplace(info.ppid, pid);
  std::set<pid_t> tree;
  std::vector<pid_t> todo;
  for (pid_t root : roots) {
    if (!procs.count(root)) continue;  // already gone
    todo.push_back(root);
    for (const auto& [pid, info] : procs)
      if (info.pgrp == root) todo.push_back(pid);  // the group ft-train leads
  }
  while (!todo.empty()) {
    const pid_t pid = todo.back();
    todo.pop_back();
    if (!tree.insert(pid).second) continue;
    auto [begin, end] = children.equal_range(pid);
    for (auto it = begin; it != end; ++it) todo.push_back(it->second);
  }
  int64_t total = 0;
  for (pid_t pid : tree) total += ResidentBytes(pid);
  return total;
}

StatusOr<int64_t> ProcessTreeResidentBytes(pid_t root) { return ProcessTreesResidentBytes({root}); }

}  // namespace ft::worker
