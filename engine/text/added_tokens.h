// Added tokens (tokenizer.json "added_tokens": special tokens such as <s> or
// <|im_start|>, and user-added ones) and how Hugging Face finds them in text
// before pre-tokenization: leftmost-longest matching, honouring single_word,
// lstrip and rstrip.
//
// Thread safety: an AddedTokenSplitter is immutable once built.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ft {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;  // match only where not inside a word
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool normalized = true;    // matched in normalized text (false: in the raw input)
  bool special = false;      // skipped by Decode(skip_special_tokens=true)
};

// A byte range of the text and the added token it matched (-1: plain text).
struct TextSection {
  size_t begin = 0;
  size_t end = 0;
  int32_t token = -1;  // index into the token list given to Add()
};

class AddedTokenSplitter {
 public:
  // Registers `pattern` (the token content, or its normalized form) for
  // tokens[index]. An empty pattern is ignored.
  void Add(std::string_view pattern, int32_t index);
  bool empty() const { return patterns_ == 0; }

  // Cuts `s` (valid UTF-8) into plain sections and added-token sections, as
  // HF's AddedVocabulary::find_matches. Sections cover `s` in order; a token
  // section includes whitespace stripped by lstrip/rstrip.
  void Split(std::string_view s, const std::vector<AddedToken>& tokens, std::vector<TextSection>* out) const;

 private:
  // Index of the longest pattern starting at s[i] (and its length), or -1.
  int32_t LongestAt(std::string_view s, size_t i, size_t* len) const;

  // Byte trie: edge (node << 8 | byte) -> child node; node -> token index.
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_{-1};
  bool first_byte_[256] = {};
  size_t patterns_ = 0;
};

}  // namespace ft
