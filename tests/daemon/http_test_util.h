// Test helpers for ftd's HTTP side: a real HTTP client (Boost.Beast, one
// connection per request) and a raw SSE reader with a deadline.
//
// Fetch() returns status -1 and the error in `body` when the connection or
// the exchange fails. SseReader::ReadUntil returns whether the text it read
// so far contains `needle` before the deadline.
#pragma once

#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ft::http_test {

struct Reply {
  int status = -1;
  std::map<std::string, std::string> headers;  // names as sent
  std::string body;
};

inline Reply Fetch(int port, const std::string& method, const std::string& target,
                   const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  namespace net = boost::asio;
  Reply out;
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  stream.socket().connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
  if (ec) {
    out.body = "connect: " + ec.message();
    return out;
  }
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
    std::string req = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n";
    for (const std::string& h : header_lines) req += h + "\r\n";
    req += "\r\n";
    boost::system::error_code ec;
    boost::asio::write(socket_, boost::asio::buffer(req), ec);
    return !ec;
  }
  // Reads until the text so far contains `needle` (true) or `timeout` passes (false).
  bool ReadUntil(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    timeval tv{0, 100'000};  // short blocking reads, so the deadline is checked
    setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    while (text_.find(needle) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      char buf[4096];
      const ssize_t n = recv(socket_.native_handle(), buf, sizeof(buf), 0);
      if (n == 0) {
        closed_ = true;
        return text_.find(needle) != std::string::npos;
      }
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
  bool connected_ = false;
  bool closed_ = false;
  std::string text_;
};

}  // namespace ft::http_test
