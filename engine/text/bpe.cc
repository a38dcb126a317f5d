#include "engine/text/bpe.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/utf8.h"
#include "engine/text/unicode_text.h"

namespace ft {
namespace {

using nlohmann::json;

// A field that must be absent, null, or one of the given "no-op" values.
Status RequireUnsetOrEmptyString(const json& model, const char* field, const std::string& where) {
  auto it = model.find(field);
  if (it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty())) {
    return Status::OK();
  }
  return Status::Unimplemented(where + "." + field + " = " + it->dump() +
                               " is not supported (only null or \"\")");
}

StatusOr<bool> OptionalBool(const json& model, const char* field, const std::string& where) {
  auto it = model.find(field);
  if (it == model.end() || it->is_null()) return false;
  if (!it->is_boolean()) return Status::InvalidArgument(where + "." + field + " must be a boolean");
  return it->get<bool>();
}

// Splits a merge entry ("a b" or ["a", "b"]) into its two tokens.
bool ParseMerge(const json& m, std::string* left, std::string* right) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) return false;
    *left = s.substr(0, space);
    *right = s.substr(space + 1);
    return true;
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    *left = m[0].get<std::string>();
    *right = m[1].get<std::string>();
    return true;
  }
  return false;
}

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // 0: merged into its left neighbour
};

struct Candidate {
  int32_t rank;
  int32_t pos;  // index of the left symbol: leftmost wins ties
  int32_t left_id;
  int32_t right_id;
  int32_t merged;
};

struct LaterCandidate {  // makes std::*_heap a min-heap on (rank, pos)
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const json& model, bool byte_level,
                                                       const std::string& where) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->byte_level_ = byte_level;
  auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return Status::Unimplemented(where + ".dropout = " + dropout->dump() +
                                 " is not supported (BPE dropout is random; use null)");
  }
  FT_RETURN_IF_ERROR(RequireUnsetOrEmptyString(model, "continuing_subword_prefix", where));
  FT_RETURN_IF_ERROR(RequireUnsetOrEmptyString(model, "end_of_word_suffix", where));
  FT_ASSIGN_OR_RETURN(m->byte_fallback_, OptionalBool(model, "byte_fallback", where));
  FT_ASSIGN_OR_RETURN(m->fuse_unk_, OptionalBool(model, "fuse_unk", where));
  FT_ASSIGN_OR_RETURN(m->ignore_merges_, OptionalBool(model, "ignore_merges", where));
  auto unk = model.find("unk_token");
  if (unk != model.end() && !unk->is_null()) {
    if (!unk->is_string()) return Status::InvalidArgument(where + ".unk_token must be a string or null");
    m->unk_token_ = unk->get<std::string>();
  }
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return Status::InvalidArgument(where + ".vocab must be an object mapping token strings to ids");
  }
  FT_RETURN_IF_ERROR(m->LoadVocab(*vocab, where + ".vocab"));
  if (m->unk_token_) {
    auto it = m->vocab_strings_.find(*m->unk_token_);
    if (it == m->vocab_strings_.end()) {
      return Status::InvalidArgument(where + ".unk_token '" + *m->unk_token_ + "' is not in the vocab");
    }
    m->unk_id_ = it->second;
  }
  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return Status::InvalidArgument(where + ".merges must be an array of \"a b\" strings or [a, b] pairs");
  }
  FT_RETURN_IF_ERROR(m->LoadMerges(*merges, where + ".merges"));
  m->FindWordCuts(*merges);
  return m;
}

bool BpeModel::ModelKey(std::string_view token, std::string* key) const {
  if (byte_level_) return text::ByteLevelToBytes(token, key);
  key->assign(token);
  return true;
}

Status BpeModel::LoadVocab(const json& vocab, const std::string& where) {
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX) {
      return Status::InvalidArgument(where + "['" + it.key() + "'] must be a non-negative integer id");
    }
    max_id = std::max(max_id, it->get<int64_t>());
  }
  // Ids index dense tables: refuse absurdly sparse ones rather than allocate gigabytes.
  if (max_id >= static_cast<int64_t>(vocab.size()) + (1 << 24)) {
    return Status::InvalidArgument(where + ": id " + std::to_string(max_id) +
                                   " is far beyond the vocab size " + std::to_string(vocab.size()));
  }
  id_to_token_.assign(max_id + 1, std::string());
  has_token_.assign(max_id + 1, false);
  vocab_strings_.reserve(vocab.size());
  vocab_.reserve(vocab.size());
  std::string key;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto id = it->get<int32_t>();
    id_to_token_[id] = it.key();
    has_token_[id] = true;
    vocab_strings_[it.key()] = id;
    // A byte-level token outside the GPT-2 alphabet can never be produced.
    if (ModelKey(it.key(), &key)) vocab_[key] = id;
  }
  for (const auto& [key, id] : vocab_) {
    size_t i = 0;
    if (byte_level_ || key.empty() ||
        static_cast<size_t>(text::Utf8SeqLength(static_cast<uint8_t>(key[0]))) != key.size()) {
      continue;
    }
    const uint32_t cp = text::NextCodePoint(key, &i);
    if (cp >= char_ids_.size()) char_ids_.resize(cp + 1, -1);
    char_ids_[cp] = id;
  }
  char hex[8];
  for (int b = 0; b < 256; ++b) {
    auto bit = vocab_.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    byte_ids_[b] = byte_level_ && bit != vocab_.end() ? bit->second : -1;
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    auto fit = vocab_strings_.find(std::string_view(hex));
    fallback_ids_[b] = fit != vocab_strings_.end() ? fit->second : -1;
  }
  return Status::OK();
}

Status BpeModel::LoadMerges(const json& merges, const std::string& where) {
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  merges_.assign(cap, MergeEntry{});
  merge_mask_ = cap - 1;
  std::string left, right, left_key, right_key;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!ParseMerge(merges[i], &left, &right)) {
      return Status::InvalidArgument(at + " = " + merges[i].dump() + " is not \"a b\" or [\"a\", \"b\"]");
    }
    if (!ModelKey(left, &left_key) || !ModelKey(right, &right_key)) {
      return Status::InvalidArgument(at + ": '" + left + " " + right + "' is not in the byte-level alphabet");
    }
    auto l = vocab_.find(left_key), r = vocab_.find(right_key), merged = vocab_.find(left_key + right_key);
    if (l == vocab_.end() || r == vocab_.end() || merged == vocab_.end()) {
      const std::string& missing = l == vocab_.end() ? left : r == vocab_.end() ? right : left + right;
      return Status::InvalidArgument(at + ": token '" + missing + "' is not in the vocab");
    }
    InsertMerge(l->second, r->second, static_cast<int32_t>(i), merged->second);
  }
  return Status::OK();
}

namespace {
inline uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
inline uint64_t MixKey(uint64_t key) {
  key ^= key >> 29;
  key *= 0xbf58476d1ce4e5b9ull;
  return key ^ (key >> 32);
}
}  // namespace

void BpeModel::InsertMerge(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  const uint64_t key = PairKey(left, right);
  for (uint64_t i = MixKey(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
    if (merges_[i].key == kEmpty ||
        merges_[i].key == key) {  // a repeated pair: the later rank wins, as in HF
      merges_[i] = MergeEntry{key, rank, merged};
      return;
    }
  }
}

const BpeModel::MergeEntry* BpeModel::FindMerge(int32_t left, int32_t right) const {
  const uint64_t key = PairKey(left, right);
  for (uint64_t i = MixKey(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
    if (merges_[i].key == key) return &merges_[i];
    if (merges_[i].key == kEmpty) return nullptr;
  }
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_strings_.find(token);
  if (it == vocab_strings_.end()) return std::nullopt;
  return it->second;
}

namespace {
constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581
constexpr uint32_t kMetaspaceCp = 0x2581;

// Last code point of a (valid UTF-8, non-empty) string.
uint32_t LastCodePoint(std::string_view s) {
  size_t i = Utf8CharStart(s, s.size() - 1);
  return text::NextCodePoint(s, &i);
}
}  // namespace

// Decides whether words may be cut before U+2581 (see cut_before_metaspace_).
// A cut between characters a and b is exact when no merge (L, R) has L ending
// in a and R starting with b: no symbol pair across the cut can ever merge.
// Byte-fallback and unk symbols do not carry their characters, so a model
// whose merges involve them is never cut.
void BpeModel::FindWordCuts(const json& merges) {
  // ignore_merges applies to whole words only: keep them whole.
  if (byte_level_ || ignore_merges_ || !vocab_.count(kMetaspace)) return;
  std::string left, right;
  for (const json& m : merges) {
    if (!ParseMerge(m, &left, &right) || left.empty() || right.empty()) return;
    for (const std::string* side : {&left, &right}) {
      if (*side == unk_token_.value_or("") || (side->size() == 6 && side->compare(0, 3, "<0x") == 0)) return;
    }
    if (right.compare(0, kMetaspace.size(), kMetaspace) == 0) joins_metaspace_.push_back(LastCodePoint(left));
  }
  std::sort(joins_metaspace_.begin(), joins_metaspace_.end());
  joins_metaspace_.erase(std::unique(joins_metaspace_.begin(), joins_metaspace_.end()),
                         joins_metaspace_.end());
  cut_before_metaspace_ = true;
}

void BpeModel::Encode(std::string_view word, std::vector<BpeToken>* out) const {
  if (word.empty()) return;
  if (!cut_before_metaspace_) {
    EncodeCached(word, out);
    return;
  }
  size_t begin = 0;
  for (size_t at = word.find(kMetaspace, 1); at != std::string_view::npos;
       at = word.find(kMetaspace, at + 1)) {
    const uint32_t before = LastCodePoint(word.substr(0, at));
    if (before == kMetaspaceCp ||
        std::binary_search(joins_metaspace_.begin(), joins_metaspace_.end(), before)) {
      continue;  // a merge could join across this point
    }
    EncodeCached(word.substr(begin, at - begin), out);
    begin = at;
  }
  EncodeCached(word.substr(begin), out);
}

void BpeModel::EncodeCached(std::string_view word, std::vector<BpeToken>* out) const {
  if (word.size() > BpeCache::kMaxWordBytes) {
    EncodeUncached(word, out);
    return;
  }
  const uint64_t hash = BpeCache::Hash(word);
  if (cache_.Lookup(word, hash, out)) return;
  const size_t first = out->size();
  EncodeUncached(word, out);
  cache_.Insert(word, hash, out->data() + first, out->size() - first);
}

void BpeModel::EncodeUncached(std::string_view word, std::vector<BpeToken>* out) const {
  if (ignore_merges_) {  // a word that is itself a token is emitted whole
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out->push_back({it->second, static_cast<uint32_t>(word.size())});
      return;
    }
  }
  thread_local std::vector<BpeToken> symbols;
  symbols.clear();
  InitialSymbols(word, &symbols);
  MergeSymbols(&symbols);
  out->insert(out->end(), symbols.begin(), symbols.end());
}

// Characters (bytes for byte-level models) as initial symbols, with HF's
// handling of characters missing from the vocab: <0xXX> byte tokens when
// byte_fallback, else the unk token (consecutive ones fused when fuse_unk),
// else dropped.
void BpeModel::InitialSymbols(std::string_view word, std::vector<BpeToken>* symbols) const {
  std::optional<BpeToken> pending_unk;
  size_t i = 0;
  while (i < word.size()) {
    const uint32_t n = byte_level_ ? 1 : text::Utf8SeqLength(static_cast<uint8_t>(word[i]));
    const std::string_view ch = word.substr(i, n);
    i += ch.size();
    int32_t id = -1;
    if (byte_level_) {
      id = byte_ids_[static_cast<uint8_t>(ch[0])];
    } else {
      size_t at = 0;
      const uint32_t cp = text::NextCodePoint(ch, &at);
      if (cp < char_ids_.size()) id = char_ids_[cp];
    }
    if (id >= 0) {
      if (pending_unk) symbols->push_back(*pending_unk);
      pending_unk.reset();
      symbols->push_back({id, static_cast<uint32_t>(ch.size())});
      continue;
    }
    if (byte_fallback_ &&
        std::all_of(ch.begin(), ch.end(), [&](char c) { return fallback_ids_[uint8_t(c)] >= 0; })) {
      for (char c : ch) symbols->push_back({fallback_ids_[static_cast<uint8_t>(c)], 1});
      continue;  // HF leaves a pending unk pending here
    }
    if (unk_id_ < 0) continue;
    if (pending_unk && fuse_unk_) {
      pending_unk->len += static_cast<uint32_t>(ch.size());
    } else {
      if (pending_unk) symbols->push_back(*pending_unk);
      pending_unk = BpeToken{unk_id_, static_cast<uint32_t>(ch.size())};
    }
  }
  if (pending_unk) symbols->push_back(*pending_unk);
}

void BpeModel::MergeSymbols(std::vector<BpeToken>* tokens) const {
  const auto n = static_cast<int32_t>(tokens->size());
  if (n < 2) return;
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> heap;
  sym.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) sym[i] = {(*tokens)[i].id, i - 1, i + 1 < n ? i + 1 : -1, (*tokens)[i].len};
  auto consider = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    if (const MergeEntry* m = FindMerge(sym[pos].id, sym[next].id)) {
      heap.push_back({m->rank, pos, sym[pos].id, sym[next].id, m->merged});
      std::push_heap(heap.begin(), heap.end(), LaterCandidate());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), LaterCandidate());
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = sym[c.pos];
    // Stale entries: the left symbol was merged away or changed, or its right neighbour did.
    if (left.len == 0 || left.next < 0 || left.id != c.left_id || sym[left.next].id != c.right_id) continue;
    Symbol& right = sym[left.next];
    left.id = c.merged;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  tokens->clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) tokens->push_back({sym[i].id, sym[i].len});
}

}  // namespace ft
