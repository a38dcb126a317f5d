// ftd's HTTP server (Boost.Beast over one Asio io_context with a small fixed
// thread pool): keep-alive HTTP/1.1 connections whose requests go to
// HttpApi::Handle, and Server-Sent Events streams for GET /api/stream.
//
// SSE fan-out: one broadcaster per server subscribes once to the daemon's
// live updates (Daemon::Subscribe(""), while at least one stream is open),
// serializes each update once and posts the same text to every stream that
// wants it (streams of one job get only that job's), so the cost per update
// does not grow with the number of open dashboards:
//   event: job      a JobSummary for each job the daemon published or whose
//                   progress moved (metrics arrived), coalesced by job id and
//                   built at most once per stream period for all streams
//                   together (one sparkline query for the changed jobs)
//   event: event    an Event, with "id: <seq>" (Last-Event-ID replays after it)
//   event: metric   {"job_id", step, loss, ...}
//   event: workers  {"workers": [...]}, polled once per period for all streams,
//                   sent when changed (streams of every job only)
//   ": keepalive"   a comment after keepalive_ms without other output.
// The daemon's callback only posts to the broadcaster's strand. Each stream's
// backlog (text posted to it and not yet written to its socket) is bounded
// by stream_max_bytes: a slow or stalled client past it is disconnected (it
// reconnects with Last-Event-ID), so a client can never block the daemon or
// the other streams.
//
// Limits (docs/OPERATIONS.md, "Limits on input"): at most max_connections
// connections (SSE streams included), of which at most max_connections_per_peer
// from one client address (HttpPeerKey), and max_streams SSE streams at once.
// A connection over a connection cap is answered 503 with Retry-After and
// closed at once, taking no one's slot (an HTTPS one is closed before the
// handshake; past 64 refusals in flight, plaintext ones are closed too); a
// stream over max_streams gets 503 with a JSON error. Refusals are logged at
// most once a minute with their count.
//
// Probes: when max_connections are taken, probe_connections more are kept for
// GET /healthz and GET /ready (the probe lane): a connection taken there gets
// only those (anything else is answered 503), one request each, so a server
// full of slow clients still answers a liveness probe.
//
// Deadlines: a request's header and body must arrive within
// header_timeout_ms, counted from the connection's start (after the TLS
// handshake) for its first request and from its first byte for the next ones;
// a keep-alive connection waits at most idle_timeout_ms for a next request. A
// client past either (one that trickles its header byte by byte: slow-loris)
// is closed without an answer, freeing its slots.
//
// An accept error (EMFILE ...) is logged once and accepting is retried every
// 100 ms until it works again.
//
// HTTPS: with tls_cert_file and tls_key_file (ftd's --tls-cert/--tls-key) every
// connection is TLS 1.2+ (SSE streams too); a plaintext request to that port is
// answered 400 "this port serves HTTPS" and closed, and a failed handshake just
// closes its connection. Without them the server speaks plaintext HTTP.
//
// Start() fails (InvalidArgument for a malformed address, a timeout under
// 1 ms, max_connections under 1, a negative per-peer or probe cap, or an
// unusable certificate/key, naming ftd's flag; Unavailable when it cannot
// bind) before anything is served. Stop() (also run by the destructor) ends
// every subscription, closes the connections and joins the threads.
//
// Thread safety: Start/Stop from one thread; port() from any.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "daemon/daemon.h"
#include "daemon/http_api.h"

namespace ft {

struct HttpServerOptions {
  std::string address = "127.0.0.1:7071";  // HOST:PORT; port 0 picks a free port
  int threads = 2;                         // io threads (the machine may have only 2 cores)
  int64_t header_timeout_ms = 10'000;      // a request's header and body must arrive within this
  int64_t idle_timeout_ms = 60'000;  // a keep-alive connection silent this long between requests is closed
  int64_t keepalive_ms = 15'000;     // SSE comment when a stream has been quiet this long
  int64_t stream_period_ms = 1'000;  // SSE: progress summaries and workers at most this often
  int64_t stream_max_bytes = int64_t{4}
                             << 20;       // SSE: text waiting for one client's socket before it is dropped
  int64_t max_connections = 512;          // open connections (SSE streams included); beyond: 503
  int64_t max_connections_per_peer = 64;  // of them from one client address (HttpPeerKey); 0 = no cap
  int64_t probe_connections = 8;          // beyond max_connections: for GET /healthz and /ready only
  int64_t max_streams = 128;              // open SSE streams; beyond: 503
  std::string tls_cert_file;              // PEM certificate chain: serve HTTPS ("" = plaintext)
  std::string tls_key_file;               // its PEM private key
  int64_t tls_handshake_timeout_ms =
      10'000;  // a client that has not finished TLS setup (or shutdown) by then is closed
};

// The client address connections are counted under for max_connections_per_peer:
// an IPv4 address (an IPv4-mapped IPv6 one too) as itself ("10.0.0.7"), an IPv6
// address as its /64 ("2001:db8:1:2::/64": one host's many addresses), anything
// that is not an address unchanged.
std::string HttpPeerKey(const std::string& address);

class HttpServer {
 public:
  // `daemon` and `api` must outlive the server.
  static StatusOr<std::unique_ptr<HttpServer>> Start(Daemon* daemon, HttpApi* api, HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void Stop();
  const std::string& host() const;         // as given in the address ("127.0.0.1")
  int port() const;                        // the bound port
  int64_t open_streams() const;            // SSE streams currently attached to the broadcaster
  int64_t open_connections() const;        // connections currently counted against max_connections
  int64_t open_probe_connections() const;  // connections currently in the probe lane
  // For tests: JobSummaries built for the streams since start (one per changed job per period).
  int64_t stream_summaries_built() const;
  bool tls() const;  // whether it serves HTTPS

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft
