// A webhook receiver for tests: a real HTTP/1.1 (or HTTPS) server on loopback (Boost.Beast, one
// thread per connection) that records every POST (its X-Ftune-Event-Id, X-Ftune-Signature and body) and
// answers what the test's policy says: a status code, or kHold (no answer until Release() or the
// receiver stops: a delivery in flight). Dead receivers for the other failure modes:
// SilentPort (accepts connections, never reads or answers) and RefusingPort (nothing listens).
//
// Thread safety: every method is thread-safe; the policy runs on connection threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace boost::asio::ssl {
class context;
}  // namespace boost::asio::ssl

namespace ft::testing_support {

struct WebhookPost {
  std::string event_id;   // X-Ftune-Event-Id
  std::string signature;  // X-Ftune-Signature
  std::string target;     // the request's path
  std::string body;
};

class WebhookReceiver {
 public:
  static constexpr int kHold = -1;
  // policy(post, n): the status to answer the n-th post (1-based) carrying this event id, or kHold.
  using Policy = std::function<int(const WebhookPost&, int n)>;
  // nullptr: always 200. With `tls_cert` and `tls_key` (PEM files) it serves HTTPS.
  explicit WebhookReceiver(Policy policy = nullptr, const std::string& tls_cert = "",
                           const std::string& tls_key = "");
  ~WebhookReceiver();
  WebhookReceiver(const WebhookReceiver&) = delete;
  WebhookReceiver& operator=(const WebhookReceiver&) = delete;

  int port() const { return port_; }
  // http(s)://HOST:PORT/PATH (HOST 127.0.0.1 unless given).
  std::string url(const std::string& path = "/hook", const std::string& host = "127.0.0.1") const;
  // Answers every held post with 200 (their clients may be gone) and holds no more.
  void Release();

  std::vector<WebhookPost> posts() const;  // in arrival order, duplicates included
  // Waits until pred(posts()) holds or timeout_ms passes (checked at each post and every 20 ms;
  // called with the receiver's lock held); returns whether it held.
  bool WaitFor(const std::function<bool(const std::vector<WebhookPost>&)>& pred, int64_t timeout_ms) const;
  // How many posts carried `event_id`.
  int Count(const std::string& event_id) const;

 private:
  void Serve();
  void Handle(int fd);

  // Reads one request from `stream`, records it and answers it as the policy says.
  template <typename Stream>
  void Answer(Stream& stream);

  Policy policy_;
  std::shared_ptr<boost::asio::ssl::context> tls_;  // null: plain HTTP
  int listen_fd_ = -1;
  int port_ = 0;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<WebhookPost> posts_;  // GUARDED_BY(mu_)
  bool released_ = false;           // GUARDED_BY(mu_)
  bool stopping_ = false;           // GUARDED_BY(mu_)
  std::set<int> open_fds_;          // GUARDED_BY(mu_) connections being served
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

// A loopback port that accepts TCP connections (the kernel completes them) but never reads or
// answers: a receiver that hangs.
class SilentPort {
 public:
  SilentPort();
  ~SilentPort();
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A loopback port nothing listens on: connections are refused.
int RefusingPort();

// Whether `signature` is "sha256=" + the hex HMAC-SHA256 of `body` under `secret`.
bool ValidWebhookSignature(const std::string& secret, const std::string& body, const std::string& signature);

}  // namespace ft::testing_support
