#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace drt {
namespace {

using nlohmann::json;

// Tensor data is little-endian and copied with memcpy.
static_assert(std::endian::native == std::endian::little, "little-endian host required");

constexpr size_t kHeaderLengthBytes = 8;

std::optional<DType> ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  return std::nullopt;
}

bool IsFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

// A JSON integer as uint64_t; nullopt for negatives, floats and non-numbers.
std::optional<uint64_t> NonNegativeInteger(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(value.get<int64_t>());
  }
  return std::nullopt;
}

std::string Uint128String(unsigned __int128 value) {
  if (value == 0) return "0";
  std::string digits;
  for (; value > 0; value /= 10) digits.insert(digits.begin(), static_cast<char>('0' + value % 10));
  return digits;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Owns a read-only private mapping until released.
struct Mapping {
  void* data = nullptr;
  size_t size = 0;
  // The descriptor the file was mapped from and its fstat then
  // (SafetensorsFile::ReleaseFile).
  int fd = -1;
  struct stat info {};
  ~Mapping() {
    if (data != nullptr) munmap(data, size);
    if (fd >= 0) close(fd);
  }
};

absl::Status MapFile(const std::string& path, Mapping& mapping) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": file not found"));
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(info.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const auto file_size = static_cast<uint64_t>(info.st_size);
  if (file_size < kHeaderLengthBytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file is ", file_size, " bytes, shorter than the 8-byte header length"));
  }
  void* data = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  if (data == MAP_FAILED) {
    close(fd);
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(err)));
  }
  mapping.data = data;
  mapping.size = file_size;
  mapping.fd = fd;
  mapping.info = info;
  return absl::OkStatus();
}

struct ParsedTensor {
  TensorView view;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Validates one header entry against the data section of `data_size` bytes.
absl::StatusOr<ParsedTensor> ParseEntry(const std::string& path, const std::string& name,
                                        const json& entry, const std::byte* data,
                                        uint64_t data_size) {
  const std::string where = absl::StrCat(path, ": tensor '", name, "'");
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header entry must be an object, got ", entry.type_name()));
  }
  ParsedTensor tensor;
  tensor.view.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing dtype"));
  }
  if (!dtype_it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": dtype must be a string"));
  }
  const std::string dtype_name = dtype_it->get<std::string>();
  std::optional<DType> dtype = ParseDType(dtype_name);
  if (!dtype) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown or unsupported dtype '",
                                                   dtype_name,
                                                   "' (expected F32, F16, BF16, I32 or I64)"));
  }
  tensor.view.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing shape"));
  }
  if (!shape_it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": shape must be an array of integers"));
  }
  // Element count in 128 bits: each dim is < 2^63 and the running product is
  // capped at 2^64 below, so no step can overflow.
  unsigned __int128 num_elements = 1;
  bool too_large = false;
  for (const json& dim : *shape_it) {
    if (!dim.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape must be an array of integers, got ", shape_it->dump()));
    }
    std::optional<uint64_t> size = NonNegativeInteger(dim);
    if (!size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": negative dimension in shape ", shape_it->dump()));
    }
    if (*size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dimension too large in shape ", shape_it->dump()));
    }
    tensor.view.shape.push_back(static_cast<int64_t>(*size));
    if (!too_large) {
      num_elements *= *size;
      if (num_elements > std::numeric_limits<uint64_t>::max()) too_large = true;
    }
  }
  // A zero dimension makes the tensor empty however large the others are.
  const bool empty =
      std::find(tensor.view.shape.begin(), tensor.view.shape.end(), 0) != tensor.view.shape.end();
  if (empty) {
    num_elements = 0;
    too_large = false;
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing data_offsets"));
  }
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": data_offsets must be an array of two integers"));
  }
  std::optional<uint64_t> begin = NonNegativeInteger((*offsets_it)[0]);
  std::optional<uint64_t> end = NonNegativeInteger((*offsets_it)[1]);
  if (!begin || !end) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": data_offsets must be non-negative integers, got ", offsets_it->dump()));
  }
  if (*begin > *end) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": data_offsets begin ", *begin, " is after end ", *end));
  }
  if (*end > data_size) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": data_offsets [", *begin, ", ", *end,
                                                   "] out of range of the data section (",
                                                   data_size, " bytes)"));
  }
  const uint64_t num_bytes = *end - *begin;
  const unsigned __int128 expected_bytes = num_elements * DTypeSize(*dtype);
  if (too_large || expected_bytes != num_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": data_offsets span ", num_bytes, " bytes but shape ",
        ShapeString(tensor.view.shape), " of ", dtype_name, " needs ",
        too_large ? std::string("more than 2^64") : Uint128String(expected_bytes), " bytes"));
  }
  tensor.begin = *begin;
  tensor.end = *end;
  tensor.view.data = data + *begin;
  tensor.view.num_bytes = static_cast<size_t>(num_bytes);
  return tensor;
}

// Non-empty tensors must not share bytes.
absl::Status CheckNoOverlap(const std::string& path, std::vector<const ParsedTensor*> tensors) {
  std::erase_if(tensors, [](const ParsedTensor* t) { return t->begin == t->end; });
  std::sort(tensors.begin(), tensors.end(), [](const ParsedTensor* a, const ParsedTensor* b) {
    return a->begin < b->begin || (a->begin == b->begin && a->end < b->end);
  });
  for (size_t i = 1; i < tensors.size(); ++i) {
    const ParsedTensor& previous = *tensors[i - 1];
    const ParsedTensor& current = *tensors[i];
    if (current.begin < previous.end) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensors '", previous.view.name, "' [", previous.begin, ", ",
                       previous.end, ") and '", current.view.name, "' [", current.begin, ", ",
                       current.end, ") have overlapping data_offsets"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseMetadata(const std::string& path, const json& value,
                           std::map<std::string, std::string>& metadata) {
  if (value.is_null()) return absl::OkStatus();
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__ must be an object"));
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": __metadata__ value for '", key, "' must be a string"));
    }
    metadata[key] = item.get<std::string>();
  }
  return absl::OkStatus();
}

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 0;
}

int64_t TensorView::num_elements() const {
  // Open() has checked that the product fits (it equals num_bytes / dtype size).
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

float BFloat16ToFloat(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  uint32_t result;
  if (exponent == 0x1F) {
    result = sign | 0x7F800000u | (mantissa << 13);  // inf, NaN (payload kept)
  } else if (exponent != 0) {
    result = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    result = sign;  // signed zero
  } else {
    // Subnormal half: normalise; every one is a normal float.
    int32_t float_exponent = 127 - 15 + 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --float_exponent;
    }
    mantissa &= 0x3FFu;
    result = sign | (static_cast<uint32_t>(float_exponent) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &result, sizeof(value));
  return value;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  try {
    Mapping mapping;
    if (absl::Status status = MapFile(path, mapping); !status.ok()) return status;
    const auto* bytes = static_cast<const std::byte*>(mapping.data);

    uint64_t header_length = 0;
    for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
      header_length |= static_cast<uint64_t>(bytes[i]) << (8 * i);
    }
    if (header_length > mapping.size - kHeaderLengthBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_length,
                                                     " is beyond the end of the file (",
                                                     mapping.size, " bytes)"));
    }
    const std::string header_text(reinterpret_cast<const char*>(bytes + kHeaderLengthBytes),
                                  header_length);
    json header;
    try {
      header = json::parse(header_text);
    } catch (const json::parse_error& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON header: ", e.what()));
    }
    if (!header.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": JSON header must be an object, got ", header.type_name()));
    }

    auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
    file->path_ = path;
    const std::byte* data = bytes + kHeaderLengthBytes + header_length;
    const uint64_t data_size = mapping.size - kHeaderLengthBytes - header_length;

    std::vector<ParsedTensor> parsed;
    parsed.reserve(header.size());
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (absl::Status status = ParseMetadata(path, entry, file->metadata_); !status.ok()) {
          return status;
        }
        continue;
      }
      absl::StatusOr<ParsedTensor> tensor = ParseEntry(path, name, entry, data, data_size);
      if (!tensor.ok()) return tensor.status();
      parsed.push_back(*std::move(tensor));
    }
    std::vector<const ParsedTensor*> order;
    for (const ParsedTensor& tensor : parsed) order.push_back(&tensor);
    if (absl::Status status = CheckNoOverlap(path, std::move(order)); !status.ok()) return status;

    for (ParsedTensor& tensor : parsed) {
      std::string name = tensor.view.name;
      file->tensors_.emplace(std::move(name), std::move(tensor.view));
    }
    file->map_ = mapping.data;
    file->map_size_ = mapping.size;
    mapping.data = nullptr;  // now owned by `file`
    file->file_ = std::make_unique<FileAsLoaded>(path, mapping.fd, mapping.info);
    mapping.fd = -1;  // now owned by `file`
    return file;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(path, ": error reading safetensors file: ", e.what()));
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

std::unique_ptr<FileAsLoaded> SafetensorsFile::ReleaseFile() { return std::move(file_); }

absl::StatusOr<const TensorView*> SafetensorsFile::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor '", name, "' not found"));
  }
  return &it->second;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadF32(const std::string& name) const {
  absl::StatusOr<const TensorView*> found = Get(name);
  if (!found.ok()) return found.status();
  const TensorView& tensor = **found;
  if (!IsFloat(tensor.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' has dtype ",
                                                   DTypeName(tensor.dtype),
                                                   ", expected a float dtype (F32, F16, BF16)"));
  }
  const size_t count = tensor.num_bytes / DTypeSize(tensor.dtype);
  std::vector<float> out(count);
  // memcpy per element: the data section need not be aligned.
  switch (tensor.dtype) {
    case DType::kF32:
      if (count > 0) std::memcpy(out.data(), tensor.data, tensor.num_bytes);
      break;
    case DType::kF16:
    case DType::kBF16: {
      const bool is_half = tensor.dtype == DType::kF16;
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, tensor.data + 2 * i, sizeof(bits));
        out[i] = is_half ? HalfToFloat(bits) : BFloat16ToFloat(bits);
      }
      break;
    }
    default:
      break;
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> SafetensorsFile::ReadI64(const std::string& name) const {
  absl::StatusOr<const TensorView*> found = Get(name);
  if (!found.ok()) return found.status();
  const TensorView& tensor = **found;
  const size_t count = tensor.num_bytes / DTypeSize(tensor.dtype);
  std::vector<int64_t> out(count);
  if (tensor.dtype == DType::kI64) {
    if (count > 0) std::memcpy(out.data(), tensor.data, tensor.num_bytes);
  } else if (tensor.dtype == DType::kI32) {
    for (size_t i = 0; i < count; ++i) {
      int32_t value;
      std::memcpy(&value, tensor.data + 4 * i, sizeof(value));
      out[i] = value;
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' has dtype ",
                                                   DTypeName(tensor.dtype),
                                                   ", expected an integer dtype (I32, I64)"));
  }
  return out;
}

}  // namespace drt
