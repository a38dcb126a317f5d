// Test helpers for ftd's HTTP side: a real HTTP client (Boost.Beast, one
// connection per request) and a raw SSE reader with a deadline, each over
// plaintext or TLS (FetchTls, TlsSseReader: trusting only `ca_file` and
// checking that the server's certificate names 127.0.0.1).
//
// Fetch()/FetchTls()/FetchFrom() return status -1 and the error in `body` when the
// connection, the TLS handshake or the exchange fails. ReadUntil returns
// whether the text read so far contains `needle` before the deadline.
#pragma once

#include <sys/socket.h>
#include <sys/time.h>

#include <array>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ft::http_test {

struct Reply {
  int status = -1;
  std::map<std::string, std::string> headers;  // names as sent
  std::string body;
};

// One request and its response on a connected (and, for TLS, handshaken) stream.
template <class Stream>
Reply Exchange(Stream& stream, const std::string& method, const std::string& target,
               const std::vector<std::pair<std::string, std::string>>& headers) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  Reply out;
  beast::error_code ec;
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  if (req.method() == http::verb::unknown) req.method_string(method);
  req.set(http::field::host, "127.0.0.1");
  for (const auto& [name, value] : headers) req.set(name, value);
  req.prepare_payload();
  http::write(stream, req, ec);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  if (!ec) http::read(stream, buffer, res, ec);
  if (ec) {
    out.body = "exchange: " + ec.message();
    return out;
  }
  out.status = static_cast<int>(res.result_int());
  for (const auto& field : res) out.headers[std::string(field.name_string())] = std::string(field.value());
  out.body = res.body();
  return out;
}

inline Reply Fetch(int port, const std::string& method, const std::string& target,
                   const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  namespace net = boost::asio;
  net::io_context ioc;
  boost::beast::tcp_stream stream(ioc);
  boost::beast::error_code ec;
  stream.socket().connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
  if (ec) return Reply{-1, {}, "connect: " + ec.message()};
  return Exchange(stream, method, target, headers);
}

// One GET from the source address `from` (Linux routes all of 127/8 to the
// loopback, so 127.0.0.2 is a second client address), given up after `timeout`
// (status -1, the error in `body`).
inline Reply FetchFrom(const std::string& from, int port, const std::string& target,
                       std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  namespace net = boost::asio;
  namespace beast = boost::beast;
  namespace http = beast::http;
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  stream.socket().open(net::ip::tcp::v4(), ec);
  if (!ec) stream.socket().bind({net::ip::make_address(from), 0}, ec);
  if (ec) return Reply{-1, {}, "bind " + from + ": " + ec.message()};
  http::request<http::empty_body> req(http::verb::get, target, 11);
  req.set(http::field::host, "127.0.0.1");
  http::response<http::string_body> res;
  beast::flat_buffer buffer;
  Reply out{-1, {}, "no answer within the timeout"};
  auto fail = [&](const char* step, beast::error_code e) {
    out.body = std::string(step) + ": " + e.message();
  };
  stream.expires_after(timeout);
  stream.async_connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)},
                       [&](beast::error_code e) {
                         if (e) return fail("connect", e);
                         http::async_write(stream, req, [&](beast::error_code e2, size_t) {
                           if (e2) return fail("write", e2);
                           http::async_read(stream, buffer, res, [&](beast::error_code e3, size_t) {
                             if (e3) return fail("read", e3);
                             out.status = static_cast<int>(res.result_int());
                             for (const auto& f : res)
                               out.headers[std::string(f.name_string())] = std::string(f.value());
                             out.body = res.body();
                           });
                         });
                       });
  ioc.run();
  return out;
}

// A TLS client context trusting only `ca_file` ("" = the system's roots).
inline boost::asio::ssl::context TlsClientContext(const std::string& ca_file) {
  namespace ssl = boost::asio::ssl;
  ssl::context ctx(ssl::context::tls_client);
  boost::system::error_code ec;
  if (ca_file.empty()) {
    ctx.set_default_verify_paths(ec);
  } else {
    ctx.load_verify_file(ca_file, ec);
  }
  ctx.set_verify_mode(ssl::verify_peer);
  return ctx;
}

inline Reply FetchTls(int port, const std::string& ca_file, const std::string& method,
                      const std::string& target,
                      const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  namespace net = boost::asio;
  net::io_context ioc;
  net::ssl::context ctx = TlsClientContext(ca_file);
  boost::beast::ssl_stream<boost::beast::tcp_stream> stream(ioc, ctx);
  stream.set_verify_callback(net::ssl::host_name_verification("127.0.0.1"));
  boost::beast::error_code ec;
  boost::beast::get_lowest_layer(stream).socket().connect(
      {net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
  if (ec) return Reply{-1, {}, "connect: " + ec.message()};
  stream.handshake(net::ssl::stream_base::client, ec);
  if (ec) return Reply{-1, {}, "TLS handshake: " + ec.message()};
  return Exchange(stream, method, target, headers);
}

// The request line and headers an SSE client sends.
inline std::string SseRequest(const std::string& target, const std::vector<std::string>& header_lines) {
  std::string req = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n";
  for (const std::string& h : header_lines) req += h + "\r\n";
  return req + "\r\n";
}

// Reads an SSE stream through a raw socket (the stream never ends by itself).
class SseReader {
 public:
  explicit SseReader(int port) : socket_(ioc_) {
    boost::system::error_code ec;
    socket_.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
    connected_ = !ec;
  }
  bool connected() const { return connected_; }
  // Sends a GET with the extra header lines ("Name: value").
  bool Get(const std::string& target, const std::vector<std::string>& header_lines = {}) {
    boost::system::error_code ec;
    boost::asio::write(socket_, boost::asio::buffer(SseRequest(target, header_lines)), ec);
    return !ec;
  }
  ~SseReader() { StopDraining(); }
  // A client that keeps up: a thread reads everything as it arrives, so the
  // server never sees a backlog from it however loaded the machine is (the
  // test thread would otherwise read only between its own steps).
  // ReadUntil then waits for the thread's text. Call it after Get: the socket is then only read.
  void KeepDraining() {
    timeval tv{0, 100'000};  // short blocking reads, so a stop is seen
    setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    drainer_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!stop_ && !closed_) {
        lock.unlock();
        char buf[65536];
        const ssize_t n = recv(socket_.native_handle(), buf, sizeof(buf), 0);
        lock.lock();
        if (n > 0) text_.append(buf, static_cast<size_t>(n));
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) closed_ = true;
        if (n != 0) changed_.notify_all();
        if (closed_) changed_.notify_all();
      }
    });
  }
  // Reads until the text so far contains `needle` (true) or `timeout` passes (false).
  bool ReadUntil(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (drainer_.joinable()) {
      std::unique_lock<std::mutex> lock(mu_);
      size_t from = 0;  // only new text is searched again
      const auto found = [&] {
        if (text_.find(needle, from) != std::string::npos) return true;
        from = text_.size() >= needle.size() ? text_.size() - needle.size() + 1 : 0;
        return false;
      };
      return changed_.wait_until(lock, deadline, [&] { return found() || closed_; }) && found();
    }
    timeval tv{0, 100'000};  // short blocking reads, so the deadline is checked
    setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    size_t from = 0;  // only new text is searched again (streams may carry megabytes)
    while (text_.find(needle, from) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      char buf[4096];
      const ssize_t n = recv(socket_.native_handle(), buf, sizeof(buf), 0);
      if (n == 0) {
        closed_ = true;
        return text_.find(needle, from) != std::string::npos;
      }
      from = text_.size() >= needle.size() ? text_.size() - needle.size() + 1 : 0;
      if (n > 0) text_.append(buf, static_cast<size_t>(n));
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {  // reset by the server
        closed_ = true;
        return false;
      }
    }
    return true;
  }
  // Whether the server closed the connection (reads until EOF or `timeout`).
  bool WaitClosed(std::chrono::milliseconds timeout) {
    ReadUntil("\x01never\x01", timeout);
    return closed_;
  }
  const std::string& text() const { return text_; }
  boost::asio::ip::tcp::socket& socket() { return socket_; }

 private:
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::socket socket_;
  void StopDraining() {
    if (!drainer_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    drainer_.join();  // its reads time out within 100 ms (SO_RCVTIMEO)
  }

  bool connected_ = false;
  bool closed_ = false;
  std::string text_;
  std::mutex mu_;  // guards text_, closed_ and stop_ while drainer_ runs
  std::condition_variable changed_;
  bool stop_ = false;
  std::thread drainer_;
};

// Reads an SSE stream over TLS (asynchronous reads run for at most the deadline).
class TlsSseReader {
 public:
  TlsSseReader(int port, const std::string& ca_file) : ctx_(TlsClientContext(ca_file)), stream_(ioc_, ctx_) {
    namespace net = boost::asio;
    stream_.set_verify_callback(net::ssl::host_name_verification("127.0.0.1"));
    boost::system::error_code ec;
    stream_.next_layer().connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
    if (!ec) stream_.handshake(net::ssl::stream_base::client, ec);
    connected_ = !ec;
  }
  bool connected() const { return connected_; }
  bool Get(const std::string& target, const std::vector<std::string>& header_lines = {}) {
    boost::system::error_code ec;
    boost::asio::write(stream_, boost::asio::buffer(SseRequest(target, header_lines)), ec);
    return !ec;
  }
  bool ReadUntil(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (text_.find(needle) == std::string::npos) {
      if (closed_ || std::chrono::steady_clock::now() > deadline) return false;
      if (!reading_) {
        reading_ = true;
        stream_.async_read_some(boost::asio::buffer(buf_), [this](boost::system::error_code ec, size_t n) {
          reading_ = false;
          if (ec) {
            closed_ = true;
          } else {
            text_.append(buf_.data(), n);
          }
        });
      }
      ioc_.restart();
      ioc_.run_for(std::chrono::milliseconds(50));
    }
    return true;
  }
  const std::string& text() const { return text_; }

 private:
  boost::asio::io_context ioc_;
  boost::asio::ssl::context ctx_;
  boost::asio::ssl::stream<boost::asio::ip::tcp::socket> stream_;
  bool connected_ = false;
  bool reading_ = false;
  bool closed_ = false;
  std::array<char, 4096> buf_{};
  std::string text_;
};

}  // namespace ft::http_test
