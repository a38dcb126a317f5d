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
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <type_traits>
#include <utility>
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

constexpr uint64_t kMaxHeaderBytes = 16 * 1024;  // docs/OPERATIONS.md, "Limits on input"
constexpr uint64_t kMaxBodyBytes = 64 * 1024;
constexpr int64_t kMaxRefusals = 64;  // 503s written at once; past them a refused client is just closed

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Connections and streams are written once for both transports: Stream is
// beast::tcp_stream (plaintext) or TlsStream; timeouts and closing act on the TCP layer.
template <class Stream>
constexpr bool kIsTls = std::is_same_v<Stream, TlsStream>;

// Text shared by every stream it is posted to (one allocation per update).
using Text = std::shared_ptr<const std::string>;

Text MakeText(std::string s) { return std::make_shared<const std::string>(std::move(s)); }

// A counted slot (a connection, an SSE stream): released when destroyed.
class Slot {
 public:
  Slot() = default;
  // Takes a slot of `count` when fewer than `max` are taken; an empty Slot otherwise.
  static Slot TryTake(std::atomic<int64_t>* count, int64_t max) {
    int64_t n = count->load();
    while (n < max) {
      if (count->compare_exchange_weak(n, n + 1)) return Slot(count);
    }
    return Slot();
  }
  Slot(Slot&& o) noexcept : count_(std::exchange(o.count_, nullptr)) {}
  Slot& operator=(Slot&& o) noexcept {
    Reset();
    count_ = std::exchange(o.count_, nullptr);
    return *this;
  }
  ~Slot() { Reset(); }
  explicit operator bool() const { return count_ != nullptr; }
  void Reset() {
    if (count_ != nullptr) count_->fetch_sub(1);
    count_ = nullptr;
  }

 private:
  explicit Slot(std::atomic<int64_t>* count) : count_(count) {}
  std::atomic<int64_t>* count_ = nullptr;
};

// Connections per client address (HttpPeerKey), for max_connections_per_peer.
class PeerCounts {
 public:
  // Counts one more connection of `peer` unless it holds `max` already (0 = no cap).
  bool TryTake(const std::string& peer, int64_t max) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = counts_.find(peer);
    if (it != counts_.end() && max > 0 && it->second >= max) return false;
    ++counts_[peer];
    return true;
  }
  void Release(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = counts_.find(peer);
    if (it != counts_.end() && --it->second <= 0) counts_.erase(it);
  }

 private:
  std::mutex mu_;
  std::map<std::string, int64_t> counts_;  // GUARDED_BY(mu_) peers with open connections only
};

// A connection's place among its peer's: released when destroyed.
class PeerSlot {
 public:
  PeerSlot() = default;
  // Takes one of `peer`'s places; an empty PeerSlot when it holds `max` (0 = no cap).
  static PeerSlot TryTake(PeerCounts* counts, std::string peer, int64_t max) {
    if (!counts->TryTake(peer, max)) return PeerSlot();
    PeerSlot s;
    s.counts_ = counts;
    s.peer_ = std::move(peer);
    return s;
  }
  PeerSlot(PeerSlot&& o) noexcept : counts_(std::exchange(o.counts_, nullptr)), peer_(std::move(o.peer_)) {}
  PeerSlot& operator=(PeerSlot&& o) noexcept {
    Reset();
    counts_ = std::exchange(o.counts_, nullptr);
    peer_ = std::move(o.peer_);
    return *this;
  }
  ~PeerSlot() { Reset(); }
  explicit operator bool() const { return counts_ != nullptr; }
  void Reset() {
    if (counts_ != nullptr) counts_->Release(peer_);
    counts_ = nullptr;
  }

 private:
  PeerCounts* counts_ = nullptr;
  std::string peer_;
};

// What an open connection holds until it closes (an SSE stream takes it over).
struct Places {
  Slot connection;          // one of max_connections, or of the probe lane
  PeerSlot peer;            // one of its client address's max_connections_per_peer
  bool probe_only = false;  // in the probe lane: GET /healthz and /ready only
};

// The per-peer key of an address (HttpPeerKey).
std::string PeerKey(const net::ip::address& address) {
  if (address.is_v4()) return address.to_string();
  const net::ip::address_v6 v6 = address.to_v6();
  if (v6.is_v4_mapped()) return net::ip::make_address_v4(net::ip::v4_mapped, v6).to_string();
  net::ip::address_v6::bytes_type bytes = v6.to_bytes();
  std::fill(bytes.begin() + 8, bytes.end(), 0);
  return net::ip::address_v6(bytes).to_string() + "/64";
}

// What the broadcaster sees of a stream (the stream itself is a template over its transport).
class StreamBase {
 public:
  virtual ~StreamBase() = default;
  // On the stream's strand: text the broadcaster posted (`seq` > 0 for an event).
  virtual void OnText(const Text& text, int64_t seq) = 0;
  virtual void Close(const std::string& why) = 0;
};

// A stream's mailbox in the broadcaster. `bytes` counts text posted to the
// stream (or queued by it) and not yet written to its socket.
struct Outbox {
  std::string job;  // "" = every job
  TeamScope team;   // only this team's jobs (and worker events); nullopt = every team's
  net::any_io_executor exec;
  std::weak_ptr<StreamBase> stream;
  std::atomic<int64_t> bytes{0};
  std::atomic<bool> overflowed{false};
};

// Which streams limited to a team an update may reach: all of them (worker events), those of
// `team` (a job's updates), or none (`team` nullopt: user management events).
struct Audience {
  bool everyone = false;
  TeamScope team;
  bool Reaches(const Outbox& box) const { return !box.team || everyone || (team && *team == *box.team); }
};

// One daemon subscription for all SSE streams: serializes each update once
// and posts the text to the streams that want it; builds the summaries of
// changed jobs (and the workers list) once per period for all of them.
// Everything but Attach/Detach/Stop/counters runs on its strand.
class Broadcaster {
 public:
  Broadcaster(Daemon* daemon, HttpApi* api, const HttpServerOptions& options, net::io_context& ioc)
      : daemon_(daemon), api_(api), options_(options), exec_(std::make_unique<Exec>(ioc)) {}

  // An SSE stream slot (max_streams); empty when all are taken.
  Slot TakeStreamSlot() { return Slot::TryTake(&reserved_, options_.max_streams); }

  // False once stopped. A stream of every job is sent the last workers list at once.
  bool Attach(const std::shared_ptr<Outbox>& box) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    if (streams_.empty()) {
      sub_ = daemon_->Subscribe("", [this](const pb::JobUpdate& u) {
        // Called with the daemon's subscriber lock held: only post, never block.
        net::post(exec_->strand, [this, u] { OnUpdate(u); });
      });
      net::post(exec_->strand, [this] { ArmWorkers(); });
    }
    streams_.insert(box);
    if (box->job.empty() && last_workers_) Post(*box, last_workers_, 0);
    return true;
  }

  void Detach(const std::shared_ptr<Outbox>& box) {
    std::lock_guard<std::mutex> lock(mu_);
    if (streams_.erase(box) == 0 || !streams_.empty() || stopped_) return;
    daemon_->Unsubscribe(sub_);  // the last stream left: the daemon builds no updates for us
    last_workers_.reset();
  }

  // Ends the subscription: no daemon callback reaches the io_context after this.
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    if (!streams_.empty()) daemon_->Unsubscribe(sub_);
    streams_.clear();
  }
  // Before the io_context goes: the strand and timers belong to it.
  void DropExecutor() { exec_.reset(); }

  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(streams_.size());
  }
  int64_t summaries_built() const { return summaries_built_.load(); }

 private:
  struct Exec {
    explicit Exec(net::io_context& ioc)
        : strand(net::make_strand(ioc)), flush_timer(strand), workers_timer(strand) {}
    net::strand<net::io_context::executor_type> strand;
    net::steady_timer flush_timer;    // the next summaries flush
    net::steady_timer workers_timer;  // the next workers poll
  };
  using Clock = std::chrono::steady_clock;

  void OnUpdate(const pb::JobUpdate& u) {
    switch (u.update_case()) {
      case pb::JobUpdate::kEvent: {
        const pb::Event& e = u.event();
        Fanout(u.job_id(),
               MakeText("id: " + std::to_string(e.seq()) + "\nevent: event\ndata: " + Dump(EventJson(e)) +
                        "\n\n"),
               e.seq(), AudienceOf(u));
        break;
      }
      case pb::JobUpdate::kMetric:
        Fanout(u.job_id(),
               MakeText("event: metric\ndata: " + Dump(MetricJson(u.metric(), u.job_id())) + "\n\n"), 0,
               AudienceOf(u));
        // Its progress moved: the summary is read afresh one period later (the
        // worker's heartbeat with the step's progress follows its metrics).
        dirty_[u.job_id()].reset();
        ScheduleFlush(Clock::now() + std::chrono::milliseconds(options_.stream_period_ms));
        break;
      case pb::JobUpdate::kJob:
        // A state change: at once, unless a flush ran within the period.
        dirty_[u.job_id()] = u.job();
        ScheduleFlush(
            std::max(Clock::now(), last_flush_ + std::chrono::milliseconds(options_.stream_period_ms)));
        break;
      default: break;
    }
  }

  // Flushes at most once per period: at `at` unless one is already due sooner.
  void ScheduleFlush(Clock::time_point at) {
    if (flush_armed_ && flush_at_ <= at) return;
    flush_armed_ = true;
    flush_at_ = at;
    const uint64_t gen = ++flush_gen_;
    exec_->flush_timer.expires_at(at);
    exec_->flush_timer.async_wait([this, gen](beast::error_code ec) {
      if (gen != flush_gen_) return;  // superseded by an earlier flush
      flush_armed_ = false;
      if (!ec) Flush();
    });
  }

  void Flush() {
    last_flush_ = Clock::now();
    std::map<std::string, std::optional<pb::Job>> dirty;
    dirty.swap(dirty_);
    std::vector<pb::Job> jobs;
    for (auto& [id, job] : dirty) {
      if (job) {
        jobs.push_back(std::move(*job));
        continue;
      }
      auto fresh = daemon_->GetJob(id);
      if (fresh.ok()) jobs.push_back(std::move(*fresh));
    }
    if (jobs.empty()) return;
    auto summaries = api_->JobSummaries(jobs);
    if (!summaries.ok()) {
      FT_LOG(WARN) << "http: stream summaries: " << summaries.status().ToString();
      return;
    }
    summaries_built_.fetch_add(static_cast<int64_t>(summaries->size()));
    for (size_t i = 0; i < jobs.size(); ++i) {
      Fanout(jobs[i].id(), MakeText("event: job\ndata: " + Dump((*summaries)[i]) + "\n\n"), 0,
             Audience{.team = jobs[i].team()});
    }
  }

  // Polls the workers once per period while any stream of every job is open.
  void ArmWorkers() {
    if (workers_armed_) return;
    workers_armed_ = true;
    exec_->workers_timer.expires_after(std::chrono::milliseconds(options_.stream_period_ms));
    exec_->workers_timer.async_wait([this](beast::error_code ec) {
      workers_armed_ = false;
      if (ec) return;
      bool any = false, all_jobs = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        any = !streams_.empty();
        for (const auto& box : streams_) all_jobs = all_jobs || box->job.empty();
      }
      if (!any) return;  // re-armed by the next Attach
      if (all_jobs) {
        auto workers = api_->Workers();
        if (workers.ok()) {
          std::string text = "event: workers\ndata: " + Dump(*workers) + "\n\n";
          std::lock_guard<std::mutex> lock(mu_);
          if (!last_workers_ || *last_workers_ != text) {
            last_workers_ = MakeText(std::move(text));
            for (const auto& box : streams_) {
              if (box->job.empty()) Post(*box, last_workers_, 0);
            }
          }
        }
      }
      ArmWorkers();
    });
  }

  void Fanout(const std::string& job, const Text& text, int64_t seq, const Audience& audience) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& box : streams_) {
      if ((box->job.empty() || box->job == job) && audience.Reaches(*box)) Post(*box, text, seq);
    }
  }

  // Who may see an event or metric: a job's go to its team (a job's team never changes, so
  // it is read once per job), worker events to all, user management events to no team.
  Audience AudienceOf(const pb::JobUpdate& u) {
    if (u.job_id().empty()) return Audience{.everyone = u.event().kind().rfind("user_", 0) != 0};
    auto it = teams_.find(u.job_id());
    if (it == teams_.end()) {
      auto job = daemon_->store().GetJob(u.job_id());
      if (!job.ok()) return Audience{};
      it = teams_.emplace(u.job_id(), job->team).first;
    }
    return Audience{.team = it->second};
  }

  // Posts to one stream, or disconnects it when its backlog would pass stream_max_bytes.
  void Post(Outbox& box, const Text& text, int64_t seq) {
    if (box.overflowed.load()) return;
    const auto size = static_cast<int64_t>(text->size());
    if (box.bytes.fetch_add(size) + size > options_.stream_max_bytes) {
      box.bytes.fetch_sub(size);
      box.overflowed = true;
      net::post(box.exec, [weak = box.stream, max = options_.stream_max_bytes] {
        if (auto s = weak.lock()) {
          s->Close("the client reads too slowly (over " + std::to_string(max) + " bytes waiting)");
        }
      });
      return;
    }
    net::post(box.exec, [weak = box.stream, text, seq] {
      if (auto s = weak.lock()) s->OnText(text, seq);
    });
  }

  Daemon* const daemon_;
  HttpApi* const api_;
  const HttpServerOptions& options_;
  std::unique_ptr<Exec> exec_;
  std::atomic<int64_t> reserved_{0};
  std::atomic<int64_t> summaries_built_{0};

  std::mutex mu_;  // lock order: mu_ → the daemon's subscriber lock (never the other way)
  std::set<std::shared_ptr<Outbox>> streams_;  // GUARDED_BY(mu_)
  int64_t sub_ = 0;                            // GUARDED_BY(mu_) while streams_ is non-empty
  Text last_workers_;                          // GUARDED_BY(mu_) the last workers text sent
  bool stopped_ = false;                       // GUARDED_BY(mu_)

  // On the strand:
  std::map<std::string, std::string> teams_;             // job id → its team (AudienceOf)
  std::map<std::string, std::optional<pb::Job>> dirty_;  // job id → its newest published state, if any
  bool flush_armed_ = false;
  Clock::time_point flush_at_{};
  uint64_t flush_gen_ = 0;
  bool workers_armed_ = false;
  Clock::time_point last_flush_{};
};

struct Shared {
  Daemon* daemon;
  HttpApi* api;
  HttpServerOptions options;
  std::shared_ptr<net::ssl::context> tls;  // null = plaintext
  std::atomic<int64_t> connections{0};     // against max_connections
  std::atomic<int64_t> probes{0};          // against probe_connections
  std::atomic<int64_t> refusals{0};        // 503s being written (kMaxRefusals)
  PeerCounts peers;
  std::unique_ptr<Broadcaster> broadcaster;
};

// One SSE stream, on its connection's strand. Its text comes from the broadcaster.
template <class Stream>
class SseStream : public StreamBase, public std::enable_shared_from_this<SseStream<Stream>> {
 public:
  using std::enable_shared_from_this<SseStream<Stream>>::shared_from_this;
  SseStream(Stream stream, Shared* shared, std::string job, TeamScope team, int64_t after_seq, Places places,
            Slot stream_slot)
      : stream_(std::move(stream)),
        shared_(shared),
        after_seq_(after_seq),
        timer_(stream_.get_executor()),
        places_(std::move(places)),
        stream_slot_(std::move(stream_slot)) {
    box_->job = std::move(job);
    box_->team = std::move(team);
    box_->exec = stream_.get_executor();
  }

  void Start() {
    beast::get_lowest_layer(stream_).expires_never();
    Send(MakeText(
        "HTTP/1.1 200 OK\r\nServer: ftd\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "X-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 2000\n\n"));
    box_->stream = std::weak_ptr<StreamBase>(shared_from_this());
    // Attached before the replay's query: an event committed after it comes live.
    if (!shared_->broadcaster->Attach(box_)) {
      Close("the server is stopping");
      return;
    }
    attached_ = true;
    Replay();
    ReadUntilClosed();
    ArmKeepalive();
  }

  // Live text runs after Start (it is posted to this strand): after the replay.
  void OnText(const Text& text, int64_t seq) override {
    if (closed_ || (seq > 0 && seq <= replay_max_seq_)) {  // already sent by the replay
      box_->bytes.fetch_sub(static_cast<int64_t>(text->size()));
      return;
    }
    Enqueue(text);
  }

  void Close(const std::string& why) override {
    if (closed_) return;
    closed_ = true;
    if (!why.empty()) FT_LOG(WARN) << "http: closing an event stream: " << why;
    if (attached_) {
      shared_->broadcaster->Detach(box_);
      attached_ = false;
    }
    timer_.cancel();
    // Under TLS without close_notify: the stream never ends on its own, and a
    // client that went away would not answer one.
    beast::error_code ec;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ec);
    beast::get_lowest_layer(stream_).close();
  }

 private:
  void Replay() {
    if (after_seq_ < 0) return;
    pb::ListEventsRequest req;
    req.set_job_id(box_->job);
    req.set_after_seq(after_seq_);
    req.set_limit(HttpApi::kMaxLimit);
    auto events = shared_->daemon->ListEvents(req, box_->team);
    if (!events.ok()) {
      FT_LOG(WARN) << "http: stream replay: " << events.status().ToString();
      return;
    }
    for (const pb::Event& e : events->events()) {
      replay_max_seq_ = std::max(replay_max_seq_, e.seq());
      Send(MakeText("id: " + std::to_string(e.seq()) + "\nevent: event\ndata: " + Dump(EventJson(e)) +
                    "\n\n"));
    }
  }

  void ArmKeepalive() {
    if (closed_) return;
    timer_.expires_at(last_send_ + std::chrono::milliseconds(shared_->options.keepalive_ms));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_) return;
      if (std::chrono::steady_clock::now() - self->last_send_ >=
          std::chrono::milliseconds(self->shared_->options.keepalive_ms)) {
        self->Send(MakeText(": keepalive\n\n"));
      }
      self->ArmKeepalive();
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

  // Text of this stream's own (header, replay, keepalive): counted like the broadcaster's.
  void Send(const Text& text) {
    if (closed_) return;
    const auto size = static_cast<int64_t>(text->size());
    if (box_->bytes.fetch_add(size) + size > shared_->options.stream_max_bytes) {
      box_->bytes.fetch_sub(size);
      Close("the client reads too slowly (over " + std::to_string(shared_->options.stream_max_bytes) +
            " bytes waiting)");
      return;
    }
    Enqueue(text);
  }

  // `text` is counted in box_->bytes until written.
  void Enqueue(const Text& text) {
    queue_.push_back(text);
    last_send_ = std::chrono::steady_clock::now();
    if (!writing_) Write();
  }

  void Write() {
    writing_ = true;
    net::async_write(stream_, net::buffer(*queue_.front()),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->box_->bytes.fetch_sub(static_cast<int64_t>(self->queue_.front()->size()));
                       self->queue_.pop_front();
                       if (ec || self->closed_) {
                         self->writing_ = false;
                         self->Close("");
                         return;
                       }
                       if (self->queue_.empty()) {
                         self->writing_ = false;
                       } else {
                         self->Write();
                       }
                     });
  }

  Stream stream_;
  Shared* shared_;
  const int64_t after_seq_;
  net::steady_timer timer_;  // keepalive
  Places places_;            // its connection's
  Slot stream_slot_;
  std::shared_ptr<Outbox> box_ = std::make_shared<Outbox>();
  bool attached_ = false;
  bool closed_ = false;
  int64_t replay_max_seq_ = 0;  // live events up to this seq were sent by the replay
  std::deque<Text> queue_;      // front is being written while writing_
  bool writing_ = false;
  std::chrono::steady_clock::time_point last_send_ = std::chrono::steady_clock::now();
  std::array<char, 512> discard_{};
};

// A connection over a connection cap (plaintext port): answered 503 with
// `error` and Retry-After, and closed within 2 s. Holds one of kMaxRefusals.
class Refusal : public std::enable_shared_from_this<Refusal> {
 public:
  Refusal(tcp::socket socket, const std::string& error, int retry_after_s, Slot slot)
      : stream_(std::move(socket)), slot_(std::move(slot)) {
    const std::string body = Dump(json{{"error", error}});
    text_ =
        "HTTP/1.1 503 Service Unavailable\r\nServer: ftd\r\nContent-Type: application/json\r\n"
        "Retry-After: " +
        std::to_string(retry_after_s) +
        "\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  }
  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->stream_.expires_after(std::chrono::seconds(2));
      net::async_write(self->stream_, net::buffer(self->text_), [self](beast::error_code ec, size_t) {
        if (ec) {
          self->stream_.close();
          return;
        }
        beast::error_code ignored;
        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
        self->Drain();  // until the client closes (closing with its request unread would reset the reply)
      });
    });
  }

 private:
  void Drain() {
    stream_.async_read_some(net::buffer(discard_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        self->stream_.close();
      } else {
        self->Drain();
      }
    });
  }
  beast::tcp_stream stream_;
  Slot slot_;
  std::string text_;
  std::array<char, 512> discard_{};
};

// Whether a request may be served in the probe lane: GET /healthz or /ready.
bool IsProbe(const http::request<http::string_body>& req) {
  const std::string_view target(req.target().data(), req.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  return req.method() == http::verb::get && (path == "/healthz" || path == "/ready");
}

// One keep-alive HTTP connection, on its own strand. `buffer` holds bytes already
// read from the client (by the TLS detector). With `refuse_plaintext` (a
// plaintext client on the HTTPS port) it answers the first request with 400
// saying to use https://, then closes. In the probe lane it answers one
// request: GET /healthz or /ready, anything else 503.
template <class Stream>
class Connection : public std::enable_shared_from_this<Connection<Stream>> {
 public:
  using std::enable_shared_from_this<Connection<Stream>>::shared_from_this;
  Connection(Stream stream, Shared* shared, Places places, beast::flat_buffer buffer = {},
             bool refuse_plaintext = false)
      : stream_(std::move(stream)),
        shared_(shared),
        places_(std::move(places)),
        buffer_(std::move(buffer)),
        refuse_plaintext_(refuse_plaintext) {}

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if constexpr (kIsTls<Stream>) {
        self->Handshake();
      } else {
        self->ReadRequest();
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
                              self->ReadRequest();
                            });
  }

  // Between requests: waits up to idle_timeout_ms for the next one's first bytes.
  void WaitForRequest() {
    if (buffer_.size() > 0) {  // pipelined: it has begun
      ReadRequest();
      return;
    }
    beast::get_lowest_layer(stream_).expires_after(
        std::chrono::milliseconds(shared_->options.idle_timeout_ms));
    stream_.async_read_some(buffer_.prepare(kMaxHeaderBytes),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) {  // silent past idle_timeout_ms, or gone
                                self->Shutdown();
                                return;
                              }
                              self->buffer_.commit(n);
                              self->ReadRequest();
                            });
  }

  // One request, header and body, within header_timeout_ms from now (a slow-loris
  // client trickling its header is closed then, whatever its pace).
  void ReadRequest() {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(kMaxBodyBytes);
    beast::get_lowest_layer(stream_).expires_after(
        std::chrono::milliseconds(shared_->options.header_timeout_ms));
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
    if (ec == http::error::body_limit || ec == http::error::header_limit) {  // answer once, then close
      const bool body = ec == http::error::body_limit;
      Respond(body ? 413 : 431,
              Dump(json{{"error", std::string(body ? "request body" : "request headers") + " larger than " +
                                      std::to_string((body ? kMaxBodyBytes : kMaxHeaderBytes) >> 10) +
                                      " KiB: ftd's HTTP API takes nothing larger"}}),
              "application/json", {}, false);
      return;
    }
    if (ec) {  // a malformed request: answer once, then close
      Respond(400, Dump(json{{"error", "bad HTTP request: " + ec.message()}}), "application/json", {}, false);
      return;
    }
    const auto& req = parser_->get();
    if (places_.probe_only && !IsProbe(req)) {
      Respond(503,
              Dump(json{{"error", "ftd serves at most " + std::to_string(shared_->options.max_connections) +
                                      " HTTP connections at once; retry shortly"}}),
              "application/json", {{"Retry-After", "1"}}, false);
      return;
    }
    HttpRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.authorization = std::string(req[http::field::authorization]);
    r.cookie = std::string(req[http::field::cookie]);
    r.last_event_id = std::string(req["Last-Event-ID"]);
    r.origin = std::string(req[http::field::origin]);
    r.host = std::string(req[http::field::host]);
    r.sec_fetch_site = std::string(req["Sec-Fetch-Site"]);
    r.content_type = std::string(req[http::field::content_type]);
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
      Slot stream_slot = shared_->broadcaster->TakeStreamSlot();
      if (!stream_slot) {
        Respond(503,
                Dump(json{{"error", "ftd serves at most " + std::to_string(shared_->options.max_streams) +
                                        " event streams at once; close a dashboard tab or retry shortly"}}),
                "application/json", {{"Retry-After", "5"}}, false);
        return;
      }
      std::make_shared<SseStream<Stream>>(std::move(stream_), shared_, out.stream_job, out.stream_team,
                                          out.stream_after_seq, std::move(places_), std::move(stream_slot))
          ->Start();
      return;
    }
    Respond(out.status, std::move(out.body), out.content_type, out.headers,
            req.keep_alive() && !places_.probe_only);
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
        self->WaitForRequest();
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
      stream_.expires_after(kLingerTime);
      Linger();
    }
  }

  // Lingering close: what the client still sends (the rest of a refused body)
  // is read and dropped until it closes or kLingerTime passes. Closing with
  // unread bytes would reset the connection, and the client could lose the
  // answer (or fail its write) before reading it.
  void Linger() {
    stream_.async_read_some(net::buffer(linger_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (!ec) self->Linger();
    });
  }
  static constexpr std::chrono::seconds kLingerTime{2};
  std::array<char, 4096> linger_{};

  Stream stream_;
  Shared* shared_;
  Places places_;
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
  TlsDetector(tcp::socket socket, Shared* shared, Places places)
      : stream_(std::move(socket)), shared_(shared), places_(std::move(places)) {}

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
                                              std::move(places_), std::move(buffer_))
          ->Start();
    } else {
      std::make_shared<Connection<beast::tcp_stream>>(std::move(stream_), shared_, std::move(places_),
                                                      std::move(buffer_), /*refuse_plaintext=*/true)
          ->Start();
    }
  }

  beast::tcp_stream stream_;
  Shared* shared_;
  Places places_;
  beast::flat_buffer buffer_;
};

}  // namespace

struct HttpServer::Impl {
  Impl(Daemon* daemon, HttpApi* api, HttpServerOptions options)
      : shared{daemon, api, options, nullptr},
        ioc(options.threads),
        accept_strand(net::make_strand(ioc)),
        acceptor(accept_strand),
        accept_timer(accept_strand) {
    shared.broadcaster = std::make_unique<Broadcaster>(daemon, api, shared.options, ioc);
  }
  ~Impl() { shared.broadcaster->DropExecutor(); }  // its strand and timers go before the io_context

  // One accept at a time (so accept_failing needs no lock). The acceptor and its
  // timer live on one strand: their handlers and Stop's close never run at once.
  void Accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (!acceptor.is_open() || ec == net::error::operation_aborted) return;
      if (ec) {  // EMFILE, ENFILE, ENOBUFS ...: back off instead of spinning on the error
        if (!accept_failing) {
          FT_LOG(WARN) << "http: accept failed: " << ec.message() << "; retrying every 100 ms";
        }
        accept_failing = true;
        accept_timer.expires_after(std::chrono::milliseconds(100));
        accept_timer.async_wait([this](beast::error_code wait_ec) {
          if (!wait_ec && acceptor.is_open()) Accept();
        });
        return;
      }
      if (accept_failing) {
        FT_LOG(INFO) << "http: accepting connections again";
        accept_failing = false;
      }
      Admit(std::move(socket));
      Accept();
    });
  }

  // Serves an accepted connection, or refuses it when its peer holds
  // max_connections_per_peer or the server is full (probe lane included).
  void Admit(tcp::socket socket) {
    beast::error_code ec;
    const tcp::endpoint remote = socket.remote_endpoint(ec);
    if (ec) return;  // gone already; the socket closes here
    const HttpServerOptions& o = shared.options;
    Places places;
    const std::string peer = PeerKey(remote.address());
    places.peer = PeerSlot::TryTake(&shared.peers, peer, o.max_connections_per_peer);
    if (!places.peer) {
      Refuse(std::move(socket), peer,
             "ftd serves at most " + std::to_string(o.max_connections_per_peer) +
                 " HTTP connections from one client address at once; close some or retry shortly",
             5);
      return;
    }
    places.connection = Slot::TryTake(&shared.connections, o.max_connections);
    if (!places.connection) {
      places.connection = Slot::TryTake(&shared.probes, o.probe_connections);
      places.probe_only = true;
    }
    if (!places.connection) {
      Refuse(std::move(socket), peer,
             "ftd serves at most " + std::to_string(o.max_connections) +
                 " HTTP connections at once; retry shortly",
             1);
    } else if (shared.tls) {
      std::make_shared<TlsDetector>(std::move(socket), &shared, std::move(places))->Start();
    } else {
      std::make_shared<Connection<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), &shared,
                                                      std::move(places))
          ->Start();
    }
  }

  // Answers 503 `error` on plaintext while fewer than kMaxRefusals are being
  // written, else (and always on HTTPS: no handshake for a client refused
  // anyway) just closes. Logs the first refusal and then at most one line a
  // minute with the count.
  void Refuse(tcp::socket socket, const std::string& peer, const std::string& error, int retry_after_s) {
    ++refused;
    const auto now = std::chrono::steady_clock::now();
    if (!refusal_logged || now - *refusal_logged >= std::chrono::minutes(1)) {
      FT_LOG(WARN) << "http: refused " << refused << " connection(s), the last from " << peer << ": "
                   << error;
      refused = 0;
      refusal_logged = now;
    }
    Slot slot = shared.tls ? Slot() : Slot::TryTake(&shared.refusals, kMaxRefusals);
    if (!slot) return;  // the socket closes here
    std::make_shared<Refusal>(std::move(socket), error, retry_after_s, std::move(slot))->Start();
  }

  Shared shared;  // first: outlives the io_context's handlers
  net::io_context ioc;
  net::strand<net::io_context::executor_type> accept_strand;
  tcp::acceptor acceptor;
  net::steady_timer accept_timer;
  bool accept_failing = false;
  int64_t refused = 0;  // refusals not logged yet (on the accept strand)
  std::optional<std::chrono::steady_clock::time_point> refusal_logged;  // the last refusal logged
  std::vector<std::thread> threads;
  std::string host;
  int port = 0;
  bool stopped = false;
};

namespace {

// The options' timeouts and caps, each named by its ftd flag when out of range.
Status CheckLimits(const HttpServerOptions& o) {
  if (o.threads < 1) return Status::InvalidArgument("http server: threads must be >= 1");
  for (const auto& [flag, ms] : {std::pair{"--http-header-timeout-ms", o.header_timeout_ms},
                                 std::pair{"--http-idle-timeout-ms", o.idle_timeout_ms}}) {
    if (ms < 1) {
      return Status::InvalidArgument(std::string(flag) + " " + std::to_string(ms) +
                                     ": must be at least 1 (ms)");
    }
  }
  if (o.max_connections < 1) {
    return Status::InvalidArgument("--http-max-connections " + std::to_string(o.max_connections) +
                                   ": must be at least 1");
  }
  if (o.max_connections_per_peer < 0) {
    return Status::InvalidArgument("--http-max-connections-per-peer " +
                                   std::to_string(o.max_connections_per_peer) +
                                   ": must be 0 (no cap) or more");
  }
  if (o.probe_connections < 0 || o.max_streams < 0) {
    return Status::InvalidArgument("http server: probe_connections and max_streams must be >= 0");
  }
  return Status::OK();
}

}  // namespace

std::string HttpPeerKey(const std::string& address) {
  beast::error_code ec;
  const net::ip::address a = net::ip::make_address(address, ec);
  return ec ? address : PeerKey(a);
}

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
  FT_RETURN_IF_ERROR(CheckLimits(options));
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
  net::post(impl_->accept_strand, [impl = impl_.get()] {  // after any accept handler running now
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->accept_timer.cancel();
  });
  impl_->shared.broadcaster->Stop();  // no daemon callback reaches the io_context after this
  impl_->ioc.stop();
  for (std::thread& t : impl_->threads) t.join();
}

const std::string& HttpServer::host() const { return impl_->host; }
int HttpServer::port() const { return impl_->port; }
int64_t HttpServer::open_streams() const { return impl_->shared.broadcaster->size(); }
int64_t HttpServer::open_connections() const { return impl_->shared.connections.load(); }
int64_t HttpServer::open_probe_connections() const { return impl_->shared.probes.load(); }
int64_t HttpServer::stream_summaries_built() const { return impl_->shared.broadcaster->summaries_built(); }
bool HttpServer::tls() const { return impl_->shared.tls != nullptr; }

}  // namespace ft
