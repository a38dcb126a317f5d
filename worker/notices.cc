#include "worker/notices.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/logging.h"
#include "worker/http_get.h"

namespace ft::worker {

namespace {

constexpr char kAwsPath[] = "/latest/meta-data/spot/instance-action";
constexpr char kAwsTokenPath[] = "/latest/api/token";
constexpr char kGcpPath[] = "/computeMetadata/v1/instance/preempted";

std::string Join(std::string base, const char* path) {
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + path;
}

Status Unexpected(const std::string& url, const HttpResponse& r) {
  return Status::Unavailable(url + ": unexpected HTTP " + std::to_string(r.status));
}

}  // namespace

double AwsDeadlineSeconds(const std::string& time_text, int64_t now_ms) {
  std::tm tm{};
  if (strptime(time_text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return 0;
  const double left = static_cast<double>(timegm(&tm)) - static_cast<double>(now_ms) / 1000.0;
  return std::max(1.0, left);
}

StatusOr<std::string> AwsNoticeChecker::FetchToken() {
  HttpRequest put{
      "PUT", Join(base_url_, kAwsTokenPath), {{"X-aws-ec2-metadata-token-ttl-seconds", "21600"}}, timeout_};
  FT_ASSIGN_OR_RETURN(HttpResponse r, HttpFetch(put));
  if (r.status != 200) return Unexpected(put.url, r);
  return r.body;
}

StatusOr<std::optional<Notice>> AwsNoticeChecker::Check() {
  HttpRequest get{"GET", Join(base_url_, kAwsPath), {}, timeout_};
  if (!token_.empty()) get.headers.push_back({"X-aws-ec2-metadata-token", token_});
  FT_ASSIGN_OR_RETURN(HttpResponse r, HttpFetch(get));
  if (r.status == 401) {  // IMDSv2 required (or the token expired)
    FT_ASSIGN_OR_RETURN(token_, FetchToken());
    get.headers = {{"X-aws-ec2-metadata-token", token_}};
    FT_ASSIGN_OR_RETURN(r, HttpFetch(get));
  }
  if (r.status == 404) return std::optional<Notice>();
  if (r.status != 200) return Unexpected(get.url, r);
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  Notice n{"AWS spot interruption", 0};
  if (j.is_object() && j.contains("time") && j["time"].is_string()) {
    n.deadline_s = AwsDeadlineSeconds(j["time"].get<std::string>(), WallNowMs());
  }
  return std::optional<Notice>(n);
}

StatusOr<std::optional<Notice>> CheckGcpNotice(const std::string& base_url,
                                               std::chrono::milliseconds timeout) {
  HttpRequest get{"GET", Join(base_url, kGcpPath), {{"Metadata-Flavor", "Google"}}, timeout};
  FT_ASSIGN_OR_RETURN(HttpResponse r, HttpFetch(get));
  if (r.status != 200) return Unexpected(get.url, r);
  std::string body = r.body;
  while (!body.empty() && std::isspace(static_cast<unsigned char>(body.back()))) body.pop_back();
  if (body == "TRUE") return std::optional<Notice>(Notice{"GCP preemption", 0});
  return std::optional<Notice>();
}

NoticePoller::NoticePoller(std::string name, NoticeCheck check, std::chrono::milliseconds interval,
                           std::function<void(const Notice&)> on_notice)
    : name_(std::move(name)),
      check_(std::move(check)),
      interval_(interval),
      on_notice_(std::move(on_notice)) {}

NoticePoller::~NoticePoller() { Stop(); }

void NoticePoller::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void NoticePoller::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NoticePoller::Loop() {
  bool reachable = true;  // logs the first failure and the recovery, not every poll
  while (true) {
    auto notice = check_();
    if (!notice.ok() && reachable) {
      FT_LOG(WARN) << name_
                   << " preemption notices unavailable (will keep trying): " << notice.status().ToString();
    }
    if (notice.ok() && !reachable) FT_LOG(INFO) << name_ << " preemption notices reachable again";
    reachable = notice.ok();
    if (notice.ok() && notice->has_value()) {
      FT_LOG(WARN) << name_ << " preemption notice: " << (*notice)->reason;
      on_notice_(**notice);
      return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, interval_, [this] { return stop_; })) return;
  }
}

}  // namespace ft::worker
