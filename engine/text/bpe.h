// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}), as Hugging
// Face's tokenizers runs it: a word is split into characters (byte-level
// models: into bytes), then the adjacent pair with the lowest merge rank is
// merged, leftmost first, until no pair has a rank.
//
// Byte-level models (GPT-2, Llama 3, Qwen) work on raw bytes here: their vocab
// strings ("Ġthe") are decoded to bytes (" the") once at load, so encoding
// never builds byte-level strings. SentencePiece-style models (Llama 2,
// Mistral) work on UTF-8 characters, with byte_fallback (<0xXX> tokens for
// characters not in the vocab) and fuse_unk.
//
// Speed: merge ranks live in an open-addressing hash keyed by the id pair;
// merging uses a linked list of symbols and a binary heap; results for short
// words are cached (engine/text/bpe_cache.h).
//
// Thread safety: immutable after load except the internally locked cache.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/text/bpe_cache.h"

namespace ft {

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object; `byte_level`: the
  // pre-tokenizer maps bytes to the GPT-2 alphabet (so the vocab is byte-level).
  // `where` prefixes error messages ("<file>: model").
  static StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model, bool byte_level,
                                                      const std::string& where);

  // Appends the tokens of one pre-token (raw bytes for a byte-level model,
  // UTF-8 otherwise). Their lens add up to word.size().
  void Encode(std::string_view word, std::vector<BpeToken>* out) const;

  // Vocab string of `id` as written in tokenizer.json, or nullptr.
  const std::string* IdToToken(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  bool byte_level() const { return byte_level_; }
  const std::optional<std::string>& unk_token() const { return unk_token_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  // Open-addressing map (id pair) -> (rank, merged id).
  struct MergeEntry {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~0ull;

  BpeModel() = default;
  Status LoadVocab(const nlohmann::json& vocab, const std::string& where);
  Status LoadMerges(const nlohmann::json& merges, const std::string& where);
  void InsertMerge(int32_t left, int32_t right, int32_t rank, int32_t merged);
  const MergeEntry* FindMerge(int32_t left, int32_t right) const;
  // Key of a vocab string in model space (raw bytes for byte-level models).
  bool ModelKey(std::string_view token, std::string* key) const;

  void EncodeCached(std::string_view word, std::vector<BpeToken>* out) const;
  void EncodeUncached(std::string_view word, std::vector<BpeToken>* out) const;
  void FindWordCuts(const nlohmann::json& merges);
  void InitialSymbols(std::string_view word, std::vector<BpeToken>* symbols) const;
  void MergeSymbols(std::vector<BpeToken>* symbols) const;

  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::optional<std::string> unk_token_;
  int32_t unk_id_ = -1;

  StringMap vocab_;          // model-space key -> id
  StringMap vocab_strings_;  // tokenizer.json string -> id
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  std::vector<int32_t> char_ids_;   // id of each single-character token by code point; -1 when absent
  int32_t byte_ids_[256];           // byte-level: id of each byte; -1 when absent
  int32_t fallback_ids_[256];       // <0xXX> token ids; -1 when absent
  std::vector<MergeEntry> merges_;  // power-of-two size
  uint64_t merge_mask_ = 0;
  // SentencePiece-style models get one "word" per text section, often
  // thousands of characters. When no merge can join a character c to a
  // following U+2581 (the metaspace), the word is cut before every such
  // U+2581 without changing the result, and the pieces are cached like words.
  bool cut_before_metaspace_ = false;
  std::vector<uint32_t> joins_metaspace_;  // sorted characters c that can join a following U+2581

  mutable BpeCache cache_;
};

}  // namespace ft
