// A one-node Slurm cluster of a test's own, on loopback: munged, slurmctld and
// slurmd from the installed packages (Debian's slurmctld, slurmd,
// slurm-client, munge), started in the foreground with a slurm.conf, a munge
// key and every state, spool, log and pid file under the test's directory.
// Cgroup-free (proctrack/linuxproc, task/none), one node "ftnode" with
// CPUs=2, ports of its own, SlurmUser=root (slurmd launches the batch jobs, so
// the test runs as root). Client commands (sbatch, squeue, scontrol, scancel)
// reach it through SLURM_CONF, which the constructor sets in this process's
// environment, so `sbatch --export=ALL` hands it to the jobs as well (and
// unsets SLURM_TIME_FORMAT there: sbatch would let it override a job's own
// --export value).
//
// Thread safety: for a test's main thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace ft::slurm_test {

// What this machine lacks to run a SlurmCluster: the missing binaries by
// name, and "root" when not running as root; "" when nothing is missing.
std::string MissingForSlurm();

// This machine's host name up to the first dot (`hostname -s`).
std::string ShortHostname();

// A batch job as `scontrol show job` reports it.
struct SlurmJob {
  std::string state;      // PENDING, RUNNING, COMPLETED, TIMEOUT, CANCELLED, ...
  std::string reason;     // why it is pending ("None" otherwise)
  int64_t end_s = 0;      // EndTime, Unix seconds (0: unknown)
  int restarts = 0;       // times Slurm requeued and restarted it
  std::string exit_code;  // "CODE:SIGNAL", e.g. "0:0"
  std::string raw;        // the whole one-line record, for failure messages
};

class SlurmCluster {
 public:
  // Starts the three daemons (first killing any left by an earlier run in
  // `dir`, which is emptied) and waits until the node is idle. Throws
  // std::runtime_error, with the daemons' logs, when they do not come up.
  explicit SlurmCluster(const std::string& dir);
  // Cancels every job (scancel) and waits up to 15 s for them to end, stops
  // the daemons (SIGTERM, then SIGKILL) and kills what the jobs left.
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // Runs a client command (argv[0] on PATH); its stdout and stderr.
  // Throws std::runtime_error naming the command and its output when it
  // exits non-zero.
  std::string Run(const std::vector<std::string>& argv);
  // `sbatch --parsable OPTIONS SCRIPT`: the new job's id.
  std::string Sbatch(const std::vector<std::string>& options, const std::string& script);
  SlurmJob Job(const std::string& id);
  // Polls Job(id) until `pred` holds or `timeout_ms` passes; the last seen.
  SlurmJob WaitForJob(const std::string& id, const std::function<bool(const SlurmJob&)>& pred,
                      int64_t timeout_ms);
  // The node's state, e.g. "IDLE", "MIXED+DRAIN".
  std::string NodeState();
  void DrainNode(const std::string& reason);
  void ResumeNode();

  const std::string& dir() const { return dir_; }
  static constexpr const char* kNode = "ftnode";

 private:
  void WriteConfig();
  void KillLeftovers();
  std::string Logs() const;

  std::string dir_;
  std::vector<testing_support::Proc> daemons_;  // munged, slurmctld, slurmd
};

}  // namespace ft::slurm_test
