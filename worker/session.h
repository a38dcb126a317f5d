// The worker's side of Workers.Session: one bidirectional gRPC stream to ftd,
// re-established with jittered exponential backoff (100 ms → 1 s) whenever it
// breaks, for as long as the worker runs. The cap is short on purpose: after
// a daemon restart the worker must be back before its lease expires, or its
// running attempts are requeued while their trainers still run. A
// registration the daemon refused (ALREADY_EXISTS, FAILED_PRECONDITION,
// INVALID_ARGUMENT: another ft-worker holds this --id, the report is
// implausible) would be refused again at once: those back off longer (1 s →
// 60 s), each logged with the daemon's reason and the wait.
//
// Each stream starts with Register (built fresh by the delegate, so it lists
// the attempts running now); once the daemon answers Registered, queued
// reports are written in order and a Heartbeat goes out every heartbeat_ms.
// Reports queued while disconnected wait for the next registration. Checkpoint
// commits and attempt exits written shortly before a stream broke may not have
// reached the daemon, so they are written again on the next stream: the
// daemon must treat repeats as no-ops. When too much piles up, the oldest
// metrics and log reports are dropped first; checkpoint commits and exits
// never are.
//
// Commands from the daemon are handed to the delegate on the session thread,
// one at a time; Reregister is the session's own: it ends the stream, and the
// next one starts with a fresh Register.
//
// Thread safety: Send, DropQueued and the accessors may be called from any
// thread. The delegate is called without the session's lock held, so it may
// call Send.
#pragma once

#include <grpcpp/security/credentials.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "proto/ftune.grpc.pb.h"
#include "proto/ftune.pb.h"

namespace ft::worker {

struct SessionOptions {
  std::string target;  // the daemon, "host:port"
  std::string token;   // sent as "authorization: Bearer <token>"; "" = none
  // TLS or plaintext (proto/credentials.h); null = plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{1000};              // well under any lease (the e2e tests use 3 s)
  std::chrono::milliseconds refused_backoff_initial{1000};  // after a registration the daemon refused
  std::chrono::milliseconds refused_backoff_max{60000};
  std::chrono::milliseconds register_timeout{10000};  // Registered must come this soon
  std::chrono::milliseconds default_heartbeat{5000};  // when Registered names none
  std::chrono::milliseconds resend_window{10000};     // see the file comment
  size_t max_queued = 20000;
};

class SessionDelegate {
 public:
  virtual ~SessionDelegate() = default;
  virtual ftune::v1::Register MakeRegister() = 0;
  virtual ftune::v1::Heartbeat MakeHeartbeat() = 0;
  virtual void OnCommand(const ftune::v1::DaemonCommand& command) = 0;
  // The daemon acknowledged the Register that MakeRegister made last.
  virtual void OnRegistered() {}
};

// Where the worker's reports go (the Session; a fake in tests).
class ReportSink {
 public:
  virtual ~ReportSink() = default;
  virtual void Send(ftune::v1::WorkerMessage message) = 0;
  // Forgets queued reports of one attempt (it was superseded).
  virtual void DropQueued(const std::string& job_id, int64_t epoch) = 0;
};

class Session : public ReportSink {
 public:
  Session(SessionOptions options, SessionDelegate* delegate);
  ~Session() override;  // Shutdown(0)

  // Starts the session thread.
  void Start();

  void Send(ftune::v1::WorkerMessage message) override;
  void DropQueued(const std::string& job_id, int64_t epoch) override;

  // Writes what is queued (waiting up to flush_timeout for a registered
  // stream to take it), half-closes the stream and stops the thread. True
  // when nothing queued was left unwritten.
  bool Shutdown(std::chrono::milliseconds flush_timeout);

  bool registered() const;
  int64_t registrations() const;  // streams that got Registered so far
  int64_t lease_ms() const;       // from the newest Registered; 0 before

 private:
  using Stream = grpc::ClientReaderWriter<ftune::v1::WorkerMessage, ftune::v1::DaemonCommand>;
  struct Queued {
    ftune::v1::WorkerMessage message;
    bool critical = false;  // a checkpoint commit or an exit
    std::chrono::steady_clock::time_point written;
  };

  void Run();
  // One stream from Register to its end; true when it got Registered.
  // *status: how the stream ended.
  bool RunStream(grpc::Status* status);
  // `wait`: until the next try.
  void LogStreamEnd(bool registered, const grpc::Status& status, int failures,
                    std::chrono::milliseconds wait);
  // Writer thread of one stream: queued reports and heartbeats.
  void WriteLoop(Stream* stream, grpc::ClientContext* context);
  void HandleRegistered(const ftune::v1::Registered& r);
  void RequeueRecent();                // mu_ held
  void Enqueue(Queued q, bool front);  // mu_ held
  // Jittered: between half and all of initial × 2^failures, at most max.
  static std::chrono::milliseconds Backoff(int failures, std::chrono::milliseconds initial,
                                           std::chrono::milliseconds max);

  const SessionOptions options_;
  SessionDelegate* const delegate_;
  void NewChannel();  // channel_ and stub_ for options_.target (only the Run thread, or the constructor)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ftune::v1::Workers::Stub> stub_;
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;                // GUARDED_BY(mu_)
  std::deque<Queued> recent_;               // GUARDED_BY(mu_): critical messages written lately
  bool closing_ = false;                    // GUARDED_BY(mu_): flushed; half-close and end
  bool stream_done_ = true;                 // GUARDED_BY(mu_): the current stream's reads ended
  bool registered_ = false;                 // GUARDED_BY(mu_)
  bool running_ = false;                    // GUARDED_BY(mu_): the session thread runs
  bool writing_ = false;                    // GUARDED_BY(mu_): a queued report is being written
  int64_t registrations_ = 0;               // GUARDED_BY(mu_)
  int64_t lease_ms_ = 0;                    // GUARDED_BY(mu_)
  int64_t dropped_ = 0;                     // GUARDED_BY(mu_): metrics/log reports dropped for space
  std::chrono::milliseconds heartbeat_;     // GUARDED_BY(mu_)
  grpc::ClientContext* context_ = nullptr;  // GUARDED_BY(mu_): the current stream's
};

}  // namespace ft::worker
