#include "engine/dist/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gloo/common/error.h"

namespace ft {
namespace {

constexpr std::chrono::milliseconds kPoll{10};

// Whole reads and writes; false when the peer is gone.
bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteBytes(int fd, const char* p, size_t n) {
  const uint32_t len = static_cast<uint32_t>(n);  // little-endian hosts only (x86-64, aarch64)
  return WriteAll(fd, &len, sizeof(len)) && WriteAll(fd, p, n);
}

bool ReadBytes(int fd, std::vector<char>* out) {
  uint32_t len = 0;
  if (!ReadAll(fd, &len, sizeof(len))) return false;
  if (len > (64u << 20)) return false;  // a rendezvous value is an address, never megabytes
  out->resize(len);
  return ReadAll(fd, out->data(), len);
}

}  // namespace

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(int port) {
  if (port <= 0 || port > 65535) return Status::InvalidArgument("store port " + std::to_string(port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(std::string("store: socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 64) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::Unavailable("store: cannot listen on port " + std::to_string(port) + ": " + why);
  }
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  s->listen_fd_ = fd;
  s->port_ = port;
  s->acceptor_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);
  }
  for (std::thread& t : threads_) t.join();
  for (int fd : clients_) ::close(fd);
}

void TcpStoreServer::AcceptLoop() {
  while (!stopping_) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // closed by the destructor
    }
    std::lock_guard<std::mutex> lock(mu_);
    clients_.push_back(fd);
    threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  for (;;) {
    char op = 0;
    std::vector<char> key;
    if (!ReadAll(fd, &op, 1) || !ReadBytes(fd, &key)) return;
    const std::string k(key.begin(), key.end());
    if (op == 'S') {
      std::vector<char> value;
      if (!ReadBytes(fd, &value)) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        data_[k] = std::move(value);
      }
      const char ok = 1;
      if (!WriteAll(fd, &ok, 1)) return;
    } else if (op == 'G') {
      std::vector<char> value;
      char found = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = data_.find(k);
        if (it != data_.end()) {
          found = 1;
          value = it->second;
        }
      }
      if (!WriteAll(fd, &found, 1)) return;
      if (found && !WriteBytes(fd, value.data(), value.size())) return;
    } else {
      return;  // not our protocol: drop the connection
    }
  }
}

StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port,
                                                      std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return Status::Unavailable("store " + host + ":" + std::to_string(port) + ": " + ::gai_strerror(rc));
  }
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::string why;
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      ::freeaddrinfo(res);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return std::unique_ptr<TcpStore>(new TcpStore(fd, timeout));
    }
    why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    if (std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(kPoll * 5);  // rank 0 may not listen yet
  }
  ::freeaddrinfo(res);
  return Status::Unavailable("store " + host + ":" + std::to_string(port) + ": cannot connect within " +
                             std::to_string(timeout.count()) + " ms (is rank 0 running?): " + why);
}

TcpStore::~TcpStore() { ::close(fd_); }

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  const char op = 'S';
  char ok = 0;
  if (!WriteAll(fd_, &op, 1) || !WriteBytes(fd_, key.data(), key.size()) ||
      !WriteBytes(fd_, data.data(), data.size()) || !ReadAll(fd_, &ok, 1)) {
    GLOO_THROW_IO_EXCEPTION("rendezvous store: set '", key, "': connection to rank 0 lost");
  }
}

bool TcpStore::TryGet(const std::string& key, std::vector<char>* value) {
  const char op = 'G';
  char found = 0;
  if (!WriteAll(fd_, &op, 1) || !WriteBytes(fd_, key.data(), key.size()) || !ReadAll(fd_, &found, 1) ||
      (found && !ReadBytes(fd_, value))) {
    GLOO_THROW_IO_EXCEPTION("rendezvous store: get '", key, "': connection to rank 0 lost");
  }
  return found != 0;
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key});
  std::vector<char> value;
  TryGet(key, &value);
  return value;
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::vector<char> ignored;
  for (const std::string& key : keys) {
    while (!TryGet(key, &ignored)) {
      if (std::chrono::steady_clock::now() >= until) {
        GLOO_THROW_IO_EXCEPTION("rendezvous store: '", key, "' did not appear within ", timeout.count(),
                                " ms (a rank did not arrive)");
      }
      std::this_thread::sleep_for(kPoll);
    }
  }
}

StatusOr<StoreConnection> ConnectStore(const RendezvousSpec& spec) {
  std::string host;
  int port = 0;
  FT_RETURN_IF_ERROR(ParseHostPort(spec.address, "rendezvous address", &host, &port));
  StoreConnection c;
  if (spec.rank == 0) {
    FT_ASSIGN_OR_RETURN(c.server, TcpStoreServer::Start(port));
  }
  FT_ASSIGN_OR_RETURN(c.store, TcpStore::Connect(host, port, spec.timeout));
  return c;
}

}  // namespace ft
