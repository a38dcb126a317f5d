#include "engine/text/bpe_cache.h"

#include <cstring>
#include <functional>

namespace ft {

BpeCache::BpeCache() : shards_(std::make_unique<Shard[]>(kShards)) {
  for (size_t s = 0; s < kShards; ++s) shards_[s].slots.resize(kSlots);
}

uint64_t BpeCache::Hash(std::string_view word) { return std::hash<std::string_view>{}(word) | (1ull << 63); }

bool BpeCache::Lookup(std::string_view word, uint64_t hash, std::vector<BpeToken>* out) const {
  Shard& shard = shards_[hash % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  for (size_t i = (hash >> 8) & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
    const Slot& slot = shard.slots[i];
    if (slot.hash == 0) return false;
    const char* key = shard.arena.data() + slot.offset;
    if (slot.hash == hash && slot.key_len == word.size() && std::memcmp(key, word.data(), word.size()) == 0) {
      const size_t at = out->size();
      out->resize(at + slot.n_tokens);
      std::memcpy(out->data() + at, key + slot.key_len, slot.n_tokens * sizeof(BpeToken));
      return true;
    }
  }
}

void BpeCache::Insert(std::string_view word, uint64_t hash, const BpeToken* tokens, size_t n) {
  if (word.size() > kMaxWordBytes || n > word.size()) return;
  Shard& shard = shards_[hash % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.entries >= kMaxEntries || shard.arena.size() >= kMaxArena) {
    std::fill(shard.slots.begin(), shard.slots.end(), Slot{});
    shard.arena.clear();
    shard.entries = 0;
  }
  size_t i = (hash >> 8) & (kSlots - 1);
  for (; shard.slots[i].hash != 0; i = (i + 1) & (kSlots - 1)) {
    const Slot& slot = shard.slots[i];
    if (slot.hash == hash && slot.key_len == word.size() &&
        std::memcmp(shard.arena.data() + slot.offset, word.data(), word.size()) == 0) {
      return;  // another thread got there first
    }
  }
  Slot& slot = shard.slots[i];
  slot = {hash, static_cast<uint32_t>(shard.arena.size()), static_cast<uint16_t>(word.size()),
          static_cast<uint16_t>(n)};
  shard.arena.insert(shard.arena.end(), word.begin(), word.end());
  const auto* bytes = reinterpret_cast<const char*>(tokens);
  shard.arena.insert(shard.arena.end(), bytes, bytes + n * sizeof(BpeToken));
  ++shard.entries;
}

}  // namespace ft
