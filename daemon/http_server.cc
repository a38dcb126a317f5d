#include "daemon/http_server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detect_ssl.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/logging.h"
#include "daemon/http_tls.h"
#include "daemon/json_views.h"

namespace ft {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace pb = ftune::v1;
using tcp = net::ip::tcp;
using nlohmann::json;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

namespace {

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Connections and streams are written once for both transports: Stream is
// beast::tcp_stream (plaintext) or TlsStream; timeouts and closing act on the TCP layer.
template <class Stream>
constexpr bool kIsTls = std::is_same_v<Stream, TlsStream>;

// Live subscriptions, so Stop() can end them all before the io_context goes away.
class StreamRegistry {
 public:
  explicit StreamRegistry(Daemon* daemon) : daemon_(daemon) {}
  // False once stopped: the caller must unsubscribe itself.
  bool Add(int64_t sub) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    subs_.insert(sub);
    return true;
  }
  void Remove(int64_t sub) {
    std::lock_guard<std::mutex> lock(mu_);
    subs_.erase(sub);
  }
  void StopAll() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    for (int64_t s : subs_) daemon_->Unsubscribe(s);
    subs_.clear();
  }
  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(subs_.size());
  }

 private:
  Daemon* daemon_;
  std::mutex mu_;
  std::set<int64_t> subs_;  // GUARDED_BY(mu_)
  bool stopped_ = false;    // GUARDED_BY(mu_)
};

struct Shared {
  Daemon* daemon;
  HttpApi* api;
  HttpServerOptions options;
  StreamRegistry registry;
  std::shared_ptr<net::ssl::context> tls;  // null = plaintext
};

// Updates posted by the daemon's callback and not yet handled on the strand.
struct Inbox {
  std::atomic<int64_t> pending{0};
  std::atomic<bool> overflowed{false};
};

// One SSE stream. Everything but the subscription callback runs on the connection's strand.
template <class Stream>
class SseStream : public std::enable_shared_from_this<SseStream<Stream>> {
 public:
  using std::enable_shared_from_this<SseStream<Stream>>::shared_from_this;
  SseStream(Stream stream, Shared* shared, std::string job, int64_t after_seq)
      : stream_(std::move(stream)),
        shared_(shared),
        job_(std::move(job)),
        after_seq_(after_seq),
        timer_(stream_.get_executor()) {}
  ~SseStream() {
    if (subscribed_) shared_->daemon->Unsubscribe(sub_);
  }

  void Start() {
    beast::get_lowest_layer(stream_).expires_never();
    Send(
        "HTTP/1.1 200 OK\r\nServer: ftd\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "X-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 2000\n\n");
    std::weak_ptr<SseStream> weak = shared_from_this();
    auto exec = stream_.get_executor();
    auto inbox = inbox_;
    const int64_t max_pending = shared_->options.stream_max_pending;
    // Called by the daemon with its subscriber lock held: only post, never block.
    sub_ = shared_->daemon->Subscribe(job_, [weak, exec, inbox, max_pending](const pb::JobUpdate& u) {
      if (inbox->pending.fetch_add(1) >= max_pending) {
        inbox->pending.fetch_sub(1);
        if (!inbox->overflowed.exchange(true)) {
          net::post(exec, [weak] {
            if (auto s = weak.lock()) s->Close("the client reads too slowly");
          });
        }
        return;
      }
      net::post(exec, [weak, inbox, u] {
        inbox->pending.fetch_sub(1);
        if (auto s = weak.lock()) s->OnUpdate(u);
      });
    });
    subscribed_ = true;
    if (!shared_->registry.Add(sub_)) {
      Close("the server is stopping");
      return;
    }
    Replay();
    ReadUntilClosed();
    Arm();
  }

 private:
  void Replay() {
    if (after_seq_ < 0) return;
    pb::ListEventsRequest req;
    req.set_job_id(job_);
    req.set_after_seq(after_seq_);
    req.set_limit(HttpApi::kMaxLimit);
    auto events = shared_->daemon->ListEvents(req);
    if (!events.ok()) {
      FT_LOG(WARN) << "http: stream replay: " << events.status().ToString();
      return;
    }
    for (const pb::Event& e : events->events()) SendEvent(e);
  }

  void SendEvent(const pb::Event& e) {
    if (e.seq() != 0 && e.seq() <= last_seq_) return;  // already sent by the replay
    last_seq_ = std::max(last_seq_, e.seq());
    Send("id: " + std::to_string(e.seq()) + "\nevent: event\ndata: " + Dump(EventJson(e)) + "\n\n");
  }

  void SendJob(const json& summary) { Send("event: job\ndata: " + Dump(summary) + "\n\n"); }

  void OnUpdate(const pb::JobUpdate& u) {
    if (closed_) return;
    switch (u.update_case()) {
      case pb::JobUpdate::kEvent: SendEvent(u.event()); break;
      case pb::JobUpdate::kMetric:
        Send("event: metric\ndata: " + Dump(MetricJson(u.metric(), u.job_id())) + "\n\n");
        dirty_.insert(u.job_id());  // its progress moved: a fresh summary follows within a period
        break;
      case pb::JobUpdate::kJob: {
        auto summary = shared_->api->JobSummary(u.job());
        if (summary.ok()) SendJob(*summary);
        dirty_.erase(u.job_id());
        break;
      }
      default: break;
    }
  }

  // Every period: summaries of jobs whose progress moved, workers when changed, keepalive.
  void OnTick() {
    if (closed_) return;
    for (const std::string& id : dirty_) {
      auto summary = shared_->api->JobSummary(id);
      if (summary.ok()) SendJob(*summary);
    }
    dirty_.clear();
    if (job_.empty()) {
      auto workers = shared_->api->Workers();
      if (workers.ok()) {
        std::string text = Dump(*workers);
        if (text != last_workers_) {
          Send("event: workers\ndata: " + text + "\n\n");
          last_workers_ = std::move(text);
        }
      }
    }
    if (std::chrono::steady_clock::now() - last_send_ >=
        std::chrono::milliseconds(shared_->options.keepalive_ms)) {
      Send(": keepalive\n\n");
    }
    Arm();
  }

  void Arm() {
    if (closed_) return;
    timer_.expires_after(std::chrono::milliseconds(shared_->options.stream_period_ms));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->OnTick();
    });
  }

  // SSE clients send nothing: a finished read means the client went away. (Under TLS one
  // read and one write may be outstanding together on the strand, as Asio's ssl::stream allows.)
  void ReadUntilClosed() {
    stream_.async_read_some(net::buffer(discard_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        self->Close("");
      } else {
        self->ReadUntilClosed();
      }
    });
  }

  void Send(std::string text) {
    if (closed_) return;
    queued_bytes_ += static_cast<int64_t>(text.size());
    queue_.push_back(std::move(text));
    last_send_ = std::chrono::steady_clock::now();
    if (queued_bytes_ > shared_->options.stream_max_bytes) {
      Close("the client reads too slowly");
      return;
    }
    if (!writing_) Write();
  }

  void Write() {
    writing_ = true;
    net::async_write(stream_, net::buffer(queue_.front()),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec || self->closed_) {
                         self->writing_ = false;
                         self->Close("");
                         return;
                       }
                       self->queued_bytes_ -= static_cast<int64_t>(self->queue_.front().size());
                       self->queue_.pop_front();
                       if (self->queue_.empty()) {
                         self->writing_ = false;
                       } else {
                         self->Write();
                       }
                     });
  }

  void Close(const std::string& why) {
    if (closed_) return;
    closed_ = true;
    if (!why.empty()) FT_LOG(WARN) << "http: closing an event stream: " << why;
    if (subscribed_) {
      shared_->daemon->Unsubscribe(sub_);
      shared_->registry.Remove(sub_);
      subscribed_ = false;
    }
    timer_.cancel();
    // Under TLS without close_notify: the stream never ends on its own, and a
    // client that went away would not answer one.
    beast::error_code ec;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ec);
    beast::get_lowest_layer(stream_).close();
  }

  Stream stream_;
  Shared* shared_;
  const std::string job_;
  const int64_t after_seq_;
  net::steady_timer timer_;
  std::shared_ptr<Inbox> inbox_ = std::make_shared<Inbox>();
  int64_t sub_ = 0;
  bool subscribed_ = false;
  bool closed_ = false;
  int64_t last_seq_ = 0;
  std::set<std::string> dirty_;
  std::string last_workers_;
  std::deque<std::string> queue_;  // front is being written while writing_
  int64_t queued_bytes_ = 0;
  bool writing_ = false;
  std::chrono::steady_clock::time_point last_send_ = std::chrono::steady_clock::now();
  std::array<char, 512> discard_{};
};

// One keep-alive HTTP connection, on its own strand. `buffer` holds bytes already
// read from the client (by the TLS detector). With `refuse_plaintext` (a
// plaintext client on the HTTPS port) it answers the first request with 400
// saying to use https://, then closes.
template <class Stream>
class Connection : public std::enable_shared_from_this<Connection<Stream>> {
 public:
  using std::enable_shared_from_this<Connection<Stream>>::shared_from_this;
  Connection(Stream stream, Shared* shared, beast::flat_buffer buffer = {}, bool refuse_plaintext = false)
      : stream_(std::move(stream)),
        shared_(shared),
        buffer_(std::move(buffer)),
        refuse_plaintext_(refuse_plaintext) {}

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if constexpr (kIsTls<Stream>) {
        self->Handshake();
      } else {
        self->Read();
      }
    });
  }

 private:
  void Handshake() {
    beast::get_lowest_layer(stream_).expires_after(
        std::chrono::milliseconds(shared_->options.tls_handshake_timeout_ms));
    stream_.async_handshake(net::ssl::stream_base::server, buffer_.data(),
                            [self = shared_from_this()](beast::error_code ec, size_t used) {
                              if (ec) {  // an untrusting client or a scanner: nothing to answer
                                FT_LOG(DEBUG) << "http: TLS handshake failed: " << ec.message();
                                beast::get_lowest_layer(self->stream_).close();
                                return;
                              }
                              self->buffer_.consume(used);
                              self->Read();
                            });
  }

  void Read() {
    parser_.emplace();
    parser_->header_limit(16 * 1024);
    parser_->body_limit(64 * 1024);
    beast::get_lowest_layer(stream_).expires_after(
        std::chrono::milliseconds(shared_->options.idle_timeout_ms));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted ||
        ec == net::ssl::error::stream_truncated) {
      Shutdown();
      return;
    }
    if (refuse_plaintext_) {
      Respond(400,
              Dump(json{{"error",
                         "this port serves HTTPS (ftd runs with --tls-cert): use https:// "
                         "and trust ftd's certificate"}}),
              "application/json", {}, false);
      return;
    }
    if (ec) {  // a malformed request: answer once, then close
      Respond(400, Dump(json{{"error", "bad HTTP request: " + ec.message()}}), "application/json", {}, false);
      return;
    }
    const auto& req = parser_->get();
    HttpRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.authorization = std::string(req[http::field::authorization]);
    r.cookie = std::string(req[http::field::cookie]);
    r.last_event_id = std::string(req["Last-Event-ID"]);
    r.origin = std::string(req[http::field::origin]);
    r.host = std::string(req[http::field::host]);
    r.sec_fetch_site = std::string(req["Sec-Fetch-Site"]);
    HttpResponse out;
    try {
      out = shared_->api->Handle(r);
    } catch (const std::exception& e) {  // a bug: answer 500 rather than drop the daemon
      FT_LOG(ERROR) << "http: " << r.method << " " << r.target << ": " << e.what();
      out = HttpResponse{};
      out.status = 500;
      out.body = Dump(json{{"error", std::string("internal error: ") + e.what()}});
    }
    if (out.stream) {
      std::make_shared<SseStream<Stream>>(std::move(stream_), shared_, out.stream_job, out.stream_after_seq)
          ->Start();
      return;
    }
    Respond(out.status, std::move(out.body), out.content_type, out.headers, req.keep_alive());
  }

  void Respond(int status, std::string body, const std::string& type,
               const std::vector<std::pair<std::string, std::string>>& headers, bool keep_alive) {
    res_ = {};
    res_.result(static_cast<http::status>(status));
    res_.version(11);
    res_.set(http::field::server, "ftd");
    res_.set(http::field::content_type, type);
    for (const auto& [name, value] : headers) res_.set(name, value);
    res_.body() = std::move(body);
    res_.keep_alive(keep_alive);
    res_.prepare_payload();
    http::async_write(stream_, res_, [self = shared_from_this(), keep_alive](beast::error_code ec, size_t) {
      if (ec || !keep_alive) {
        self->Shutdown();
      } else {
        self->Read();
      }
    });
  }

  void Shutdown() {
    if constexpr (kIsTls<Stream>) {  // close_notify, bounded by the handshake timeout
      beast::get_lowest_layer(stream_).expires_after(
          std::chrono::milliseconds(shared_->options.tls_handshake_timeout_ms));
      stream_.async_shutdown(
          [self = shared_from_this()](beast::error_code) { beast::get_lowest_layer(self->stream_).close(); });
    } else {
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    }
  }

  Stream stream_;
  Shared* shared_;
  beast::flat_buffer buffer_;
  const bool refuse_plaintext_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
};

// The HTTPS port's first step: peek at the client's first bytes. A TLS
// ClientHello goes on to a TLS connection (the bytes read are handed over to
// its handshake); anything else is a plaintext client, answered 400.
class TlsDetector : public std::enable_shared_from_this<TlsDetector> {
 public:
  TlsDetector(tcp::socket socket, Shared* shared) : stream_(std::move(socket)), shared_(shared) {}

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->stream_.expires_after(std::chrono::milliseconds(self->shared_->options.tls_handshake_timeout_ms));
      beast::async_detect_ssl(self->stream_, self->buffer_,
                              [self](beast::error_code ec, bool tls) { self->OnDetect(ec, tls); });
    });
  }

 private:
  void OnDetect(beast::error_code ec, bool tls) {
    if (ec) {  // closed or silent before saying anything
      stream_.close();
      return;
    }
    if (tls) {
      std::make_shared<Connection<TlsStream>>(TlsStream(std::move(stream_), *shared_->tls), shared_,
                                              std::move(buffer_))
          ->Start();
    } else {
      std::make_shared<Connection<beast::tcp_stream>>(std::move(stream_), shared_, std::move(buffer_),
                                                      /*refuse_plaintext=*/true)
          ->Start();
    }
  }

  beast::tcp_stream stream_;
  Shared* shared_;
  beast::flat_buffer buffer_;
};

}  // namespace

struct HttpServer::Impl {
  Impl(Daemon* daemon, HttpApi* api, HttpServerOptions options)
      : shared{daemon, api, options, StreamRegistry(daemon), nullptr}, ioc(options.threads), acceptor(ioc) {}

  void Accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (!ec && shared.tls) {
        std::make_shared<TlsDetector>(std::move(socket), &shared)->Start();
      } else if (!ec) {
        std::make_shared<Connection<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), &shared)
            ->Start();
      }
      if (acceptor.is_open()) Accept();
    });
  }

  Shared shared;  // first: outlives the io_context's handlers
  net::io_context ioc;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::string host;
  int port = 0;
  bool stopped = false;
};

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Daemon* daemon, HttpApi* api,
                                                        HttpServerOptions options) {
  const size_t colon = options.address.rfind(':');
  std::string host = colon == std::string::npos ? "" : options.address.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : options.address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(port) > 65535) {
    return Status::InvalidArgument("--http '" + options.address +
                                   "': expected HOST:PORT, e.g. 127.0.0.1:7071 (port 0 = any free port)");
  }
  if (options.threads < 1) return Status::InvalidArgument("http server: threads must be >= 1");
  auto impl = std::make_unique<Impl>(daemon, api, options);
  impl->host = host;
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    FT_ASSIGN_OR_RETURN(impl->shared.tls, MakeHttpTlsContext({options.tls_cert_file, options.tls_key_file}));
  }
  beast::error_code ec;
  tcp::resolver resolver(impl->ioc);
  auto results = resolver.resolve(host, port, tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    return Status::InvalidArgument("--http '" + options.address + "': cannot resolve " + host + ": " +
                                   ec.message());
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  auto& acceptor = impl->acceptor;
  if (acceptor.open(endpoint.protocol(), ec); !ec)
    acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Status::Unavailable("cannot serve HTTP on " + options.address + ": " + ec.message());
  impl->port = acceptor.local_endpoint().port();
  impl->Accept();
  for (int i = 0; i < options.threads; ++i) {
    impl->threads.emplace_back([ioc = &impl->ioc] { ioc->run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  net::post(impl_->ioc, [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
  impl_->shared.registry.StopAll();  // no daemon callback reaches the io_context after this
  impl_->ioc.stop();
  for (std::thread& t : impl_->threads) t.join();
}

const std::string& HttpServer::host() const { return impl_->host; }
int HttpServer::port() const { return impl_->port; }
int64_t HttpServer::open_streams() const { return impl_->shared.registry.size(); }
bool HttpServer::tls() const { return impl_->shared.tls != nullptr; }

}  // namespace ft
