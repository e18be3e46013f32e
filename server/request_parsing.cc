#include "server/request_parsing.h"

#include <algorithm>
#include <climits>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/unknown_field_set.h>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/utf8.h"

namespace drt::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// Offset of the first byte that is not part of a whole, well-formed UTF-8
// character, or npos.
size_t FirstInvalidUtf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Char c = ReadUtf8Char(bytes.substr(i));
    if (c.kind != Utf8Char::Kind::kValid) return i;
    i += c.length;
  }
  return std::string_view::npos;
}

// Walks the wire-format fields of a message of type `type` and describes the
// first string field (with its path, e.g. "generate.stop") whose bytes are
// not valid UTF-8; empty when there is none.
std::string DescribeInvalidUtf8(const UnknownFieldSet& fields, const Descriptor& type,
                                const std::string& prefix) {
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& field = fields.field(i);
    if (field.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const FieldDescriptor* descriptor = type.FindFieldByNumber(field.number());
    if (descriptor == nullptr) continue;
    const std::string path = prefix + descriptor->name();
    const std::string& bytes = field.length_delimited();
    if (descriptor->type() == FieldDescriptor::TYPE_STRING) {
      const size_t at = FirstInvalidUtf8(bytes);
      if (at == std::string_view::npos) continue;
      std::string hint;
      if (type.FindFieldByName(descriptor->name() + "_bytes") != nullptr) {
        hint = absl::StrFormat("; send text that is not valid UTF-8 as %s_bytes",
                               descriptor->name());
      }
      return absl::StrFormat("field %s is not valid UTF-8 (byte %d of %d is 0x%02x)%s", path, at,
                             bytes.size(), static_cast<unsigned char>(bytes[at]), hint);
    }
    if (descriptor->type() == FieldDescriptor::TYPE_MESSAGE) {
      UnknownFieldSet nested;
      if (!nested.ParseFromString(bytes)) continue;
      std::string found = DescribeInvalidUtf8(nested, *descriptor->message_type(), path + ".");
      if (!found.empty()) return found;
    }
  }
  return "";
}

}  // namespace

int GrpcReceiveLimit(int64_t max_message_bytes) {
  return static_cast<int>(std::min<int64_t>(2 * std::max<int64_t>(max_message_bytes, 0), INT_MAX));
}

bool IsMessageSizeRefusal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument &&
         absl::StrContains(status.message(), kMessageLimitWords);
}

absl::Status ParseRequest(const grpc::ByteBuffer& bytes, const std::string& what, int64_t max_bytes,
                          google::protobuf::Message* message) {
  message->Clear();
  if (const size_t size = bytes.Length(); static_cast<int64_t>(size) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d bytes, %s (%d)", what, size, kMessageLimitWords,
        max_bytes));
  }
  std::vector<grpc::Slice> slices;
  std::string data;
  if (!bytes.Dump(&slices).ok()) {
    return absl::InternalError(absl::StrFormat("%s could not be read", what));
  }
  for (const grpc::Slice& s : slices) data.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (message->ParseFromString(data)) return absl::OkStatus();

  const std::string type = message->GetDescriptor()->full_name();
  std::string cause;
  UnknownFieldSet fields;
  if (!fields.ParseFromString(data)) {
    cause = absl::StrFormat("its %d bytes are not protobuf wire format", data.size());
  } else {
    cause = DescribeInvalidUtf8(fields, *message->GetDescriptor(), "");
    if (cause.empty()) cause = "a field does not match its declared type";
  }
  message->Clear();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s is not a valid %s: %s", what, type, cause));
}

}  // namespace drt::server
