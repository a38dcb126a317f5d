// The worker's gRPC session against an in-process fake daemon: Register
// first with the bearer token, heartbeats, queued reports, commands,
// reconnects (with critical reports resent) and a flushing shutdown.
#include "worker/session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "tests/worker/fake_daemon.h"

namespace ft::worker {
namespace {

namespace pb = ftune::v1;
using testing_util::Count;
using testing_util::FakeDaemon;
using testing_util::FakeDaemonServer;
using Messages = std::vector<pb::WorkerMessage>;

class FakeDelegate : public SessionDelegate {
 public:
  pb::Register MakeRegister() override {
    pb::Register r;
    r.set_worker_id("w1");
    r.set_hostname("host1");
    pb::Device* d = r.add_devices();
    d->set_kind("cpu");
    d->set_total_bytes(8 << 20);
    return r;
  }
  pb::Heartbeat MakeHeartbeat() override {
    pb::Heartbeat h;
    h.set_slot_end_ms(42);
    return h;
  }
  void OnCommand(const pb::DaemonCommand& c) override {
    std::lock_guard<std::mutex> lock(mu);
    commands.push_back(c);
    cv.notify_all();
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<pb::DaemonCommand> commands;
};

SessionOptions Options(const std::string& target) {
  SessionOptions o;
  o.target = target;
  o.token = "secret";
  o.backoff_max = std::chrono::milliseconds(300);
  return o;
}

pb::WorkerMessage Log(const std::string& job, int64_t epoch, const std::string& text) {
  pb::WorkerMessage m;
  m.mutable_log()->set_job_id(job);
  m.mutable_log()->set_epoch(epoch);
  m.mutable_log()->set_text(text);
  return m;
}

pb::WorkerMessage Exited(const std::string& job, int64_t epoch) {
  pb::WorkerMessage m;
  m.mutable_exited()->set_job_id(job);
  m.mutable_exited()->set_epoch(epoch);
  m.mutable_exited()->set_outcome(pb::ATTEMPT_PREEMPTED);
  return m;
}

int Heartbeats(const Messages& ms) {
  return Count(ms, [](const pb::WorkerMessage& m) { return m.has_heartbeat(); });
}

TEST(SessionTest, RegistersWithTheTokenThenHeartbeats) {
  FakeDaemon daemon(/*heartbeat_ms=*/50);
  FakeDaemonServer server(&daemon);
  FakeDelegate delegate;
  Session session(Options(server.address()), &delegate);
  session.Start();
  ASSERT_TRUE(daemon.WaitFor([](const Messages& ms) { return Heartbeats(ms) >= 3; }));
  const Messages ms = daemon.messages();
  ASSERT_TRUE(ms[0].has_register_());
  EXPECT_EQ(ms[0].register_().worker_id(), "w1");
  EXPECT_EQ(ms[1].heartbeat().slot_end_ms(), 42);
  EXPECT_EQ(daemon.authorization(), "Bearer secret");
  EXPECT_TRUE(session.registered());
  EXPECT_EQ(session.lease_ms(), 500);
  EXPECT_TRUE(session.Shutdown(std::chrono::seconds(2)));
}

TEST(SessionTest, ReportsQueuedBeforeConnectingArriveInOrderAfterRegister) {
  FakeDaemon daemon;
  FakeDaemonServer server(&daemon);
  FakeDelegate delegate;
  Session session(Options(server.address()), &delegate);
  for (int i = 0; i < 5; ++i) session.Send(Log("j1", 1, "line " + std::to_string(i) + "\n"));
  session.Start();
  ASSERT_TRUE(daemon.WaitFor([](const Messages& ms) {
    return Count(ms, [](const pb::WorkerMessage& m) { return m.has_log(); }) == 5;
  }));
  const Messages ms = daemon.messages();
  ASSERT_TRUE(ms[0].has_register_());
  int next = 0;
  for (const auto& m : ms) {
    if (m.has_log()) {
      EXPECT_EQ(m.log().text(), "line " + std::to_string(next++) + "\n");
    }
  }
  session.Shutdown(std::chrono::seconds(2));
}

TEST(SessionTest, CommandsReachTheDelegate) {
  FakeDaemon daemon(/*heartbeat_ms=*/20);
  FakeDaemonServer server(&daemon);
  FakeDelegate delegate;
  Session session(Options(server.address()), &delegate);
  session.Start();
  pb::DaemonCommand start;
  start.mutable_start()->set_job_id("j-7");
  start.mutable_start()->set_epoch(3);
  daemon.Push(start);
  std::unique_lock<std::mutex> lock(delegate.mu);
  ASSERT_TRUE(
      delegate.cv.wait_for(lock, std::chrono::seconds(10), [&] { return !delegate.commands.empty(); }));
  EXPECT_EQ(delegate.commands[0].start().job_id(), "j-7");
  EXPECT_EQ(delegate.commands[0].start().epoch(), 3);
  lock.unlock();
  session.Shutdown(std::chrono::seconds(1));
}

TEST(SessionTest, ReconnectsAfterABrokenStreamAndResendsRecentExits) {
  FakeDaemon daemon(/*heartbeat_ms=*/20);
  FakeDaemonServer server(&daemon);
  FakeDelegate delegate;
  Session session(Options(server.address()), &delegate);
  session.Start();
  session.Send(Exited("j1", 4));
  session.Send(Log("j1", 4, "bye\n"));
  ASSERT_TRUE(daemon.WaitFor([](const Messages& ms) {
    return Count(ms, [](const pb::WorkerMessage& m) { return m.has_log(); }) == 1;
  }));
  daemon.BreakNextStream();
  ASSERT_TRUE(daemon.WaitFor([](const Messages& ms) {
    return Count(ms, [](const pb::WorkerMessage& m) { return m.has_register_(); }) == 2 && Heartbeats(ms) > 0;
  }));
  session.Shutdown(std::chrono::seconds(2));
  const Messages ms = daemon.messages();
  // The exit may have been lost with the stream, so it is written again; the log is not.
  EXPECT_EQ(Count(ms, [](const pb::WorkerMessage& m) { return m.has_exited(); }), 2);
  EXPECT_EQ(Count(ms, [](const pb::WorkerMessage& m) { return m.has_log(); }), 1);
  EXPECT_EQ(session.registrations(), 2);
}

TEST(SessionTest, WaitsForADaemonThatStartsLater) {
  FakeDaemon daemon;
  int port = 0;
  {
    FakeDaemonServer probe(&daemon);  // find a free port, then free it
    port = probe.port();
  }
  FakeDelegate delegate;
  Session session(Options("127.0.0.1:" + std::to_string(port)), &delegate);
  session.Start();
  session.Send(Exited("j2", 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // a few failed attempts
  EXPECT_FALSE(session.registered());
  FakeDaemon later;
  FakeDaemonServer server(&later, port);
  ASSERT_EQ(server.port(), port);
  ASSERT_TRUE(later.WaitFor([](const Messages& ms) {
    return Count(ms, [](const pb::WorkerMessage& m) { return m.has_exited(); }) == 1;
  }));
  EXPECT_TRUE(later.messages()[0].has_register_());
  session.Shutdown(std::chrono::seconds(2));
}

TEST(SessionTest, DroppedAttemptReportsAreNotSent) {
  FakeDaemon daemon;
  FakeDaemonServer server(&daemon);
  FakeDelegate delegate;
  Session session(Options(server.address()), &delegate);
  session.Send(Log("j1", 1, "old epoch\n"));
  session.Send(Exited("j1", 1));
  session.Send(Log("j1", 2, "new epoch\n"));
  session.DropQueued("j1", 1);
  session.Start();
  ASSERT_TRUE(session.Shutdown(std::chrono::seconds(10)));
  const Messages ms = daemon.messages();
  EXPECT_EQ(Count(ms, [](const pb::WorkerMessage& m) { return m.has_log(); }), 1);
  EXPECT_EQ(Count(ms, [](const pb::WorkerMessage& m) { return m.has_exited(); }), 0);
}

TEST(SessionTest, ShutdownFlushesThenHalfCloses) {
  FakeDaemon daemon(/*heartbeat_ms=*/1000);
  FakeDaemonServer server(&daemon);
  FakeDelegate delegate;
  Session session(Options(server.address()), &delegate);
  session.Start();
  for (int i = 0; i < 100; ++i) session.Send(Log("j1", 1, "x\n"));
  EXPECT_TRUE(session.Shutdown(std::chrono::seconds(10)));
  EXPECT_EQ(Count(daemon.messages(), [](const pb::WorkerMessage& m) { return m.has_log(); }), 100);
  for (int i = 0; i < 100 && daemon.half_closed() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(daemon.half_closed(), 1);  // the daemon saw the end of the stream, not a cancellation
}

TEST(SessionTest, ShutdownWithoutADaemonGivesUp) {
  FakeDelegate delegate;
  Session session(Options("127.0.0.1:1"), &delegate);
  session.Start();
  session.Send(Exited("j", 1));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(session.Shutdown(std::chrono::milliseconds(300)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A registration the daemon refused (another ft-worker holds this --id) would be refused again at
// once: the session backs off from refused_backoff_initial, doubling, instead of retrying every
// 100 ms; once the daemon accepts it again it registers.
TEST(SessionTest, ARefusedRegistrationBacksOffLongerEachTimeThenRegistersOnceAccepted) {
  FakeDaemon daemon;
  daemon.RefuseRegistrations(
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "worker id 'w1' is held by another ft-worker"));
  FakeDaemonServer server(&daemon);
  FakeDelegate delegate;
  SessionOptions o = Options(server.address());
  o.backoff_initial = std::chrono::milliseconds(10);  // what a broken stream would wait
  o.backoff_max = std::chrono::milliseconds(20);
  o.refused_backoff_initial = std::chrono::milliseconds(200);
  o.refused_backoff_max = std::chrono::milliseconds(400);
  Session session(o, &delegate);
  const auto start = std::chrono::steady_clock::now();
  session.Start();
  ASSERT_TRUE(daemon.WaitFor([](const Messages& ms) {
    return Count(ms, [](const pb::WorkerMessage& m) { return m.has_register_(); }) >= 3;
  }));
  // Two waits before the third try: at least half of 200 ms, then half of 400 ms (jitter).
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_FALSE(session.registered());
  daemon.RefuseRegistrations(grpc::Status::OK);
  for (int i = 0; i < 500 && !session.registered(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(session.registered());
}

}  // namespace
}  // namespace ft::worker
