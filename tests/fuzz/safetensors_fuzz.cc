// A .safetensors file (header length, JSON header, tensor table, data area):
// opened, validated, and every small tensor read as float
// (engine/io/safetensors.h).
#include <vector>

#include "engine/io/safetensors.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::ScratchFile("model.safetensors", ft::fuzz::AsText(data, size));
  auto file = ft::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  std::vector<float> out;
  for (const ft::TensorInfo& t : (*file)->tensors()) {
    if (t.numel() < 0 || t.numel() > (int64_t{1} << 16)) continue;
    out.resize(static_cast<size_t>(t.numel()) + 1);
    (void)(*file)->ReadFloat(t.name, t.shape, out.data());
  }
  return 0;
}
