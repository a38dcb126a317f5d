// Device discovery: the CPU device, with and without --cpu-memory; with it,
// "used" is the resident memory of the running trainers' process trees,
// measured on real processes that allocate and touch known amounts.
#include "worker/devices.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "worker/process_memory.h"

namespace ft::worker {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// `bytes` of fresh anonymous memory made resident: one write per page, no
// sanitizer instrumentation (TSan would make its shadow memory resident too,
// tripling what the process holds).
__attribute__((no_sanitize("thread", "address"))) bool TouchNewMemory(size_t bytes) {
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return false;
  volatile char* p = static_cast<char*>(map);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < bytes; i += page) p[i] = 1;  // resident, not the shared zero page
  return true;
}

// Acks once when ready, then reads one byte per command from `cmd`; each one
// allocates and touches `bytes` more, then acks one byte on `ack`. Exits at EOF.
[[noreturn]] void AllocateOnCommand(int cmd, int ack, size_t bytes) {
  char c = 'r';
  if (write(ack, &c, 1) != 1) _exit(4);
  while (read(cmd, &c, 1) == 1) {
    if (!TouchNewMemory(bytes)) _exit(3);
    if (write(ack, &c, 1) != 1) _exit(4);
  }
  _exit(0);
}

// A stand-in for ft-train: a process leading its own group (as ChildProcess
// makes it) with a child of its own. The leader allocates 200 MiB and the
// grandchild 64 MiB when told to. Both are forked before anything is
// allocated, so no page is shared copy-on-write between them.
class AllocatingTree {
 public:
  AllocatingTree() {
    if (pipe(leader_cmd_) != 0 || pipe(grandchild_cmd_) != 0 || pipe(ack_) != 0) std::abort();
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      close(ack_[0]);
      if (fork() == 0) {
        close(leader_cmd_[0]);
        AllocateOnCommand(grandchild_cmd_[0], ack_[1], 64 * kMiB);
      }
      close(grandchild_cmd_[0]);
      AllocateOnCommand(leader_cmd_[0], ack_[1], 200 * kMiB);
    }
    close(leader_cmd_[0]);
    close(grandchild_cmd_[0]);
    close(ack_[1]);
    char ready = 0;
    ready_ = pid_ > 0 && read(ack_[0], &ready, 1) == 1 && read(ack_[0], &ready, 1) == 1;  // both exist
  }
  ~AllocatingTree() {
    close(leader_cmd_[1]);
    close(grandchild_cmd_[1]);
    close(ack_[0]);
    if (pid_ <= 0) return;
    kill(-pid_, SIGKILL);  // the group: leader and grandchild
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return ready_ ? pid_ : -1; }
  // Tells the leader (or the grandchild) to allocate; true once it has.
  bool Allocate(bool grandchild) {
    const char c = 'a';
    if (write(grandchild ? grandchild_cmd_[1] : leader_cmd_[1], &c, 1) != 1) return false;
    char ack = 0;
    return read(ack_[0], &ack, 1) == 1;
  }

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
  int leader_cmd_[2]{}, grandchild_cmd_[2]{}, ack_[2]{};
};

int64_t TreeBytes(pid_t pid) {
  auto bytes = ProcessTreeResidentBytes(pid);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : -1;
}

// A rank of a multi-rank attempt on a GPU talks NCCL and sees its GPU alone (the worker's own
// CUDA_VISIBLE_DEVICES list mapped); on CPU devices it talks Gloo and gets its share of the cores,
// unless the operator set OMP_NUM_THREADS for the worker.
TEST(DevicesTest, ARankOnAGpuTalksNcclAndSeesItsGpuAloneOnACpuGlooAndItsShareOfTheCores) {
  const std::vector<Device> gpus = {{.index = 0, .kind = DeviceKind::kCuda},
                                    {.index = 1, .kind = DeviceKind::kCuda}};
  RankLaunch on_gpu = RankLaunchOn(gpus, 1, nullptr, nullptr, 16);
  EXPECT_EQ(on_gpu.dist_backend, "nccl");
  EXPECT_EQ(on_gpu.env, std::vector<std::string>{"CUDA_VISIBLE_DEVICES=1"});
  EXPECT_EQ(RankLaunchOn(gpus, 1, "4,6", nullptr, 16).env,
            std::vector<std::string>{"CUDA_VISIBLE_DEVICES=6"});
  const std::vector<Device> cpus = {{.index = 0}, {.index = 1}, {.index = 2}, {.index = 3}};
  RankLaunch on_cpu = RankLaunchOn(cpus, 2, nullptr, nullptr, 16);
  EXPECT_EQ(on_cpu.dist_backend, "") << "ft-train's default: gloo";
  EXPECT_EQ(on_cpu.env, (std::vector<std::string>{"OMP_NUM_THREADS=4", "OPENBLAS_NUM_THREADS=4"}));
  EXPECT_TRUE(RankLaunchOn(cpus, 2, nullptr, "3", 16).env.empty())
      << "the operator's OMP_NUM_THREADS is inherited";
}

TEST(DevicesTest, CpuDeviceWithOverriddenMemory) {
  DeviceOptions options;
  options.cpu_memory_bytes = int64_t{8} << 30;
  options.allow_cuda = false;
  auto devices = DiscoverDevices(options);
  ASSERT_TRUE(devices.ok()) << devices.status().ToString();
  ASSERT_EQ(devices->size(), 1u);
  const Device& d = (*devices)[0];
  EXPECT_EQ(d.kind, DeviceKind::kCpu);
  EXPECT_EQ(d.index, 0);
  EXPECT_FALSE(d.name.empty());
  EXPECT_EQ(d.total_bytes, int64_t{8} << 30);
  EXPECT_EQ(d.free_bytes, int64_t{8} << 30);
}

TEST(DevicesTest, CpuDeviceFromProcMeminfo) {
  DeviceOptions options;
  options.allow_cuda = false;
  auto d = CpuDevice(options);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_GT(d->total_bytes, 0);
  EXPECT_GT(d->free_bytes, 0);
  EXPECT_LE(d->free_bytes, d->total_bytes);
  EXPECT_EQ(d->used_bytes, d->total_bytes - d->free_bytes);
}

TEST(DevicesTest, CpuDevicesSplitTheHostOrEachGetTheBudget) {
  DeviceOptions options{.allow_cuda = false};
  options.cpu_devices = 2;
  auto split = CpuDevices(options);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  ASSERT_EQ(split->size(), 2u);
  EXPECT_EQ((*split)[0].index, 0);
  EXPECT_EQ((*split)[1].index, 1);
  auto host = ReadHostMemory();
  ASSERT_TRUE(host.ok());
  EXPECT_EQ((*split)[1].total_bytes, host->total_bytes / 2) << "each a half of the host";
  // With a budget, each device has all of it; the trainers' resident memory is shared out.
  options.cpu_memory_bytes = int64_t{4} << 30;
  auto budget = CpuDevices(options, int64_t{2} << 30);
  ASSERT_TRUE(budget.ok());
  for (const Device& d : *budget) {
    EXPECT_EQ(d.total_bytes, int64_t{4} << 30);
    EXPECT_EQ(d.used_bytes, int64_t{1} << 30);
    EXPECT_EQ(d.free_bytes, int64_t{3} << 30);
  }
  auto discovered = DiscoverDevices(options);
  ASSERT_TRUE(discovered.ok());
  EXPECT_EQ(discovered->size(), 2u) << "--cpu-devices 2 is what the worker registers";
}

TEST(DevicesTest, HostMemoryIsTheNodesMeminfo) {
  auto h = ReadHostMemory();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_GT(h->total_bytes, int64_t{64} << 20);
  EXPECT_GT(h->free_bytes, 0);
  EXPECT_LE(h->free_bytes, h->total_bytes);
  // The same figures as the CPU device without a budget (both from /proc/meminfo).
  auto cpu = CpuDevice(DeviceOptions{});
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->total_bytes, h->total_bytes);
}

TEST(DevicesTest, DiscoveryFindsSomething) {
  // GPUs where CUDA is compiled in and visible; else the CPU.
  auto devices = DiscoverDevices(DeviceOptions{});
  ASSERT_TRUE(devices.ok()) << devices.status().ToString();
  ASSERT_FALSE(devices->empty());
  for (const Device& d : *devices) {
    EXPECT_TRUE(d.kind == DeviceKind::kCpu || d.kind == DeviceKind::kCuda) << DeviceKindName(d.kind);
    EXPECT_GT(d.total_bytes, 0);
  }
}

TEST(DevicesTest, MonitorRefreshesCpuMemory) {
  DeviceOptions options;
  options.allow_cuda = false;
  DeviceMonitor monitor(options);
  ASSERT_TRUE(monitor.Init().ok());
  const std::vector<Device>& now = monitor.Current({getpid()});
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].kind, DeviceKind::kCpu);
  EXPECT_GT(now[0].free_bytes, 0);
  // Without --cpu-memory the host's numbers stand, trainers or not.
  EXPECT_EQ(now[0].used_bytes, now[0].total_bytes - now[0].free_bytes);
}

TEST(ProcessMemoryTest, TreeResidentBytesFollowTheLeaderAndItsDescendants) {
  AllocatingTree tree;
  ASSERT_GT(tree.pid(), 0);
  // Before anything is allocated: both processes exist, small.
  const int64_t before = TreeBytes(tree.pid());
  ASSERT_GT(before, 0);
  ASSERT_TRUE(tree.Allocate(/*grandchild=*/false));
  const int64_t leader = TreeBytes(tree.pid());
  EXPECT_NEAR(static_cast<double>(leader - before), 200.0 * kMiB, 8.0 * kMiB);
  ASSERT_TRUE(tree.Allocate(/*grandchild=*/true));
  const int64_t both = TreeBytes(tree.pid());
  EXPECT_NEAR(static_cast<double>(both - leader), 64.0 * kMiB, 8.0 * kMiB);
  // Several roots: each process once.
  auto twice = ProcessTreesResidentBytes({tree.pid(), tree.pid()});
  ASSERT_TRUE(twice.ok());
  EXPECT_NEAR(static_cast<double>(*twice), static_cast<double>(both), 4.0 * kMiB);
}

TEST(ProcessMemoryTest, GoneProcessHasNoResidentMemory) {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  ASSERT_GT(pid, 0);
  waitpid(pid, nullptr, 0);
  EXPECT_EQ(TreeBytes(pid), 0);
  auto none = ProcessTreesResidentBytes({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
}

TEST(DevicesTest, FixedCpuMemoryReportsTheTrainersResidentMemoryAsUsed) {
  DeviceOptions options;
  options.cpu_memory_bytes = int64_t{8} << 30;
  options.allow_cuda = false;
  DeviceMonitor monitor(options);
  ASSERT_TRUE(monitor.Init().ok());
  // Idle: nothing used, the whole budget free.
  std::vector<Device> idle = monitor.Current({});
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_EQ(idle[0].used_bytes, 0);
  EXPECT_EQ(idle[0].free_bytes, options.cpu_memory_bytes);
  EXPECT_EQ(idle[0].total_bytes, options.cpu_memory_bytes);

  AllocatingTree tree;
  ASSERT_GT(tree.pid(), 0);
  const int64_t before = TreeBytes(tree.pid());
  ASSERT_TRUE(tree.Allocate(/*grandchild=*/false));
  std::vector<Device> busy = monitor.Current({tree.pid()});
  ASSERT_EQ(busy.size(), 1u);
  EXPECT_NEAR(static_cast<double>(busy[0].used_bytes), static_cast<double>(before + 200 * kMiB), 8.0 * kMiB);
  EXPECT_GE(busy[0].used_bytes, 200 * kMiB);
  EXPECT_EQ(busy[0].free_bytes, busy[0].total_bytes - busy[0].used_bytes);
  EXPECT_EQ(busy[0].total_bytes, options.cpu_memory_bytes);

  // A budget smaller than what the trainer holds: used says so, free is 0.
  auto over = CpuDevice({.cpu_memory_bytes = 100 * kMiB, .allow_cuda = false}, busy[0].used_bytes);
  ASSERT_TRUE(over.ok());
  EXPECT_EQ(over->used_bytes, busy[0].used_bytes);
  EXPECT_EQ(over->free_bytes, 0);
}

}  // namespace
}  // namespace ft::worker
