// Webhooks: what ftd posts to a person's endpoint when a job needs them (issue #44, point 5).
//
// A webhook is a URL (http:// or https://), the kinds of event it subscribes to, a scope and a
// secret. Kinds (WebhookKindTable): succeeded, failed, preempted, cancelled and stalled, each
// fired by ftd's job event of that name ("preempted" is an attempt that ended preempted for any
// cause, the scheduler's checkpoint-stops included: its `preempting` request is not a second
// notification). Scope: a team's webhook fires for that team's jobs, a user's for the jobs that
// user submitted, one with neither for every job.
//
// Delivery (daemon/webhook_sender.h) is at least once: each delivery has an id that is unique
// per (webhook, event) and the same across retries and ftd restarts ("wh-1a2b3c4d.1234": the
// webhook's id and the event's seq), sent in the body and the X-Ftune-Event-Id header, so a
// receiver drops what it has seen. X-Ftune-Signature is "sha256=" + the hex HMAC-SHA256 of the
// raw body under the webhook's secret (GitHub's convention).
//
// The body (WebhookBody) is one JSON object: id, kind, job_id, job_name, team, user, state,
// message, time_ms, time (UTC, ISO 8601), step, dashboard (the job's page, when ftd knows its
// public address) and text (one readable line: a Slack- or Mattermost-compatible incoming webhook
// shows it).
//
// Everything here but WebhookCounters (atomics) is a pure function of its arguments; thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "daemon/store.h"

namespace ft {

// A kind a webhook may subscribe to, and the job event that fires it.
struct WebhookKind {
  const char* name;   // as in `--events` and the body's "kind"
  const char* event;  // ftd's event kind (EventRow::kind)
  const char* meaning;
};
const std::vector<WebhookKind>& WebhookKindTable();

// The subscribed kinds of a comma-separated list ("succeeded,failed"), in table order, each once.
// InvalidArgument naming the unknown kind and the known ones, or an empty list.
StatusOr<std::vector<std::string>> ParseWebhookKinds(const std::string& list);

// Where a webhook posts: scheme, host, port (the scheme's default when absent) and target.
struct WebhookUrl {
  bool https = false;
  std::string host;
  std::string port;
  std::string target;  // path and query, "/" when absent
};
// InvalidArgument naming the URL and the fix for anything but http(s)://HOST[:PORT][/PATH]
// without user information, fragments, spaces or control characters.
StatusOr<WebhookUrl> ParseWebhookUrl(const std::string& url);

// A webhook's scope and filter: whether `event` (of job `job`) is one of its deliveries.
bool WebhookMatches(const WebhookRow& hook, const EventRow& event, const JobRow& job);

// The delivery id of `event_seq` for `webhook_id` (see above).
std::string WebhookDeliveryId(const std::string& webhook_id, int64_t event_seq);

// The JSON body of `event` (of `job`) for `hook`; `dashboard_url`: ftd's dashboard as people
// reach it ("" = unknown: no link).
std::string WebhookBody(const WebhookRow& hook, const EventRow& event, const JobRow& job,
                        const std::string& dashboard_url);

// What /metrics counts of the deliveries since ftd started (ftune_webhook_deliveries_total{result}).
struct WebhookCounters {
  std::atomic<int64_t> delivered{0};  // answered 2xx
  std::atomic<int64_t> failed{0};     // attempts that did not deliver (each one retried or given up)
  std::atomic<int64_t> given_up{0};   // deliveries dropped after the last attempt
};

// The X-Ftune-Signature header's value for `body` under `secret`: "sha256=<64 hex>".
std::string WebhookSignature(const std::string& secret, const std::string& body);

}  // namespace ft
