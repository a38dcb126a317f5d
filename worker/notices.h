// Preemption notices from the cloud: the node is about to be taken away, so
// running trainers must checkpoint and stop.
//
//   AWS  GET <base>/latest/meta-data/spot/instance-action: 404 = none; 200 =
//        {"action": "terminate"|"stop"|"hibernate", "time": "2026-01-02T03:04:05Z"}.
//        IMDSv2: on 401 a session token is fetched (PUT <base>/latest/api/token)
//        and sent as X-aws-ec2-metadata-token from then on.
//   GCP  GET <base>/computeMetadata/v1/instance/preempted with
//        "Metadata-Flavor: Google": body "TRUE" = preempted, "FALSE" = not.
//
// A NoticePoller checks one source every interval on its own thread and
// reports the first notice once. An unreachable endpoint never fails the
// worker: it is logged once (and again when it recovers).
//
// Thread safety: the checkers are thread-compatible objects; NoticePoller's
// methods are for one owning thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/status.h"

namespace ft::worker {

struct Notice {
  std::string reason;     // "AWS spot interruption" | "GCP preemption"
  double deadline_s = 0;  // time left to stop; 0 = unknown (use the stop grace)
};

// OK(nullopt): no notice. Unavailable: the endpoint could not be asked or
// answered something unexpected.
using NoticeCheck = std::function<StatusOr<std::optional<Notice>>()>;

class AwsNoticeChecker {
 public:
  AwsNoticeChecker(std::string base_url, std::chrono::milliseconds timeout)
      : base_url_(std::move(base_url)), timeout_(timeout) {}
  StatusOr<std::optional<Notice>> Check();

 private:
  StatusOr<std::string> FetchToken();

  std::string base_url_;
  std::chrono::milliseconds timeout_;
  std::string token_;  // IMDSv2 session token, once one was needed
};

StatusOr<std::optional<Notice>> CheckGcpNotice(const std::string& base_url,
                                               std::chrono::milliseconds timeout);

// Seconds from now_ms until an AWS notice's "time" ("YYYY-MM-DDTHH:MM:SSZ");
// 0 when it is missing or unparsable, at least 1 otherwise.
double AwsDeadlineSeconds(const std::string& time_text, int64_t now_ms);

class NoticePoller {
 public:
  // `name` labels log lines ("AWS", "GCP"); on_notice runs on the poller's thread.
  NoticePoller(std::string name, NoticeCheck check, std::chrono::milliseconds interval,
               std::function<void(const Notice&)> on_notice);
  ~NoticePoller();  // Stop()

  void Start();
  void Stop();

 private:
  void Loop();

  std::string name_;
  NoticeCheck check_;
  std::chrono::milliseconds interval_;
  std::function<void(const Notice&)> on_notice_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace ft::worker
