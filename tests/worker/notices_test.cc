// Preemption notices against a fake metadata server on 127.0.0.1, the HTTP
// client's failure modes, and the slot-end arithmetic.
#include "worker/notices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/worker/fake_http_server.h"
#include "worker/http_get.h"
#include "worker/slot_end.h"

namespace ft::worker {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using testing_util::FakeHttpServer;
using Request = FakeHttpServer::Request;
using ::testing::HasSubstr;

constexpr auto kTimeout = std::chrono::milliseconds(1000);

std::string Header(const Request& r, const char* name) { return std::string(r[name]); }

TEST(AwsNoticeTest, NotFoundMeansNoNoticeThenOkIsANotice) {
  FakeHttpServer server([](const Request& r) -> std::pair<int, std::string> {
    EXPECT_EQ(r.target(), "/latest/meta-data/spot/instance-action");
    return {404, "Not Found"};
  });
  AwsNoticeChecker aws(server.url(), kTimeout);
  auto none = aws.Check();
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());

  server.set_handler([](const Request&) -> std::pair<int, std::string> {
    return {200, R"({"action": "terminate", "time": "2099-01-01T00:00:00Z"})"};
  });
  auto notice = aws.Check();
  ASSERT_TRUE(notice.ok()) << notice.status().ToString();
  ASSERT_TRUE(notice->has_value());
  EXPECT_EQ((*notice)->reason, "AWS spot interruption");
  EXPECT_GT((*notice)->deadline_s, 1000.0);  // far in the future
}

TEST(AwsNoticeTest, FetchesAnImdsV2TokenWhenAsked) {
  FakeHttpServer server([](const Request& r) -> std::pair<int, std::string> {
    if (r.method() == http::verb::put && r.target() == "/latest/api/token") {
      EXPECT_EQ(Header(r, "X-aws-ec2-metadata-token-ttl-seconds"), "21600");
      return {200, "tok-1"};
    }
    if (Header(r, "X-aws-ec2-metadata-token") != "tok-1") return {401, ""};
    return {200, R"({"action": "stop", "time": "bad time"})"};
  });
  AwsNoticeChecker aws(server.url(), kTimeout);
  auto notice = aws.Check();
  ASSERT_TRUE(notice.ok()) << notice.status().ToString();
  ASSERT_TRUE(notice->has_value());
  EXPECT_EQ((*notice)->deadline_s, 0);  // unknown: the worker uses its stop grace
}

TEST(AwsNoticeTest, UnexpectedStatusIsUnavailable) {
  FakeHttpServer server([](const Request&) -> std::pair<int, std::string> { return {500, "oops"}; });
  AwsNoticeChecker aws(server.url(), kTimeout);
  auto r = aws.Check();
  EXPECT_EQ(r.status().code(), Status::Code::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("500"));
}

TEST(GcpNoticeTest, SendsTheMetadataFlavorHeaderAndReadsTrue) {
  std::string body = "FALSE";
  FakeHttpServer server([&](const Request& r) -> std::pair<int, std::string> {
    if (Header(r, "Metadata-Flavor") != "Google") return {403, "missing Metadata-Flavor"};
    EXPECT_EQ(r.target(), "/computeMetadata/v1/instance/preempted");
    return {200, body};
  });
  auto none = CheckGcpNotice(server.url(), kTimeout);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());
  body = "TRUE";
  auto notice = CheckGcpNotice(server.url() + "/", kTimeout);
  ASSERT_TRUE(notice.ok()) << notice.status().ToString();
  ASSERT_TRUE(notice->has_value());
  EXPECT_EQ((*notice)->reason, "GCP preemption");
}

TEST(HttpFetchTest, UnreachableEndpointIsUnavailableQuickly) {
  // A port nobody listens on: bind one, close it, use its number.
  asio::io_context io;
  tcp::acceptor a(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const int port = a.local_endpoint().port();
  a.close();
  const auto start = std::chrono::steady_clock::now();
  auto r = HttpFetch({"GET", "http://127.0.0.1:" + std::to_string(port) + "/x", {}, kTimeout});
  EXPECT_EQ(r.status().code(), Status::Code::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_TRUE(HttpFetch({"GET", "https://example.com/", {}, kTimeout}).status().IsInvalidArgument());
}

TEST(HttpFetchTest, SilentServerTimesOut) {
  asio::io_context io;
  tcp::acceptor silent(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));  // listens, never answers
  const auto start = std::chrono::steady_clock::now();
  auto r = HttpFetch({"GET",
                      "http://127.0.0.1:" + std::to_string(silent.local_endpoint().port()) + "/",
                      {},
                      std::chrono::milliseconds(300)});
  EXPECT_EQ(r.status().code(), Status::Code::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(NoticePollerTest, ReportsTheFirstNoticeOnce) {
  std::atomic<int> polls{0};
  FakeHttpServer server([&](const Request&) -> std::pair<int, std::string> {
    return ++polls < 3 ? std::pair<int, std::string>{404, ""} : std::pair<int, std::string>{200, "{}"};
  });
  AwsNoticeChecker aws(server.url(), kTimeout);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Notice> notices;
  NoticePoller poller(
      "AWS", [&] { return aws.Check(); }, std::chrono::milliseconds(20),
      [&](const Notice& n) {
        std::lock_guard<std::mutex> lock(mu);
        notices.push_back(n);
        cv.notify_all();
      });
  poller.Start();
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return !notices.empty(); }));
  lock.unlock();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  poller.Stop();
  EXPECT_EQ(notices.size(), 1u);
  EXPECT_EQ(polls.load(), 3);  // it stopped polling after the notice
}

TEST(NoticePollerTest, KeepsPollingAnUnreachableEndpointAndStops) {
  std::atomic<int> checks{0};
  NoticePoller poller(
      "GCP",
      [&]() -> StatusOr<std::optional<Notice>> {
        ++checks;
        return Status::Unavailable("no metadata server");
      },
      std::chrono::milliseconds(10), [](const Notice&) { ADD_FAILURE() << "no notice expected"; });
  poller.Start();
  while (checks < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  poller.Stop();
}

TEST(AwsDeadlineTest, SecondsUntilTheActionTime) {
  const int64_t now_ms = 1'767'225'600'000;  // 2026-01-01T00:00:00Z
  EXPECT_DOUBLE_EQ(AwsDeadlineSeconds("2026-01-01T00:02:00Z", now_ms), 120.0);
  EXPECT_DOUBLE_EQ(AwsDeadlineSeconds("2025-12-31T23:00:00Z", now_ms), 1.0);  // past: at least 1 s
  EXPECT_DOUBLE_EQ(AwsDeadlineSeconds("", now_ms), 0.0);
}

TEST(SlotEndTest, ParsesAbsoluteAndRelativeTimes) {
  const int64_t now = 1'000'000;
  EXPECT_EQ(*ParseSlotEnd("1767225600", now), 1'767'225'600'000);
  EXPECT_EQ(*ParseSlotEnd("+20s", now), now + 20'000);
  EXPECT_EQ(*ParseSlotEnd("+20", now), now + 20'000);
  EXPECT_EQ(*ParseSlotEnd("+5m", now), now + 300'000);
  EXPECT_EQ(*ParseSlotEnd("+2h", now), now + 7'200'000);
  for (const char* bad : {"", "+", "+5d", "soon", "-5", "12x", "0"}) {
    EXPECT_TRUE(ParseSlotEnd(bad, now).status().IsInvalidArgument()) << bad;
  }
}

TEST(SlotEndTest, SlurmEnvironment) {
  EXPECT_EQ(*SlotEndFromSlurm(nullptr), 0);
  EXPECT_EQ(*SlotEndFromSlurm(""), 0);
  EXPECT_EQ(*SlotEndFromSlurm("1767225600"), 1'767'225'600'000);
  EXPECT_TRUE(SlotEndFromSlurm("Unknown").status().IsInvalidArgument());
  EXPECT_EQ(EarlierSlotEnd(0, 5), 5);
  EXPECT_EQ(EarlierSlotEnd(7, 0), 7);
  EXPECT_EQ(EarlierSlotEnd(7, 5), 5);
}

TEST(SlotEndTest, StopPointUsesTheMeasuredCheckpointTime) {
  EXPECT_EQ(SlotEndMarginMs(0), 10'000);    // before any measurement
  EXPECT_EQ(SlotEndMarginMs(4.0), 11'000);  // 1.5 × 4 s + 5 s
  EXPECT_EQ(SlotEndMarginMs(0.2), 5'300);
  const int64_t end = 100'000;
  EXPECT_FALSE(SlotEndReached(89'999, end, 0));
  EXPECT_TRUE(SlotEndReached(90'000, end, 0));
  EXPECT_FALSE(SlotEndReached(88'999, end, 4.0));
  EXPECT_TRUE(SlotEndReached(89'000, end, 4.0));
  EXPECT_FALSE(SlotEndReached(99'999'999, 0, 0));  // no known end
}

}  // namespace
}  // namespace ft::worker
