#include "worker/child_process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string_view>
#include <thread>

namespace ft::worker {

namespace {

// Runs jobs (the fork calls) on one thread that lives as long as the process.
class ForkThread {
 public:
  static ForkThread& Get() {
    static ForkThread* thread = new ForkThread();  // never destroyed: the thread outlives main()
    return *thread;
  }

  void Run(std::function<void()> job) {
    std::packaged_task<void()> task(std::move(job));
    std::future<void> done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(&task);
    }
    cv_.notify_one();
    done.wait();
  }

 private:
  ForkThread() {
    std::thread([this] { Loop(); }).detach();
  }

  void Loop() {
    while (true) {
      std::packaged_task<void()>* task = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !jobs_.empty(); });
        task = jobs_.front();
        jobs_.pop_front();
      }
      (*task)();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>*> jobs_;
};

Status Errno(const std::string& what) { return Status::IOError(what + ": " + std::strerror(errno)); }

// Moves `fd` to a number >= 10 (close-on-exec), so the child's dup2 targets
// 0..4 never collide with a source.
int High(int fd) {
  if (fd < 0) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  ::close(fd);
  return moved;
}

void CloseAll(std::initializer_list<int> fds) {
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
}

// In the forked child: only async-signal-safe calls until exec.
[[noreturn]] void ExecChild(char* const* argv, char* const* envp, pid_t parent, int devnull, int out_w,
                            int ctl, int err_w) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(127);  // the worker died before prctl
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s : {SIGPIPE, SIGTERM, SIGUSR1, SIGINT, SIGHUP, SIGCHLD}) sigaction(s, &dfl, nullptr);
  ::dup2(devnull, 0);
  ::dup2(out_w, 1);
  ::dup2(out_w, 2);
  ::dup2(ctl, 3);
  ::dup2(err_w, 4);
  ::fcntl(4, F_SETFD, FD_CLOEXEC);
  if (::close_range(5, ~0U, 0) != 0)
    for (int fd = 5; fd < 4096; ++fd) ::close(fd);
  ::execve(argv[0], argv, envp);
  const int e = errno;
  [[maybe_unused]] ssize_t w = ::write(4, &e, sizeof(e));
  ::_exit(127);
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (!signaled) return "exit code " + std::to_string(code);
  return "killed by signal " + std::to_string(code) + " (" + strsignal(code) + ")";
}

StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const std::vector<std::string>& argv,
                                                            const std::vector<std::string>& env) {
  if (argv.empty()) return Status::InvalidArgument("spawn: empty argv");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The environment, built before the fork (the child may only make async-signal-safe calls):
  // ours, with `env`'s names replaced.
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& o) {
      return o.size() > name.size() && o.compare(0, name.size(), name) == 0 && o[name.size()] == '=';
    });
    if (!replaced) envp.push_back(*e);
  }
  envp.push_back(nullptr);

  int out[2] = {-1, -1}, err[2] = {-1, -1}, ctl[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0) return Errno("pipe");
  if (::pipe2(err, O_CLOEXEC) != 0 || ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) != 0) {
    Status s = Errno("pipe");
    CloseAll({out[0], out[1], err[0], err[1]});
    return s;
  }
  const int devnull = High(::open("/dev/null", O_RDWR | O_CLOEXEC));
  const int out_w = High(out[1]), err_w = High(err[1]), ctl_child = High(ctl[1]);
  const pid_t parent = ::getpid();
  pid_t pid = -1;
  int fork_errno = 0;
  ForkThread::Get().Run([&] {
    pid = ::fork();
    if (pid == 0) ExecChild(args.data(), envp.data(), parent, devnull, out_w, ctl_child, err_w);
    fork_errno = errno;
  });
  CloseAll({devnull, out_w, err_w, ctl_child});
  if (pid < 0) {
    errno = fork_errno;
    Status s = Errno("fork");
    CloseAll({out[0], err[0], ctl[0]});
    return s;
  }
  ::setpgid(pid, pid);  // also here, so a Signal() right after Spawn reaches the group
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess());
  child->pid_ = pid;
  child->output_fd_ = out[0];
  child->control_fd_ = ctl[0];
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(err[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  ::close(err[0]);
  if (n == sizeof(exec_errno)) {
    // exec failed: the destructor reaps the child
    return exec_errno == ENOENT ? Status::NotFound(argv[0] + ": " + std::strerror(exec_errno))
                                : Status::FailedPrecondition(argv[0] + ": " + std::strerror(exec_errno));
  }
  return child;
}

ChildProcess::~ChildProcess() {
  if (!reaped_ && pid_ > 0) {
    ::killpg(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  CloseAll({output_fd_, control_fd_});
}

Status ChildProcess::WriteControl(const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(control_fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("control channel of pid " + std::to_string(pid_));
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

void ChildProcess::Signal(int signo) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!reaped_) ::killpg(pid_, signo);
}

bool ChildProcess::Poll(ExitStatus* status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reaped_) {
    *status = status_;
    return true;
  }
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) {
    return false;
  }
  ::killpg(pid_, SIGKILL);  // leftovers of the group; the zombie keeps the group id reserved
  int raw = 0;
  while (::waitpid(pid_, &raw, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  status_.signaled = WIFSIGNALED(raw);
  status_.code = status_.signaled ? WTERMSIG(raw) : WEXITSTATUS(raw);
  *status = status_;
  return true;
}

}  // namespace ft::worker
