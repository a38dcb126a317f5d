// Test helper: a tiny HTTP server on 127.0.0.1 (an ephemeral port) standing
// in for a cloud metadata service.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace ft::worker::testing_util {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// A one-connection-at-a-time HTTP server; `handler` answers (status, body).
class FakeHttpServer {
 public:
  using Request = boost::beast::http::request<boost::beast::http::string_body>;
  using Handler = std::function<std::pair<int, std::string>(const Request&)>;

  explicit FakeHttpServer(Handler handler)
      : handler_(std::move(handler)), acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeHttpServer() {
    stop_ = true;
    beast::error_code ec;
    tcp::socket poke(io_);  // unblocks accept()
    poke.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_), ec);
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void set_handler(Handler h) {
    std::lock_guard<std::mutex> lock(mu_);
    handler_ = std::move(h);
  }
  int requests() const { return requests_; }

 private:
  void Serve() {
    while (!stop_) {
      tcp::socket socket(io_);
      beast::error_code ec;
      acceptor_.accept(socket, ec);
      if (ec || stop_) return;
      beast::flat_buffer buffer;
      Request req;
      http::read(socket, buffer, req, ec);
      if (ec) continue;
      ++requests_;
      std::pair<int, std::string> answer;
      {
        std::lock_guard<std::mutex> lock(mu_);
        answer = handler_(req);
      }
      http::response<http::string_body> res{static_cast<http::status>(answer.first), 11};
      res.body() = answer.second;
      res.prepare_payload();
      http::write(socket, res, ec);
      socket.shutdown(tcp::socket::shutdown_both, ec);
    }
  }

  std::mutex mu_;
  Handler handler_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

}  // namespace ft::worker::testing_util
