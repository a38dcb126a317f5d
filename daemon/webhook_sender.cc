#include "daemon/webhook_sender.h"

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "daemon/http_post.h"
#include "daemon/webhooks.h"

namespace ft {

namespace asio = boost::asio;

namespace {

// Events read from the outbox per store query.
constexpr int64_t kScanBatch = 500;

std::string JobIdOf(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("job_id") && j["job_id"].is_string() ? j["job_id"].get<std::string>()
                                                                          : "";
}

}  // namespace

// The sender's state, touched only on the io thread.
struct WebhookSender::Impl {
  WebhookSender* sender;
  asio::steady_timer timer;
  std::set<std::string> in_flight;  // webhook ids with a request in flight
  std::string last_error;           // the last store error logged (logged once, not per poll)

  Impl(WebhookSender* s, asio::io_context& io) : sender(s), timer(io) {}

  void Poll() {
    bool more = true;
    for (int batches = 0; more && batches < 20; ++batches) more = Scan();
    Dispatch();
    timer.expires_after(std::chrono::milliseconds(sender->options_.poll_ms));
    timer.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) Poll();
    });
  }

  void StoreFailed(const Status& s) {
    if (s.ToString() == last_error) return;
    last_error = s.ToString();
    FT_LOG(WARN) << "webhooks: " << last_error << " (retried every poll)";
  }

  // Queues the deliveries of the next events; true when more events may be waiting.
  bool Scan() {
    Store& store = *sender->store_;
    auto hooks = store.ListWebhooks();
    if (!hooks.ok()) {
      StoreFailed(hooks.status());
      return false;
    }
    if (hooks->empty()) return false;
    int64_t from = hooks->front().cursor;
    for (const WebhookRow& h : *hooks) from = std::min(from, h.cursor);
    auto events = store.ListEvents("", from, kScanBatch);
    if (!events.ok()) {
      StoreFailed(events.status());
      return false;
    }
    if (events->empty()) return false;
    std::vector<WebhookDeliveryRow> rows;
    std::map<std::string, JobRow> jobs;  // read once per batch
    const int64_t now = sender->clock_->WallMs();
    for (const EventRow& e : *events) {
      if (e.job_id.empty()) continue;
      auto job = jobs.find(e.job_id);
      if (job == jobs.end()) {
        auto row = store.GetJob(e.job_id);
        if (!row.ok()) continue;  // a job the store no longer has: no delivery
        job = jobs.emplace(e.job_id, *row).first;
      }
      for (const WebhookRow& h : *hooks) {
        if (e.seq <= h.cursor || !WebhookMatches(h, e, job->second)) continue;
        rows.push_back({.webhook_id = h.id,
                        .event_seq = e.seq,
                        .body = WebhookBody(h, e, job->second, sender->options_.dashboard_url),
                        .next_ms = now});
      }
    }
    std::map<std::string, int64_t> cursors;
    for (const WebhookRow& h : *hooks) cursors[h.id] = events->back().seq;
    if (Status s = store.QueueWebhookDeliveries(rows, cursors); !s.ok()) {
      StoreFailed(s);
      return false;
    }
    last_error.clear();
    return static_cast<int64_t>(events->size()) == kScanBatch;
  }

  // Starts the oldest due delivery of each webhook with none in flight (one query each: a dead
  // webhook's backlog never hides another's deliveries).
  void Dispatch() {
    Store& store = *sender->store_;
    auto hooks = store.ListWebhooks();
    if (!hooks.ok()) return StoreFailed(hooks.status());
    const int64_t now = sender->clock_->WallMs();
    for (const WebhookRow& hook : *hooks) {
      if (in_flight.count(hook.id)) continue;
      auto due = store.DueWebhookDeliveries(now, 1, hook.id);
      if (!due.ok()) return StoreFailed(due.status());
      if (!due->empty()) Send(due->front(), hook);
    }
  }

  void Send(const WebhookDeliveryRow& d, const WebhookRow& hook) {
    auto url = ParseWebhookUrl(hook.url);
    if (!url.ok()) return Done(d, 0, url.status().message());  // checked when added: not expected
    in_flight.insert(d.webhook_id);
    PostRequest request{.url = *url,
                        .headers = {{"X-Ftune-Event-Id", WebhookDeliveryId(d.webhook_id, d.event_seq)},
                                    {"X-Ftune-Signature", WebhookSignature(hook.secret, d.body)}},
                        .body = d.body,
                        .timeout = std::chrono::milliseconds(sender->options_.timeout_ms)};
    StartPost(*sender->io_, *sender->tls_, std::move(request),
              [this, d](int status, const std::string& error) {
                in_flight.erase(d.webhook_id);
                Done(d, status, error);
                Dispatch();  // its next due delivery, without waiting for the poll
              });
  }

  // One attempt's result: delivered, retried later, or given up.
  void Done(WebhookDeliveryRow d, int status, const std::string& error) {
    Store& store = *sender->store_;
    const std::string id = WebhookDeliveryId(d.webhook_id, d.event_seq);
    if (status >= 200 && status < 300) {
      sender->counters_->delivered += 1;
      if (Status s = store.FinishWebhookDelivery(d.webhook_id, d.event_seq); !s.ok()) StoreFailed(s);
      return;
    }
    sender->counters_->failed += 1;
    d.attempts += 1;
    d.last_error = status != 0 ? "HTTP " + std::to_string(status) : error;
    const WebhookSenderOptions& o = sender->options_;
    if (d.attempts >= o.max_attempts) {
      sender->counters_->given_up += 1;
      const std::string message = "webhook " + d.webhook_id + " gave up on delivery " + id + " after " +
                                  std::to_string(d.attempts) + " attempts; last: " + d.last_error;
      FT_LOG(WARN) << "webhooks: " << message;
      // The event first: a crash between the two gives up again (twice said), never silently.
      sender->record_event_(JobIdOf(d.body), "webhook_given_up", message, 0);
      if (Status s = store.FinishWebhookDelivery(d.webhook_id, d.event_seq); !s.ok()) StoreFailed(s);
      return;
    }
    const int64_t delay = std::min(o.max_backoff_ms, o.backoff_ms << std::min<int64_t>(d.attempts - 1, 30));
    d.next_ms = sender->clock_->WallMs() + delay;
    if (d.attempts == 1) {
      FT_LOG(WARN) << "webhooks: delivery " << id << " failed (" << d.last_error
                   << "); retrying with backoff";
    }
    if (Status s = store.RetryWebhookDelivery(d); !s.ok()) StoreFailed(s);
  }
};

WebhookSender::WebhookSender(Store* store, const Clock* clock, WebhookSenderOptions options,
                             EventRecorder record_event, WebhookCounters* counters)
    : store_(store),
      clock_(clock),
      options_(std::move(options)),
      record_event_(std::move(record_event)),
      counters_(counters) {}

WebhookSender::~WebhookSender() {
  Stop();
  impl_.reset();  // before the io_context: its timer belongs to it
  io_.reset();    // drops the requests in flight (their rows stay: made again after a restart)
}

Status WebhookSender::Start() {
  tls_ = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
  tls_->set_options(asio::ssl::context::no_sslv2 | asio::ssl::context::no_sslv3 |
                    asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
  boost::system::error_code ec;
  if (options_.ca_file.empty()) {
    tls_->set_default_verify_paths(ec);
  } else {
    tls_->load_verify_file(options_.ca_file, ec);
  }
  if (ec) {
    return Status::InvalidArgument("--webhook-ca " + options_.ca_file +
                                   ": cannot load the CA bundle: " + ec.message());
  }
  io_ = std::make_unique<asio::io_context>();
  impl_ = std::make_unique<Impl>(this, *io_);
  asio::post(*io_, [this] { impl_->Poll(); });
  thread_ = std::thread([this] {
    auto work = asio::make_work_guard(*io_);
    io_->run();
  });
  return Status::OK();
}

void WebhookSender::Stop() {
  if (!thread_.joinable()) return;
  io_->stop();
  thread_.join();
}

void WebhookSender::Wake() {
  if (io_) asio::post(*io_, [this] { impl_->Poll(); });
}

}  // namespace ft
