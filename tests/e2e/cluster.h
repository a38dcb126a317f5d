// End-to-end test harness: real ftd, ft-worker and ft-train processes on
// loopback with ephemeral ports and temporary directories.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/client.h"
#include "common/clock.h"
#include "tests/support/process.h"

namespace ft::e2e {

using testing_support::Proc;
using testing_support::Slurp;
using testing_support::Spawn;
using testing_support::TempPath;

struct ClusterOptions {
  int64_t lease_ms = 3000;
  std::vector<std::string> daemon_args;  // extra ftd flags (e.g. --tls-cert/--tls-key)
  std::string tls_ca;                    // the client's CA bundle ("" = plaintext)
  std::string client_token;              // ftd --client-token; the client sends it
  std::string worker_token;              // ftd --worker-token; workers send it (--token)
  // Runs ftd under this command (e.g. unshare ... sh -c '...' to give it a
  // filesystem of its own); "{data_dir}" in it becomes ftd's --data-dir,
  // which exists by then.
  std::vector<std::string> daemon_wrapper;
};

class Cluster {
 public:
  explicit Cluster(const std::string& name, int64_t lease_ms = 3000);
  Cluster(const std::string& name, ClusterOptions options);
  ~Cluster();  // kills every process it started

  // Starts (or restarts) ftd on the same data dir; waits until it listens.
  void StartDaemon();
  Proc& daemon() { return daemon_; }
  // Starts a worker; extra flags appended (e.g. {"--slot-end", "+20s"}).
  Proc& StartWorker(const std::string& id, const std::vector<std::string>& extra = {});
  Proc& worker(const std::string& id) { return workers_.at(id); }
  // Sends `sig` to every ft-train the worker started (the processes under its work dir).
  void SignalTrainers(const std::string& id, int sig);
  // A node loss: SIGKILLs the worker and every trainer it started, and waits until none is left.
  void KillNode(const std::string& id);

  // A tiny model and data under dir()/job, and a job.yaml with these train keys.
  std::string WriteJob(const std::string& name, int64_t steps, int64_t every_steps,
                       const std::string& extra = "", double dropout = 0, int64_t keep = 3);
  // The job `job_yaml` under another name: a copy beside it whose name and output dir say `name`
  // (the same training: its adapter is the same bytes). The copy's path.
  std::string CopyJob(const std::string& job_yaml, const std::string& name);
  // ft-train run of the same job into another output dir (the uninterrupted
  // reference); Start returns the running process and that output dir.
  std::pair<Proc, std::string> StartReference(const std::string& job_yaml);
  std::string RunReference(const std::string& job_yaml);

  JobsClient& client() { return *client_; }
  const std::string& dir() const { return dir_; }
  const std::string& address() const { return address_; }
  const std::string& http_url() const { return http_url_; }  // "http://127.0.0.1:PORT/"
  std::string data_dir() const { return dir_ + "/ftd"; }
  int64_t lease_ms() const { return options_.lease_ms; }

  // Polls Get(id) until `pred` holds or `timeout_ms` passes; returns the last job seen.
  ftune::v1::Job WaitFor(const std::string& id, const std::function<bool(const ftune::v1::Job&)>& pred,
                         int64_t timeout_ms);
  std::string Submit(const std::string& job_yaml);  // the job's id; throws when refused
  StatusOr<ftune::v1::SubmitReply> TrySubmit(const std::string& job_yaml);

 private:
  std::string dir_;
  std::string address_;
  std::string http_url_;
  int port_ = 0;
  ClusterOptions options_;
  Proc daemon_;
  std::map<std::string, Proc> workers_;
  std::unique_ptr<JobsClient> client_;
};

// Whether the job reached a final state (succeeded, failed, cancelled).
inline bool Done(const ftune::v1::Job& j) {
  return j.state() == ftune::v1::SUCCEEDED || j.state() == ftune::v1::FAILED ||
         j.state() == ftune::v1::CANCELLED;
}

}  // namespace ft::e2e
