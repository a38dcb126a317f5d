// The rendezvous store of a multi-rank job: a key-value map that rank 0
// serves over TCP and every rank (rank 0 included) reads and writes through a
// connection, behind Gloo's store interface (gloo::rendezvous::Store), so
// gloo::rendezvous::Context::connectFullMesh exchanges the ranks' addresses
// through it. Only the rendezvous goes through it; the collectives use Gloo's
// own transport.
//
// Protocol (one request, one reply, per message): a request is op (1 byte:
// 'S' set, 'G' get), key length (u32, little-endian), key, and for 'S' value
// length (u32) and value; the reply to 'S' is one byte 1, to 'G' a found byte
// and, when found, value length and value. get() and wait() poll until the
// keys exist or the timeout passes.
//
// Errors: Gloo's store interface has no Status, so failures throw
// gloo::IoException (what Gloo's own stores throw); ConnectGloo turns them
// into Status.
//
// Thread safety: the server runs its own threads; a TcpStore client is used
// by one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "engine/dist/collective.h"
#include "gloo/rendezvous/store.h"

namespace ft {

// The server side: a listening socket on `port` (all interfaces) and one
// thread per connection. Stops and joins in its destructor.
class TcpStoreServer {
 public:
  // InvalidArgument/Unavailable when the port cannot be bound.
  static StatusOr<std::unique_ptr<TcpStoreServer>> Start(int port);
  ~TcpStoreServer();
  int port() const { return port_; }

 private:
  TcpStoreServer() = default;
  void AcceptLoop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::map<std::string, std::vector<char>> data_;
  std::vector<int> clients_;
  std::vector<std::thread> threads_;
};

class TcpStore final : public gloo::rendezvous::Store {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start
  // later). Unavailable when it cannot.
  static StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& host, int port,
                                                     std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  TcpStore(int fd, std::chrono::milliseconds timeout) : fd_(fd), timeout_(timeout) {}
  // The value of `key` when the store has it.
  bool TryGet(const std::string& key, std::vector<char>* value);

  int fd_ = -1;
  std::chrono::milliseconds timeout_;
};

// The store of `spec`'s attempt: rank 0 serves it at spec.address, and every
// rank (rank 0 too) connects to it within spec.timeout. The server lives as
// long as the result.
struct StoreConnection {
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only
  std::unique_ptr<TcpStore> store;
};
StatusOr<StoreConnection> ConnectStore(const RendezvousSpec& spec);

}  // namespace ft
