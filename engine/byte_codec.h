// Little-endian fixed-width writing and bounds-checked reading of the binary
// records of the durable session format (docs/state_format.md). Values are
// copied with memcpy in host order; the format is defined for little-endian
// hosts (x86-64, aarch64), which is all drt-server builds for.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the state format is little-endian");

class ByteWriter {
 public:
  explicit ByteWriter(std::string& out) : out_(out) {}
  template <typename T>
  void Put(T v) {
    Raw(&v, sizeof v);
  }
  void I64(int64_t v) { Put(v); }
  void Str(std::string_view s) {
    I64(static_cast<int64_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void Floats(const std::vector<float>& v) {
    I64(static_cast<int64_t>(v.size()));
    Raw(v.data(), v.size() * sizeof(float));
  }
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }

 private:
  std::string& out_;
};

// Every read names what it reads in its error (INVALID_ARGUMENT).
class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  template <typename T>
  absl::Status Get(T& v, const char* what) {
    return Raw(&v, sizeof v, what);
  }
  absl::Status I64(int64_t& v, const char* what) { return Get(v, what); }
  absl::Status Str(std::string& s, const char* what) {
    int64_t n = 0;
    if (absl::Status st = I64(n, what); !st.ok()) return st;
    if (n < 0 || static_cast<uint64_t>(n) > remaining()) return Short(what, n);
    s.assign(in_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status Floats(std::vector<float>& v, const char* what) {
    int64_t n = 0;
    if (absl::Status st = I64(n, what); !st.ok()) return st;
    if (n < 0 || static_cast<uint64_t>(n) > remaining() / sizeof(float)) {
      return Short(what, n * static_cast<int64_t>(sizeof(float)));
    }
    v.resize(n);
    return Raw(v.data(), n * sizeof(float), what);
  }
  absl::Status Raw(void* p, size_t n, const char* what) {
    if (n > remaining()) return Short(what, static_cast<int64_t>(n));
    if (n > 0) std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  size_t remaining() const { return in_.size() - pos_; }
  std::string_view rest() const { return in_.substr(pos_); }

 private:
  absl::Status Short(const char* what, int64_t wanted) const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes announced at offset %d but only %d remain", what, wanted, pos_, remaining()));
  }
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace drt
