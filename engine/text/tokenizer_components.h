// The pipeline pieces of a tokenizer.json around its model: normalizers,
// pre-tokenizers, post-processor and decoders, each parsed from its JSON
// object and behaving as Hugging Face's tokenizers (Rust) does.
//
// Supported: normalizers NFC/NFD/NFKC/NFKD, Lowercase, Strip, Prepend, Replace,
// Sequence; pre-tokenizers Split, ByteLevel, Metaspace, Sequence;
// post-processors TemplateProcessing, ByteLevel, RobertaProcessing,
// BertProcessing, Sequence; decoders ByteLevel, Replace, ByteFallback, Fuse,
// Strip, Metaspace, Sequence. Anything else is an Unimplemented error naming
// the file and field.
//
// Thread safety: parsed components are immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/text/unicode_text.h"

namespace ft::tok {

// Normalize and PreTokenize fail only when a regex pattern's work runs out on
// the text (engine/text/tokenizer_regex.h): InvalidArgument naming the file,
// the field and the pattern.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual Status Normalize(text::AlignedText* t) const = 0;
};

// Text split into the pieces ("words") the model will encode.
struct PreTokenized {
  text::AlignedText text;
  std::vector<std::pair<size_t, size_t>> pieces;  // byte ranges of text, non-empty, in order
  bool at_input_start = false;                    // text begins at offset 0 of the input
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual Status PreTokenize(PreTokenized* p) const = 0;
  // Whether this is (or ends with) the ByteLevel pre-tokenizer: the model's
  // vocab is then byte-level.
  virtual bool byte_level() const { return false; }
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings (HF's decode_chain); the result is joined. A
  // Replace whose regex runs out of work on a token leaves it unreplaced and
  // logs the error (decoding makes output, never training input).
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// What the post-processor adds around a single sequence when
// add_special_tokens is set.
struct PostProcessor {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

// `j` is the component's JSON (null -> nullptr / empty). `where` names the
// file and field for errors ("<file>: normalizer").
StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& j, const std::string& where);
StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& j, const std::string& where);
StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& j, const std::string& where);
StatusOr<PostProcessor> ParsePostProcessor(const nlohmann::json& j, const std::string& where);

}  // namespace ft::tok
