// tokenizer.json → Tokenizer (BPE model, normalizers, pre-tokenizers,
// added tokens, post-processor, decoders), then an encode and a decode of a
// fixed text with what loaded (engine/text/tokenizer.h). A pattern that
// backtracks catastrophically may fail the encode (a named error, bounded
// work); the fuzzer finds the ones whose work is not bounded (a timeout).
#include "engine/text/tokenizer.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::ScratchFile("tokenizer.json", ft::fuzz::AsText(data, size));
  auto tokenizer = ft::Tokenizer::Load(path);
  if (!tokenizer.ok()) return 0;
  const auto ids = (*tokenizer)->Encode("Hello wörld 123 <s> \u00e9\n\t  x", true);
  if (!ids.ok()) return 0;
  (void)(*tokenizer)->Decode(*ids, false);
  return 0;
}
