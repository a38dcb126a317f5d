#include "tests/support/webhook_receiver.h"

#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>

namespace ft::testing_support {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

// A loopback socket bound to a free port; listening when `listen` (else only bound). *port set.
int BoundSocket(bool listen, int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || (listen && ::listen(fd, 64) != 0)) {
    std::perror("webhook receiver: socket");
    std::abort();
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

WebhookReceiver::WebhookReceiver(Policy policy, const std::string& tls_cert, const std::string& tls_key)
    : policy_(std::move(policy)) {
  if (!tls_cert.empty()) {
    tls_ = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
    tls_->use_certificate_chain_file(tls_cert);
    tls_->use_private_key_file(tls_key, asio::ssl::context::pem);
  }
  listen_fd_ = BoundSocket(true, &port_);
  acceptor_ = std::thread([this] { Serve(); });
}

WebhookReceiver::~WebhookReceiver() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);  // unblocks their reads
  }
  cv_.notify_all();
  acceptor_.join();
  for (std::thread& t : threads_) t.join();
  ::close(listen_fd_);
}

std::string WebhookReceiver::url(const std::string& path, const std::string& host) const {
  return (tls_ ? "https://" : "http://") + host + ":" + std::to_string(port_) + path;
}

void WebhookReceiver::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
  }
  cv_.notify_all();
}

void WebhookReceiver::Serve() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    open_fds_.insert(fd);
    threads_.emplace_back([this, fd] { Handle(fd); });
  }
}

void WebhookReceiver::Handle(int fd) {
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  beast::error_code ec;
  socket.assign(asio::ip::tcp::v4(), fd, ec);
  if (!ec && tls_) {
    asio::ssl::stream<asio::ip::tcp::socket&> stream(socket, *tls_);
    stream.handshake(asio::ssl::stream_base::server, ec);
    if (!ec) Answer(stream);
  } else if (!ec) {
    Answer(socket);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_fds_.erase(fd);
  }
  socket.close(ec);
}

template <typename Stream>
void WebhookReceiver::Answer(Stream& stream) {
  beast::error_code ec;
  beast::flat_buffer buffer;
  http::request<http::string_body> req;
  http::read(stream, buffer, req, ec);
  if (ec) return;
  WebhookPost post{std::string(req["X-Ftune-Event-Id"]), std::string(req["X-Ftune-Signature"]),
                   std::string(req.target()), req.body()};
  std::unique_lock<std::mutex> lock(mu_);
  posts_.push_back(post);
  int n = 0;
  for (const WebhookPost& p : posts_) n += p.event_id == post.event_id ? 1 : 0;
  lock.unlock();
  cv_.notify_all();
  int status = policy_ ? policy_(post, n) : 200;
  lock.lock();
  if (status == kHold) {
    cv_.wait(lock, [&] { return released_ || stopping_; });
    status = released_ ? 200 : 0;
  }
  lock.unlock();
  if (status <= 0) return;
  http::response<http::string_body> res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, "text/plain");
  res.body() = "ok";
  res.prepare_payload();
  http::write(stream, res, ec);
}

std::vector<WebhookPost> WebhookReceiver::posts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return posts_;
}

bool WebhookReceiver::WaitFor(const std::function<bool(const std::vector<WebhookPost>&)>& pred,
                              int64_t timeout_ms) const {
  // Polled as well as woken by posts: `pred` may read state that changes without a post.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (pred(posts_)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
}

int WebhookReceiver::Count(const std::string& event_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const WebhookPost& p : posts_) n += p.event_id == event_id ? 1 : 0;
  return n;
}

SilentPort::SilentPort() { fd_ = BoundSocket(true, &port_); }
SilentPort::~SilentPort() { ::close(fd_); }

int RefusingPort() {
  int port = 0;
  ::close(BoundSocket(false, &port));
  return port;
}

bool ValidWebhookSignature(const std::string& secret, const std::string& body, const std::string& signature) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(body.data()), body.size(), mac, &len);
  std::string hex = "sha256=";
  char byte[3];
  for (unsigned int i = 0; i < len; ++i) {
    std::snprintf(byte, sizeof byte, "%02x", mac[i]);
    hex += byte;
  }
  return signature == hex;
}

}  // namespace ft::testing_support
