#include "tests/slurm/slurm_cluster.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tests/support/free_port.h"

namespace ft::slurm_test {

namespace fs = std::filesystem;
using testing_support::Proc;
using testing_support::Slurp;
using testing_support::Spawn;

namespace {

const std::vector<const char*> kDaemons = {"munged", "slurmctld", "slurmd"};
const std::vector<const char*> kClients = {"sbatch", "squeue", "scontrol", "scancel"};

// The binary's path: on PATH, or in the sbin directories a non-root PATH may lack.
std::string FindBinary(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin";
  std::stringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && access((dir + "/" + name).c_str(), X_OK) == 0) return dir + "/" + name;
  }
  return "";
}

// Single-quoted for sh.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// "2026-11-28T08:45:48" (Slurm's standard format, local time) as Unix seconds; 0 otherwise.
int64_t LocalTimeSeconds(const std::string& text) {
  std::tm tm{};
  if (strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return 0;
  tm.tm_isdst = -1;
  return static_cast<int64_t>(std::mktime(&tm));
}

// The value of KEY= in a one-line `scontrol show -o` record ("" when absent).
std::string Field(const std::string& record, const std::string& key) {
  const std::string needle = key + "=";
  size_t at = 0;
  while ((at = record.find(needle, at)) != std::string::npos) {
    if (at == 0 || record[at - 1] == ' ') {
      const size_t start = at + needle.size();
      return record.substr(start, record.find(' ', start) - start);
    }
    at += needle.size();
  }
  return "";
}

void WaitOrThrow(const std::function<bool()>& ready, int64_t timeout_ms, const std::string& what,
                 const std::function<std::string()>& logs) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > end) throw std::runtime_error(what + "\n" + logs());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

std::string ShortHostname() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  const std::string host = name;
  return host.substr(0, host.find('.'));
}

std::string MissingForSlurm() {
  std::vector<std::string> missing;
  for (const auto* names : {&kDaemons, &kClients}) {
    for (const char* b : *names) {
      if (FindBinary(b).empty()) missing.push_back(b);
    }
  }
  if (geteuid() != 0) missing.push_back("root (slurmd launches the jobs)");
  std::string text;
  for (const std::string& m : missing) text += (text.empty() ? "" : ", ") + m;
  return text;
}

SlurmCluster::SlurmCluster(const std::string& dir) : dir_(dir) {
  KillLeftovers();
  fs::remove_all(dir_);
  for (const char* sub : {"ctld", "spool", "tmp"}) fs::create_directories(dir_ + "/" + sub);
  setenv("SLURM_CONF", (dir_ + "/slurm.conf").c_str(), 1);
  // Not passed on to sbatch, which would let it override a job's own --export
  // value; Job() asks scontrol for the standard format it parses.
  unsetenv("SLURM_TIME_FORMAT");
  WriteConfig();
  {
    std::ofstream key(dir_ + "/munge.key", std::ios::binary);
    std::random_device rd;
    for (int i = 0; i < 1024; ++i) key.put(static_cast<char>(rd()));
  }
  chmod((dir_ + "/munge.key").c_str(), 0600);
  const std::string sock = dir_ + "/munge.sock";
  daemons_.push_back(Spawn({FindBinary("munged"), "--foreground", "--force", "--socket=" + sock,
                            "--key-file=" + dir_ + "/munge.key", "--log-file=" + dir_ + "/munged.log",
                            "--pid-file=" + dir_ + "/munged.pid", "--seed-file=" + dir_ + "/munged.seed"},
                           {.log = dir_ + "/munged.out"}));
  WaitOrThrow([&] { return fs::exists(sock); }, 20'000, "munged did not start", [this] { return Logs(); });
  const std::string conf = dir_ + "/slurm.conf";
  daemons_.push_back(Spawn({FindBinary("slurmctld"), "-D", "-f", conf}, {.log = dir_ + "/slurmctld.out"}));
  daemons_.push_back(
      Spawn({FindBinary("slurmd"), "-D", "-N", kNode, "-f", conf}, {.log = dir_ + "/slurmd.out"}));
  WaitOrThrow(
      [this] {
        try {
          const std::string state = NodeState();
          return state == "IDLE";
        } catch (const std::exception&) {
          return false;  // slurmctld not answering yet
        }
      },
      60'000, "the Slurm node did not become idle", [this] { return Logs(); });
}

void SlurmCluster::WriteConfig() {
  const std::string host = ShortHostname();
  const int ctld_port = testing_support::FreeLoopbackPort();
  int slurmd_port = testing_support::FreeLoopbackPort();
  while (slurmd_port == ctld_port) slurmd_port = testing_support::FreeLoopbackPort();
  std::ofstream(dir_ + "/slurm.conf")
      << "ClusterName=fttest\nSlurmctldHost=" << host << "(127.0.0.1)\n"
      << "SlurmUser=root\nSlurmdUser=root\n"
      << "SlurmctldPort=" << ctld_port << "\nSlurmdPort=" << slurmd_port << "\n"
      << "AuthType=auth/munge\nCredType=cred/munge\n"
      // cred_expire: a requeued job may start again 5 s after its requeue (default 120 s).
      << "AuthInfo=socket=" << dir_ << "/munge.sock,cred_expire=5\n"
      << "StateSaveLocation=" << dir_ << "/ctld\nSlurmdSpoolDir=" << dir_ << "/spool\n"
      << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\nSlurmdPidFile=" << dir_ << "/slurmd.pid\n"
      << "SlurmctldLogFile=" << dir_ << "/slurmctld.log\nSlurmdLogFile=" << dir_ << "/slurmd.log\n"
      << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
      << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
      // A full scheduling pass every 2 s (default 60): a requeued job starts once its begin time passes.
      << "SchedulerType=sched/builtin\nSchedulerParameters=sched_interval=2\n"
      << "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n"
      << "JobCompType=jobcomp/none\nMpiDefault=none\nMailProg=/bin/true\n"
      << "ReturnToService=2\nKillWait=30\nMinJobAge=600\nInactiveLimit=0\n"
      << "NodeName=" << kNode << " NodeHostname=" << host
      << " NodeAddr=127.0.0.1 CPUs=2 RealMemory=4000 State=UNKNOWN\n"
      // FORCE:4: up to 4 allocations share a CPU, so a worker waiting out its
      // time limit does not keep the next one from starting.
      << "PartitionName=ft Nodes=" << kNode
      << " Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4\n";
}

SlurmCluster::~SlurmCluster() {
  try {
    std::stringstream ids(Run({"squeue", "--noheader", "--format=%i"}));
    for (std::string id; ids >> id;) Run({"scancel", id});  // SIGTERM: the workers stop cleanly
    WaitOrThrow(
        [this] {
          return Run({"squeue", "--noheader", "--states=RUNNING,COMPLETING"}).empty();
        },
        15'000, "", [] { return std::string(); });
  } catch (const std::exception&) {
    // the daemons are stopped below whatever state the jobs are in
  }
  for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) {
    it->Signal(SIGTERM);
    if (it->WaitFor(std::chrono::seconds(5)) < 0) {
      it->Signal(SIGKILL);
      it->Wait();
    }
  }
  KillLeftovers();
}

void SlurmCluster::KillLeftovers() {
  for (const char* d : kDaemons) {
    const std::string pid_text = Slurp(dir_ + "/" + d + ".pid");
    const pid_t pid = static_cast<pid_t>(std::atol(pid_text.c_str()));
    if (pid > 0 && Slurp("/proc/" + std::to_string(pid) + "/cmdline").find(dir_) != std::string::npos) {
      kill(pid, SIGKILL);
    }
  }
  // Workers and trainers the jobs started (their paths lie under dir_); "[/]"
  // matches "/" but not itself, so pkill spares the shell that runs it.
  std::system(("pkill -9 -f " + Quote(dir_ + "[/]") + " >/dev/null 2>&1").c_str());
}

std::string SlurmCluster::Run(const std::vector<std::string>& argv) {
  std::string command;
  for (const std::string& a : argv) command += Quote(a) + " ";
  FILE* pipe = popen((command + "2>&1").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run " + command);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) throw std::runtime_error(command + "exited " + std::to_string(status) + ": " + out);
  return out;
}

std::string SlurmCluster::Sbatch(const std::vector<std::string>& options, const std::string& script) {
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back(script);
  std::string out = Run(argv);
  out = out.substr(0, out.find_first_of(";\n"));
  if (out.empty() || out.find_first_not_of("0123456789") != std::string::npos) {
    throw std::runtime_error("sbatch printed no job id: " + out);
  }
  return out;
}

SlurmJob SlurmCluster::Job(const std::string& id) {
  SlurmJob job;
  job.raw = Run({"env", "SLURM_TIME_FORMAT=standard", "scontrol", "--oneliner", "show", "job", id});
  job.state = Field(job.raw, "JobState");
  job.reason = Field(job.raw, "Reason");
  job.end_s = LocalTimeSeconds(Field(job.raw, "EndTime"));
  job.restarts = std::atoi(Field(job.raw, "Restarts").c_str());
  job.exit_code = Field(job.raw, "ExitCode");
  return job;
}

SlurmJob SlurmCluster::WaitForJob(const std::string& id, const std::function<bool(const SlurmJob&)>& pred,
                                  int64_t timeout_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  SlurmJob job = Job(id);
  while (!pred(job) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    job = Job(id);
  }
  return job;
}

std::string SlurmCluster::NodeState() {
  return Field(Run({"scontrol", "--oneliner", "show", "node", kNode}), "State");
}

void SlurmCluster::DrainNode(const std::string& reason) {
  Run({"scontrol", "update", std::string("NodeName=") + kNode, "State=DRAIN", "Reason=" + reason});
}

void SlurmCluster::ResumeNode() {
  Run({"scontrol", "update", std::string("NodeName=") + kNode, "State=RESUME"});
}

std::string SlurmCluster::Logs() const {
  std::string text;
  for (const char* f :
       {"munged.out", "munged.log", "slurmctld.out", "slurmctld.log", "slurmd.out", "slurmd.log"}) {
    const std::string body = Slurp(dir_ + "/" + f);
    text += "--- " + std::string(f) + "\n" + body.substr(body.size() > 3000 ? body.size() - 3000 : 0);
  }
  return text;
}

}  // namespace ft::slurm_test
