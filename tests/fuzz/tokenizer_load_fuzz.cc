// tokenizer.json → Tokenizer (BPE model, normalizers, pre-tokenizers,
// added tokens, post-processor, decoders), then an encode and a decode of a
// fixed text with what loaded (engine/text/tokenizer.h).
#include "engine/text/tokenizer.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::ScratchFile("tokenizer.json", ft::fuzz::AsText(data, size));
  auto tokenizer = ft::Tokenizer::Load(path);
  if (!tokenizer.ok()) return 0;
  const std::vector<int32_t> ids = (*tokenizer)->Encode("Hello wörld 123 <s> \u00e9\n\t  x", true);
  (void)(*tokenizer)->Decode(ids, false);
  return 0;
}
