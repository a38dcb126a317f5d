#include "daemon/webhooks.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/secret.h"
#include "common/split.h"
#include "proto/names.h"

namespace ft {

const std::vector<WebhookKind>& WebhookKindTable() {
  static const std::vector<WebhookKind> kinds = {
      {"succeeded", "succeeded", "the job finished all its steps"},
      {"failed", "failed", "the job failed for good (its failures past max_failures, or bad input)"},
      {"preempted", "preempted",
       "an attempt ended preempted (node lost, slot end, notice, or the scheduler's checkpoint-stop); "
       "the job resumes from its checkpoint"},
      {"cancelled", "cancelled", "someone cancelled the job"},
      {"stalled", "stalled",
       "a running job committed no step for N times its step interval (ftd --stall-factor)"},
  };
  return kinds;
}

namespace {

std::string KnownKinds() {
  std::string out;
  for (const WebhookKind& k : WebhookKindTable()) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

// Whether `list` (comma-separated) holds `name`.
bool ListHas(const std::string& list, const std::string& name) {
  const std::vector<std::string> names = SplitOn(list, ',');
  return std::find(names.begin(), names.end(), name) != names.end();
}

// "2026-12-04T15:49:46.123Z"
std::string IsoTime(int64_t ms) {
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[40];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03dZ", text, static_cast<int>(ms % 1000));
  return out;
}

bool BadUrlCharacter(char c) {
  return std::iscntrl(static_cast<unsigned char>(c)) || c == ' ' || c == '#' || c == '\\';
}

}  // namespace

StatusOr<std::vector<std::string>> ParseWebhookKinds(const std::string& list) {
  const auto& table = WebhookKindTable();
  for (const std::string& name : list.empty() ? std::vector<std::string>{""} : SplitOn(list, ',')) {
    if (std::none_of(table.begin(), table.end(), [&](const WebhookKind& k) { return name == k.name; })) {
      return Status::InvalidArgument("--events: unknown kind '" + name.substr(0, 64) + "': use " +
                                     KnownKinds() + ", comma-separated");
    }
  }
  std::vector<std::string> out;
  for (const WebhookKind& k : WebhookKindTable())
    if (ListHas(list, k.name)) out.push_back(k.name);
  return out;
}

StatusOr<WebhookUrl> ParseWebhookUrl(const std::string& url) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("webhook URL '" + url.substr(0, 200) + "': " + why +
                                   " (use http://HOST[:PORT]/PATH or https://HOST[:PORT]/PATH)");
  };
  if (url.size() > 2048) return bad("longer than 2048 characters");
  if (std::any_of(url.begin(), url.end(), BadUrlCharacter))
    return bad("has a space, '#', '\\' or control character");
  WebhookUrl out;
  std::string rest;
  if (url.rfind("https://", 0) == 0) {
    out.https = true;
    rest = url.substr(8);
  } else if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else {
    return bad("the scheme must be http:// or https://");
  }
  const size_t slash = rest.find_first_of("/?");
  std::string authority = rest.substr(0, slash);
  out.target = slash == std::string::npos ? "/" : rest.substr(slash);
  if (out.target[0] == '?') out.target = "/" + out.target;
  if (authority.find('@') != std::string::npos) return bad("user information in the URL is not supported");
  if (!authority.empty() && authority[0] == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) return bad("an unclosed '[' in the host");
    out.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return bad("text after the IPv6 address");
      out.port = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.find(':');
    out.host = authority.substr(0, colon);
    if (colon != std::string::npos) out.port = authority.substr(colon + 1);
  }
  if (out.host.empty()) return bad("no host");
  if (out.port.empty()) out.port = out.https ? "443" : "80";
  const bool digits = std::all_of(out.port.begin(), out.port.end(), [](char c) { return std::isdigit(c); });
  if (!digits || out.port.size() > 5 || std::stoi(out.port) < 1 || std::stoi(out.port) > 65535) {
    return bad("port '" + out.port.substr(0, 16) + "' is not 1-65535");
  }
  return out;
}

bool WebhookMatches(const WebhookRow& hook, const EventRow& event, const JobRow& job) {
  if (event.job_id.empty() || event.job_id != job.id) return false;
  if (!hook.team.empty() && job.team != hook.team) return false;
  if (!hook.user.empty() && job.submitted_by != hook.user) return false;
  for (const WebhookKind& k : WebhookKindTable())
    if (event.kind == k.event && ListHas(hook.events, k.name)) return true;
  return false;
}

std::string WebhookDeliveryId(const std::string& webhook_id, int64_t event_seq) {
  return webhook_id + "." + std::to_string(event_seq);
}

std::string WebhookBody(const WebhookRow& hook, const EventRow& event, const JobRow& job,
                        const std::string& dashboard_url) {
  std::string kind = event.kind;
  for (const WebhookKind& k : WebhookKindTable())
    if (event.kind == k.event) kind = k.name;
  const std::string state = JobStateName(static_cast<ftune::v1::JobState>(job.state));
  std::string link;
  if (!dashboard_url.empty()) {
    link = dashboard_url + (dashboard_url.back() == '/' ? "" : "/") + "#/jobs/" + job.id;
  }
  std::string text = "ftune: job " + job.id + " (" + job.name + ") " + kind + ": " + event.message;
  if (!job.team.empty() || !job.submitted_by.empty()) {
    text += " [team " + (job.team.empty() ? std::string("-") : job.team) + ", user " +
            (job.submitted_by.empty() ? std::string("-") : job.submitted_by) + "]";
  }
  if (!link.empty()) text += " " + link;
  nlohmann::json body = {{"id", WebhookDeliveryId(hook.id, event.seq)},
                         {"webhook_id", hook.id},
                         {"kind", kind},
                         {"job_id", job.id},
                         {"job_name", job.name},
                         {"team", job.team},
                         {"user", job.submitted_by},
                         {"state", state},
                         {"message", event.message},
                         {"time_ms", event.time_ms},
                         {"time", IsoTime(event.time_ms)},
                         {"step", event.step},
                         {"text", text}};
  if (!link.empty()) body["dashboard"] = link;
  // Invalid UTF-8 (a job name is the user's text) is replaced, never a throw.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string WebhookSignature(const std::string& secret, const std::string& body) {
  return "sha256=" + HmacSha256Hex(secret, body);
}

}  // namespace ft
