// Read-only, memory-mapped safetensors file.
// Format: 8-byte little-endian header length N, N bytes of JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data section. Every structural problem is an error naming the file
// (and tensor), never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/file_as_loaded.h"

namespace drt {

enum class DType { kF32, kF16, kBF16, kI32, kI64 };

const char* DTypeName(DType dtype);
size_t DTypeSize(DType dtype);

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // points into the mapping
  size_t num_bytes = 0;

  int64_t num_elements() const;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates its header: JSON well-formed, dtypes known,
  // offsets inside the data section, non-overlapping, byte counts matching
  // shape x dtype size.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // NOT_FOUND naming the file and the tensor when absent.
  absl::StatusOr<const TensorView*> Get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The descriptor the file was mapped from, with its fstat at Open, for a
  // later check and read of the same bytes (the model fingerprint); null
  // after the first call.
  std::unique_ptr<FileAsLoaded> ReleaseFile();

  // Copies any float tensor (f32/f16/bf16) into fp32; error for integer dtypes.
  absl::StatusOr<std::vector<float>> ReadF32(const std::string& name) const;
  // Copies an integer tensor (i32/i64) into int64.
  absl::StatusOr<std::vector<int64_t>> ReadI64(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::unique_ptr<FileAsLoaded> file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

float HalfToFloat(uint16_t bits);
float BFloat16ToFloat(uint16_t bits);

}  // namespace drt
