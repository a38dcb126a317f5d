// Test helper: an in-process Workers service that records what a worker
// sends and lets a test push DaemonCommands to it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "proto/ftune.grpc.pb.h"

namespace ft::worker::testing_util {

class FakeDaemon final : public ftune::v1::Workers::Service {
 public:
  // Records messages; answers Register with Registered(heartbeat_ms).
  explicit FakeDaemon(int64_t heartbeat_ms = 100) : heartbeat_ms_(heartbeat_ms) {}

  grpc::Status Session(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<ftune::v1::DaemonCommand, ftune::v1::WorkerMessage>* stream) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = context->client_metadata().find("authorization");
      authorization_ =
          it == context->client_metadata().end() ? "" : std::string(it->second.data(), it->second.size());
      ++streams_;
    }
    ftune::v1::WorkerMessage m;
    if (!stream->Read(&m) || !m.has_register_())
      return {grpc::StatusCode::INVALID_ARGUMENT, "register first"};
    Record(m);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!refuse_.ok()) return refuse_;
    }
    ftune::v1::DaemonCommand registered;
    registered.mutable_registered()->set_heartbeat_ms(heartbeat_ms_);
    registered.mutable_registered()->set_lease_ms(10 * heartbeat_ms_);
    stream->Write(registered);
    // Commands are written from this thread after each message read (heartbeats keep it moving).
    while (true) {
      std::deque<ftune::v1::DaemonCommand> out;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (break_streams_ > 0) {
          --break_streams_;
          return {grpc::StatusCode::UNAVAILABLE, "fake daemon breaks the stream"};
        }
        out.swap(pending_);
      }
      for (const auto& c : out) stream->Write(c);
      if (!stream->Read(&m)) break;
      Record(m);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++half_closed_;
    cv_.notify_all();
    return grpc::Status::OK;
  }

  void Push(ftune::v1::DaemonCommand c) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(c));
  }
  // Every registration from now on is answered with `status` (OK: accepted again).
  void RefuseRegistrations(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_ = std::move(status);
  }
  void BreakNextStream() {
    std::lock_guard<std::mutex> lock(mu_);
    ++break_streams_;
  }

  // Waits until pred(messages) holds; false at timeout.
  bool WaitFor(const std::function<bool(const std::vector<ftune::v1::WorkerMessage>&)>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(messages_); });
  }
  std::vector<ftune::v1::WorkerMessage> messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  // Forgets the messages recorded so far.
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.clear();
  }
  std::string authorization() {
    std::lock_guard<std::mutex> lock(mu_);
    return authorization_;
  }
  int streams() {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_;
  }
  int half_closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return half_closed_;
  }

 private:
  void Record(const ftune::v1::WorkerMessage& m) {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.push_back(m);
    cv_.notify_all();
  }

  const int64_t heartbeat_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ftune::v1::WorkerMessage> messages_;
  std::deque<ftune::v1::DaemonCommand> pending_;
  std::string authorization_;
  int streams_ = 0;
  int break_streams_ = 0;
  grpc::Status refuse_;
  int half_closed_ = 0;
};

// A gRPC server for a FakeDaemon on 127.0.0.1 (port 0 = pick one).
class FakeDaemonServer {
 public:
  explicit FakeDaemonServer(FakeDaemon* daemon, int port = 0) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(daemon);
    server_ = b.BuildAndStart();
  }
  ~FakeDaemonServer() { Stop(); }
  void Stop() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_.reset();
  }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

inline int Count(const std::vector<ftune::v1::WorkerMessage>& ms,
                 const std::function<bool(const ftune::v1::WorkerMessage&)>& pred) {
  int n = 0;
  for (const auto& m : ms) n += pred(m) ? 1 : 0;
  return n;
}

}  // namespace ft::worker::testing_util
