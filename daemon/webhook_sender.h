// ftd's webhook deliveries (daemon/webhooks.h says what is sent): a thread of its own that reads
// the store's outbox and posts, never touching the daemon's lock, so no receiver can delay a
// scheduling tick.
//
// The outbox: every poll it reads the events after the lowest webhook cursor, queues a delivery
// row for each (webhook, event) that matches, with its body, and moves the cursors, in one
// transaction (Store::QueueWebhookDeliveries): an event is queued once, across ftd restarts. Then
// it posts the due rows, at most one request in flight per webhook (a receiver that never answers
// holds only its own deliveries back). A 2xx answer delivers (the row goes); anything else
// (another status, a refused connection, no answer within timeout_ms) is retried after
// backoff_ms, doubled per failed attempt up to max_backoff_ms; after max_attempts the delivery is
// given up: the row goes, a `webhook_given_up` event on the job names the webhook, the delivery
// id and the last error, and the counter in /metrics counts it. A delivery in flight when ftd
// stops or is killed is made again after the restart (at least once).
//
// Thread safety: the constructor, Start, Stop and the destructor from one thread; Wake from any
// until the destructor.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/status.h"
#include "daemon/store.h"
#include "daemon/webhooks.h"

namespace boost::asio {
class io_context;
namespace ssl {
class context;
}  // namespace ssl
}  // namespace boost::asio

namespace ft {

struct WebhookSenderOptions {
  int64_t poll_ms = 500;             // the outbox is read this often (and on Wake)
  int64_t timeout_ms = 10'000;       // one request, from resolving the host to the answer
  int64_t backoff_ms = 1'000;        // the first retry's delay; doubled per failed attempt
  int64_t max_backoff_ms = 600'000;  // up to this
  int64_t max_attempts = 15;         // then the delivery is given up (about 1.5 h with the defaults)
  std::string dashboard_url;         // ftd's dashboard as people reach it ("" = no link in the body)
  std::string ca_file;               // PEM CA bundle for https:// receivers ("" = the system's store)
};

// Records an ftd event (job id, kind, message, step): the daemon's RecordEvent in ftd.
using EventRecorder =
    std::function<void(const std::string&, const std::string&, const std::string&, int64_t)>;

class WebhookSender {
 public:
  // `store`, `clock` and `counters` outlive it; `clock`'s wall time stamps retries.
  WebhookSender(Store* store, const Clock* clock, WebhookSenderOptions options, EventRecorder record_event,
                WebhookCounters* counters);
  ~WebhookSender();  // Stop(), then drops the requests in flight
  WebhookSender(const WebhookSender&) = delete;
  WebhookSender& operator=(const WebhookSender&) = delete;

  // Starts the thread. InvalidArgument naming --webhook-ca when ca_file cannot be loaded.
  Status Start();
  // Ends the thread; requests in flight are not answered (their rows stay: made again after a
  // restart). Idempotent.
  void Stop();
  // Reads the outbox now instead of at the next poll.
  void Wake();

 private:
  struct Impl;  // lives on the io thread
  Store* store_;
  const Clock* clock_;
  WebhookSenderOptions options_;
  EventRecorder record_event_;
  WebhookCounters* counters_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<boost::asio::ssl::context> tls_;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace ft
