// A bounded, thread-safe cache of word -> BPE tokens, so frequent words skip
// the merge loop. Sharded (a mutex each); each shard is an open-addressing
// table over one byte arena, so a lookup touches two cache lines, not a chain
// of heap nodes. A full shard starts over empty: memory stays bounded and hot
// words return at once.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

namespace ft {

struct BpeToken {
  int32_t id = 0;
  uint32_t len = 0;  // bytes of the word this token covers
};

class BpeCache {
 public:
  static constexpr size_t kMaxWordBytes = 255;  // longer words are not cached

  BpeCache();
  static uint64_t Hash(std::string_view word);
  // Appends the cached tokens of `word` (hash from Hash()) and returns true;
  // false when absent.
  bool Lookup(std::string_view word, uint64_t hash, std::vector<BpeToken>* out) const;
  void Insert(std::string_view word, uint64_t hash, const BpeToken* tokens, size_t n);

 private:
  static constexpr size_t kShards = 16;
  static constexpr size_t kSlots = 8192;       // per shard, a power of two
  static constexpr size_t kMaxEntries = 4096;  // load factor <= 1/2
  static constexpr size_t kMaxArena = 4u << 20;

  struct Slot {
    uint64_t hash = 0;  // 0: empty (stored hashes have the top bit set)
    uint32_t offset = 0;
    uint16_t key_len = 0;
    uint16_t n_tokens = 0;
  };
  struct Shard {
    std::mutex mu;
    std::vector<Slot> slots;
    std::vector<char> arena;  // key bytes then tokens, per entry
    size_t entries = 0;
  };

  std::unique_ptr<Shard[]> shards_;
};

}  // namespace ft
