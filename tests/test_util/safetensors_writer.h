// Builds safetensors files in tests, including deliberately broken ones:
// Header() and Data() can be edited before EncodeSafetensors() joins them.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace drt::testing {

// 8-byte little-endian length, header text, data.
inline std::string EncodeSafetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  return out + header + data;
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!file) throw std::runtime_error("cannot write " + path);
}

// bf16 bits of a float whose low 16 bits are zero (exact); throws otherwise.
inline uint16_t ExactBFloat16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0xFFFFu) != 0) throw std::invalid_argument("value not exact in bf16");
  return static_cast<uint16_t>(bits >> 16);
}

// f16 bits of zero or a normal f16 value exactly representable; throws otherwise.
inline uint16_t ExactHalfBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t sign = (bits >> 16) & 0x8000u;
  if ((bits & 0x7FFFFFFFu) == 0) return static_cast<uint16_t>(sign);
  const int exponent = static_cast<int>((bits >> 23) & 0xFF) - 127 + 15;
  const uint32_t mantissa = bits & 0x7FFFFFu;
  if (exponent < 1 || exponent > 30 || (mantissa & 0x1FFFu) != 0) {
    throw std::invalid_argument("value not exact as a normal f16");
  }
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13));
}

class SafetensorsWriter {
 public:
  // Adds or replaces a tensor with raw little-endian bytes.
  void Set(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           std::string bytes) {
    Remove(name);
    entries_.push_back({name, dtype, std::move(shape), std::move(bytes)});
  }

  template <typename T>
  void SetValues(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                 const std::vector<T>& values) {
    std::string bytes(values.size() * sizeof(T), '\0');
    if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    Set(name, dtype, std::move(shape), std::move(bytes));
  }

  // Stores `values` as F32, F16 or BF16 (the latter two must be exact).
  void SetFloats(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                 const std::vector<float>& values) {
    if (dtype == "F32") return SetValues(name, dtype, std::move(shape), values);
    std::vector<uint16_t> bits;
    for (float value : values) {
      bits.push_back(dtype == "F16" ? ExactHalfBits(value) : ExactBFloat16Bits(value));
    }
    SetValues(name, dtype, std::move(shape), bits);
  }

  void Remove(const std::string& name) {
    std::erase_if(entries_, [&](const Entry& entry) { return entry.name == name; });
  }

  // Header with offsets in insertion order, plus optional metadata.
  nlohmann::json Header() const {
    nlohmann::json header = nlohmann::json::object();
    uint64_t offset = 0;
    for (const Entry& entry : entries_) {
      header[entry.name] = {{"dtype", entry.dtype},
                            {"shape", entry.shape},
                            {"data_offsets", {offset, offset + entry.bytes.size()}}};
      offset += entry.bytes.size();
    }
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    return header;
  }

  std::string Data() const {
    std::string data;
    for (const Entry& entry : entries_) data += entry.bytes;
    return data;
  }

  void SetMetadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  // Pads the header with spaces to a multiple of 8 bytes, as the reference
  // writer does, so that data starts aligned.
  std::string Serialize() const {
    std::string header = Header().dump();
    header.append((8 - header.size() % 8) % 8, ' ');
    return EncodeSafetensors(header, Data());
  }

  void WriteTo(const std::string& path) const { WriteFile(path, Serialize()); }

 private:
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<Entry> entries_;
  nlohmann::json metadata_ = nlohmann::json::object();
};

}  // namespace drt::testing
