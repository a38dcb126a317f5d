// Daemon: the webhooks admins manage (daemon/webhooks.h). Each change is an event naming who made
// it; events show a webhook's scheme and host only, since a receiver's URL may hold its own
// secret (a Slack incoming webhook's path does).
#include "common/secret.h"
#include "daemon/authorization.h"
#include "daemon/daemon.h"

namespace ft {

namespace {

constexpr size_t kMinSecret = 16;

// "https://hooks.example.com" of a webhook's URL, for events and logs.
std::string UrlOrigin(const WebhookUrl& u) {
  const std::string host = u.host.find(':') != std::string::npos ? "[" + u.host + "]" : u.host;
  return (u.https ? "https://" : "http://") + host + ":" + u.port;
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

// The checked and normalised webhook `hook` (events in table order, a secret made when none is given).
StatusOr<WebhookRow> CheckedWebhook(WebhookRow hook) {
  FT_RETURN_IF_ERROR(ParseWebhookUrl(hook.url).status());
  FT_ASSIGN_OR_RETURN(std::vector<std::string> kinds, ParseWebhookKinds(hook.events));
  hook.events = Join(kinds);
  if (!hook.team.empty()) FT_RETURN_IF_ERROR(CheckIdentityName(hook.team, "--team"));
  if (!hook.user.empty()) FT_RETURN_IF_ERROR(CheckIdentityName(hook.user, "--user"));
  if (!hook.team.empty() && !hook.user.empty()) {
    return Status::InvalidArgument(
        "a webhook has one scope: --team T (that team's jobs) or --user U (the jobs U submits), not both");
  }
  if (hook.secret.empty()) {
    FT_ASSIGN_OR_RETURN(hook.secret, RandomHex(32));
  } else if (hook.secret.size() < kMinSecret || hook.secret.size() > 256) {
    return Status::InvalidArgument("--secret: use 16 to 256 characters (or leave it out: ftd makes one)");
  }
  return hook;
}

std::string ScopeText(const WebhookRow& h) {
  if (!h.team.empty()) return "team " + h.team + "'s jobs";
  if (!h.user.empty()) return "the jobs " + h.user + " submits";
  return "every job";
}

}  // namespace

StatusOr<WebhookRow> Daemon::AddWebhook(const Actor& by, WebhookRow hook) {
  FT_ASSIGN_OR_RETURN(hook, CheckedWebhook(std::move(hook)));
  hook.created_by = by.user;
  hook.created_ms = clock_->WallMs();
  StatusOr<WebhookRow> added = Status::Internal("no webhook id was free");
  for (int tries = 0; tries < 4 && !added.ok() && !added.status().IsIOError(); ++tries) {
    FT_ASSIGN_OR_RETURN(std::string tag, RandomHex(4));
    hook.id = "wh-" + tag;
    added = store_->AddWebhook(hook);
  }
  FT_RETURN_IF_ERROR(added.status());
  RecordEvent("", "webhook_added",
              "webhook " + hook.id + " (" + UrlOrigin(*ParseWebhookUrl(hook.url)) + ") added" + by.By() +
                  ": " + hook.events + " of " + ScopeText(hook),
              0);
  return added;
}

Status Daemon::RemoveWebhook(const Actor& by, const std::string& id) {
  FT_RETURN_IF_ERROR(store_->RemoveWebhook(id));
  RecordEvent("", "webhook_removed",
              "webhook " + id + " removed" + by.By() + "; its pending deliveries are dropped", 0);
  return Status::OK();
}

StatusOr<std::vector<WebhookRow>> Daemon::ListWebhooks(std::map<std::string, int64_t>* pending) {
  FT_ASSIGN_OR_RETURN(std::vector<WebhookRow> hooks, store_->ListWebhooks());
  for (WebhookRow& h : hooks) h.secret.clear();
  if (pending != nullptr) {
    FT_ASSIGN_OR_RETURN(*pending, store_->PendingWebhookDeliveries());
  }
  return hooks;
}

void Daemon::RecordEvent(const std::string& job_id, const std::string& kind, const std::string& message,
                         int64_t step) {
  Held lock(this);
  Event(job_id, "", kind, message, step);
  ReleaseAndPublish(lock);
}

}  // namespace ft
