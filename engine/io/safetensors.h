// Reading and writing the safetensors format (Hugging Face's tensor files).
//
// Layout: u64 little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the raw little-endian tensor bytes (offsets are relative to that area).
// Open() validates the whole header against the file size, so a truncated or
// malformed file is rejected before any tensor is read; every error names the
// file and, where it applies, the tensor.
//
// Thread safety: a SafetensorsFile is immutable after Open(); concurrent reads are safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/io/json_members.h"

namespace ft {

enum class DType { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };
const char* DTypeName(DType d);  // "F32", "BF16", ...
int DTypeSize(DType d);          // bytes per element
StatusOr<DType> ParseDType(const std::string& name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data area
  uint64_t end = 0;
  int64_t numel() const;
};

std::string ShapeString(const std::vector<int64_t>& shape);  // "[4, 64]"

class SafetensorsFile {
 public:
  // Maps the file and validates its header. NotFound when missing, Corruption
  // when truncated or malformed (naming the file and what is wrong): a
  // tensor named twice (naming it and both entries' offsets; parsers would
  // keep the last), two tensors sharing bytes (naming both and their
  // ranges), a shape too large for the file.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;

  // Converts tensor `name` (F32, F16, BF16 or F64) to float into out[numel].
  // InvalidArgument when its shape differs from `expected_shape` or its dtype
  // is not a float type; NotFound when absent. Messages name file and tensor.
  Status ReadFloat(const std::string& name, const std::vector<int64_t>& expected_shape, float* out) const;
  // Raw bytes of a tensor (for opaque data such as packed NF4).
  const uint8_t* RawData(const TensorInfo& info) const { return data_ + info.begin; }

 private:
  SafetensorsFile() = default;
  Status ParseHeader(uint64_t header_len);
  // One header entry as a tensor: dtype, shape, and offsets that hold exactly its bytes inside the
  // data area (a shape whose byte count overflows is refused, not wrapped).
  StatusOr<TensorInfo> ParseEntry(const std::string& name, const nlohmann::json& entry) const;
  // Corruption naming a tensor the header lists twice, with both entries' offsets.
  Status RepeatedTensor(const JsonMembers& header, const RepeatedKey& repeated) const;
  // Corruption naming two tensors whose byte ranges share bytes, with their ranges.
  Status CheckNoOverlap() const;

  std::string path_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data area
  uint64_t data_size_ = 0;
};

// One tensor to write, stored as `dtype` (F32, BF16 or F16): `data` holds its
// numel floats or, when `data` is null, `fill` produces them a range at a time
// (fill(begin, count, out) writes values [begin, begin + count) to out), so a
// tensor made on the fly is never whole in memory.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
  DType dtype = DType::kF32;
  std::function<void(int64_t begin, int64_t count, float* out)> fill;
};

// Writes a safetensors file (tensors sorted by name, header padded to 8
// bytes), encoding each tensor in chunks of kSafetensorsWriteChunk values (the
// memory it takes beside the caller's). When `sync` is set the file is fsynced
// before returning. IOError names the path on failure; a partly written file
// is removed.
constexpr int64_t kSafetensorsWriteChunk = int64_t{1} << 22;
Status WriteSafetensors(const std::string& path, std::vector<TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata, bool sync);

}  // namespace ft
