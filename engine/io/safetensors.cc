#include "engine/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/confined_path.h"
#include "common/file_util.h"
#include "engine/io/json_members.h"
#include "kernels/cpu/ops.h"

namespace ft {

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

int DTypeSize(DType d) {
  switch (d) {
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16: return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool: return 1;
  }
  return 1;
}

StatusOr<DType> ParseDType(const std::string& name) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64, DType::kI32, DType::kI16,
                  DType::kI8, DType::kU8, DType::kBool}) {
    if (name == DTypeName(d)) return d;
  }
  return Status::InvalidArgument("unknown dtype '" + name + "'");
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_size_);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  uint64_t size = 0;
  FT_ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size));  // confined; FIFOs and devices refused
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_size_ = static_cast<size_t>(size);
  if (f->map_size_ < 8) {
    ::close(fd);
    return Status::Corruption(path + ": file is " + std::to_string(f->map_size_) +
                              " bytes, too short for a safetensors header (truncated?)");
  }
  void* m = mmap(nullptr, f->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return Status::IOError(path + ": mmap failed: " + std::strerror(errno));
  f->map_ = m;
  uint64_t header_len = 0;
  std::memcpy(&header_len, m, 8);  // little-endian host assumed (x86-64, aarch64)
  FT_RETURN_IF_ERROR(f->ParseHeader(header_len));
  return f;
}

namespace {

// The bytes `dtype` × `shape` needs, or nullopt when the count overflows 64 bits.
std::optional<uint64_t> TensorBytes(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t bytes = static_cast<uint64_t>(DTypeSize(dtype));
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) return std::nullopt;
  }
  return bytes;
}

std::string Range(const TensorInfo& t) {
  return "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ")";
}

// At most this much of a name taken from a file goes into an error message.
std::string Clip(const std::string& s) { return s.size() <= 200 ? s : s.substr(0, 200) + "..."; }

}  // namespace

Status SafetensorsFile::ParseHeader(uint64_t header_len) {
  const uint8_t* base = static_cast<const uint8_t*>(map_);
  if (header_len > map_size_ - 8 || header_len > (100u << 20)) {
    // The value is 8 arbitrary bytes of whatever file this is: never echoed (job logs are served).
    return Status::Corruption(path_ +
                              ": the header length in the first 8 bytes is implausible for a file of " +
                              std::to_string(map_size_) + " bytes (truncated or not safetensors)");
  }
  data_ = base + 8 + header_len;
  data_size_ = map_size_ - 8 - header_len;
  // The entries in file order with repeats kept: a parsed object would keep the last of a name.
  const std::optional<JsonMembers> header =
      ObjectMembers(std::string_view(reinterpret_cast<const char*>(base) + 8, header_len), {});
  if (!header) return Status::Corruption(path_ + ": header is not a JSON object");
  if (auto repeated = FindRepeatedKey(*header)) return RepeatedTensor(*header, *repeated);
  for (const auto& [name, entry] : *header) {
    if (name == "__metadata__") {
      if (entry.is_object()) {
        for (auto m = entry.begin(); m != entry.end(); ++m) {
          if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
        }
      }
      continue;
    }
    FT_ASSIGN_OR_RETURN(TensorInfo info, ParseEntry(name, entry));
    index_[info.name] = tensors_.size();
    tensors_.push_back(std::move(info));
  }
  return CheckNoOverlap();
}

StatusOr<TensorInfo> SafetensorsFile::ParseEntry(const std::string& name, const nlohmann::json& e) const {
  const std::string where = path_ + ": tensor '" + name + "'";
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets") ||
      !e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
      e["data_offsets"].size() != 2) {
    return Status::Corruption(where + ": entry needs dtype, shape and data_offsets [begin, end]");
  }
  TensorInfo info;
  info.name = name;
  auto dtype = ParseDType(e["dtype"].get<std::string>());
  if (!dtype.ok()) return Status::Corruption(where + ": " + dtype.status().message());
  info.dtype = *dtype;
  for (const auto& d : e["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) return Status::Corruption(where + ": bad shape");
    info.shape.push_back(d.get<int64_t>());
  }
  const auto& off = e["data_offsets"];
  if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    return Status::Corruption(where + ": bad data_offsets");
  }
  info.begin = off[0].get<uint64_t>();
  info.end = off[1].get<uint64_t>();
  const std::optional<uint64_t> want = TensorBytes(info.dtype, info.shape);
  if (!want || *want > data_size_) {
    return Status::Corruption(where + ": " + DTypeName(info.dtype) + " " + ShapeString(info.shape) +
                              " needs more bytes than the file's " + std::to_string(data_size_) +
                              " data bytes (a truncated file or a damaged header?)");
  }
  if (info.end < info.begin || info.end - info.begin != *want) {
    return Status::Corruption(where + ": data_offsets " + Range(info) + " hold " +
                              std::to_string(info.end - info.begin) + " bytes but " + DTypeName(info.dtype) +
                              " " + ShapeString(info.shape) + " needs " + std::to_string(*want));
  }
  if (info.end > data_size_) {
    return Status::Corruption(where + ": data ends at byte " + std::to_string(info.end) +
                              " but the file holds only " + std::to_string(data_size_) +
                              " data bytes (truncated file?)");
  }
  return info;
}

Status SafetensorsFile::RepeatedTensor(const JsonMembers& header, const RepeatedKey& r) const {
  auto offsets = [&](size_t i) {
    const nlohmann::json& e = header[i].second;
    return e.is_object() && e.contains("data_offsets") ? Clip(e["data_offsets"].dump())
                                                       : std::string("(none)");
  };
  return Status::Corruption(path_ + ": tensor '" + Clip(r.key) +
                            "' is named twice in the header (data_offsets " + offsets(r.first) + " and " +
                            offsets(r.second) +
                            "): which one to load is ambiguous; re-save the file with each tensor once");
}

Status SafetensorsFile::CheckNoOverlap() const {
  // Tensors sorted by where they start; each must start at or after the furthest end so far.
  std::vector<const TensorInfo*> by_begin;
  for (const TensorInfo& t : tensors_) {
    if (t.end > t.begin) by_begin.push_back(&t);  // an empty tensor holds no bytes
  }
  std::sort(by_begin.begin(), by_begin.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
  });
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo* t : by_begin) {
    if (furthest && t->begin < furthest->end) {
      return Status::Corruption(path_ + ": tensors '" + Clip(furthest->name) + "' (data_offsets " +
                                Range(*furthest) + ") and '" + Clip(t->name) + "' (" + Range(*t) +
                                ") share bytes: each tensor must have its own; re-save the file");
    }
    if (!furthest || t->end > furthest->end) furthest = t;
  }
  return Status::OK();
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::ReadFloat(const std::string& name, const std::vector<int64_t>& expected_shape,
                                  float* out) const {
  const TensorInfo* info = Find(name);
  if (!info) return Status::NotFound(path_ + ": tensor '" + name + "' is missing");
  if (info->shape != expected_shape) {
    return Status::InvalidArgument(path_ + ": tensor '" + name + "' has shape " + ShapeString(info->shape) +
                                   " but the model config needs " + ShapeString(expected_shape));
  }
  const uint8_t* src = RawData(*info);
  const int64_t n = info->numel();
  switch (info->dtype) {
    case DType::kF32: std::memcpy(out, src, n * sizeof(float)); break;
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, src + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      break;
    case DType::kBF16:
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = info->dtype == DType::kBF16 ? cpu::Bf16ToFloat(h) : cpu::HalfToFloat(h);
      }
      break;
    default:
      return Status::InvalidArgument(path_ + ": tensor '" + name + "' has dtype " + DTypeName(info->dtype) +
                                     "; expected F32, F16, BF16 or F64");
  }
  return Status::OK();
}

namespace {

// Values [begin, begin + count) of t, encoded as its dtype into `bytes` (`values`: scratch for fill).
void EncodeChunk(const TensorToWrite& t, int64_t begin, int64_t count, std::vector<float>& values,
                 std::vector<uint8_t>& bytes) {
  const float* src = nullptr;
  if (t.data != nullptr) {
    src = t.data + begin;
  } else {
    values.resize(static_cast<size_t>(count));
    t.fill(begin, count, values.data());
    src = values.data();
  }
  bytes.resize(static_cast<size_t>(count) * DTypeSize(t.dtype));
  if (t.dtype == DType::kF32) {
    std::memcpy(bytes.data(), src, bytes.size());
    return;
  }
  const bool bf16 = t.dtype == DType::kBF16;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 16))
#endif
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t h = bf16 ? cpu::FloatToBf16(src[i]) : cpu::FloatToHalf(src[i]);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
}

// Writes tensor t (n values) to fd, a chunk at a time.
Status WriteTensor(int fd, const TensorToWrite& t, int64_t n, const std::string& path) {
  if (t.data == nullptr && !t.fill) {
    return Status::InvalidArgument(path + ": tensor '" + t.name + "' has neither data nor fill");
  }
  std::vector<float> values;
  std::vector<uint8_t> bytes;
  for (int64_t begin = 0; begin < n; begin += kSafetensorsWriteChunk) {
    EncodeChunk(t, begin, std::min(kSafetensorsWriteChunk, n - begin), values, bytes);
    FT_RETURN_IF_ERROR(WriteAll(fd, bytes.data(), bytes.size(), path));
  }
  return Status::OK();
}

}  // namespace

Status WriteSafetensors(const std::string& path, std::vector<TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata, bool sync) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
      return Status::InvalidArgument(path + ": tensor '" + t.name + "': can only write F32, BF16 or F16");
    }
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    uint64_t bytes = static_cast<uint64_t>(n) * DTypeSize(t.dtype);
    header[t.name] = {
        {"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  FT_ASSIGN_OR_RETURN(int fd, OpenConfined(path, O_WRONLY | O_CREAT | O_TRUNC));
  uint64_t len = h.size();
  Status s = WriteAll(fd, &len, 8, path);
  if (s.ok()) s = WriteAll(fd, h.data(), h.size(), path);
  for (const auto& t : tensors) {
    if (!s.ok()) break;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    s = WriteTensor(fd, t, n, path);
  }
  if (s.ok() && sync && ::fsync(fd) != 0)
    s = Status::IOError(path + ": fsync failed: " + std::strerror(errno));
  if (::close(fd) != 0 && s.ok()) s = Status::IOError(path + ": close failed: " + std::strerror(errno));
  if (!s.ok()) ::unlink(path.c_str());
  return s;
}

}  // namespace ft
