// Hugging Face tokenizers, read from a model's tokenizer.json (+
// tokenizer_config.json beside it), producing exactly the ids HF produces.
//
// Supported models: byte-level BPE with a regex pre-tokenizer (GPT-2, Llama 3,
// Qwen2/2.5/3) and SentencePiece-style BPE with byte fallback (Llama 2,
// TinyLlama, Mistral, Gemma 3), with their normalizers, added and special
// tokens, post-processor (BOS/EOS on add_special_tokens) and decoders.
//
// Thread safety: a loaded Tokenizer is immutable; Encode/Decode may be called
// concurrently (any cache is internally synchronised).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ft {

struct TokenSpan {
  int32_t id = 0;
  int64_t begin = 0;  // byte offsets into the encoded (un-normalised) text; [begin, end)
  int64_t end = 0;    // tokens made by the post-processor (BOS/EOS) have begin == end
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // `path` is a tokenizer.json file or a directory holding one (a model
  // directory). tokenizer_config.json next to it is read when present (chat
  // template, bos/eos/pad tokens, add_bos_token/add_eos_token). Errors name
  // the file and the unsupported or malformed field.
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  // Token ids of `text`. add_special_tokens applies the post-processor
  // (e.g. Llama's BOS), as HF's tokenizer(text, add_special_tokens=...).
  // InvalidArgument when a normalizer's or pre-tokenizer's regex needs more
  // work on `text` than it is allowed (engine/text/tokenizer_regex.h: a
  // pattern that backtracks catastrophically), naming the tokenizer.json, the
  // field, the pattern, the text's length and the fix: an error, never ids
  // that could differ from Hugging Face's.
  virtual StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const = 0;
  // Same, with byte offsets of each token in `text` (for label masks).
  virtual StatusOr<std::vector<TokenSpan>> EncodeWithOffsets(std::string_view text,
                                                             bool add_special_tokens) const = 0;
  // Text of `ids`, as HF's decode(ids, skip_special_tokens=...).
  // clean_up_tokenization_spaces comes from tokenizer_config.json (false when absent).
  virtual std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
  // Same with HF's clean_up_tokenization_spaces given explicitly. With false,
  // byte-level BPE round-trips: Decode(Encode(x, false), false, false) == x
  // (NFC(x) under Qwen's NFC normalizer).
  virtual std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens,
                             bool clean_up_tokenization_spaces) const = 0;

  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual int64_t vocab_size() const = 0;  // largest id + 1, added tokens included

  // From tokenizer_config.json ("" when absent).
  virtual const std::string& chat_template() const = 0;
  virtual const std::string& bos_token() const = 0;
  virtual const std::string& eos_token() const = 0;
  virtual const std::string& pad_token() const = 0;
};

}  // namespace ft
