// One JSONL line of training data through each data format's encoder (tokens,
// text, alpaca, chat; engine/data/data_format.h) with a real byte-level BPE
// tokenizer and ChatML template (tests/fuzz/data/). The first byte chooses
// the format, the rest is the line.
#include <cstdlib>

#include "engine/data/data_format.h"
#include "engine/text/tokenizer.h"
#include "tests/fuzz/fuzz.h"

namespace {
const std::vector<ft::RecordEncoder>& Encoders() {
  static const std::vector<ft::RecordEncoder> encoders = [] {
    std::vector<ft::RecordEncoder> v;
    for (ft::DataFormat f :
         {ft::DataFormat::kTokens, ft::DataFormat::kText, ft::DataFormat::kAlpaca, ft::DataFormat::kChat}) {
      auto e = ft::MakeRecordEncoder(f, &ft::fuzz::DataTokenizer(), 400);
      if (!e.ok()) std::abort();  // every format works with this tokenizer
      v.push_back(std::move(*e));
    }
    return v;
  }();
  return encoders;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& encoders = Encoders();
  const std::string line(ft::fuzz::AsText(data + 1, size - 1));
  (void)encoders[data[0] % encoders.size()](line, "fuzz.jsonl:1");
  return 0;
}
