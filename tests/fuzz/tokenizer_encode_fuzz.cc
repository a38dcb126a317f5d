// Arbitrary bytes through a real byte-level BPE tokenizer
// (tests/fuzz/data/tokenizer.json): encode with and without special tokens,
// with offsets, and decode; byte-level BPE must round-trip valid UTF-8, and
// a real tokenizer's patterns never run out of their regex work (value()
// aborts on an error).
#include <cstdlib>

#include "engine/text/tokenizer.h"
#include "engine/text/unicode_text.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ft::Tokenizer& tokenizer = ft::fuzz::DataTokenizer();
  const std::string_view text = ft::fuzz::AsText(data, size);
  const std::vector<int32_t> plain = tokenizer.Encode(text, false).value();
  (void)tokenizer.Encode(text, true).value();
  (void)tokenizer.EncodeWithOffsets(text, true).value();
  const std::string back = tokenizer.Decode(plain, false);
  if (ft::text::IsValidUtf8(text) && back != text) std::abort();  // byte-level BPE loses nothing
  return 0;
}
