// Parses request messages that arrive as raw bytes. gRPC's typed Read()
// returns false both when the client ends the stream and when a message does
// not parse (a proto3 string that is not valid UTF-8, bytes that are not the
// message type), so a bad message looks like the end of the stream and the
// call would end as a success with every later message dropped; a unary
// call's request that does not parse ends with INTERNAL and no message,
// which the server would log as its own fault. Every drt.v1 method therefore
// reads grpc::ByteBuffer (DrtService's constructor) and parses here, where
// the cause can be named, and where a message over --max_message_bytes is
// refused by name (gRPC's own limit is set above it: GrpcReceiveLimit).
#pragma once

#include <cstdint>
#include <string>

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace drt::server {

// The receive limit drt-server gives gRPC when its --max_message_bytes is
// `max_message_bytes`: twice that (at most INT_MAX). gRPC refuses a larger
// message itself, before any handler sees it (RESOURCE_EXHAUSTED "Received
// message larger than max", the call cancelled), so it is set above the
// flag: a message up to twice the flag reaches its handler, which refuses
// one over the flag by name (ParseRequest), an Append keeping its earlier
// messages whole. Bounded, not unlimited: gRPC holds a message whole in
// memory before the handler sees it, so this is what one message of a call
// can take (twice what the operator allowed, not any size a client sends).
int GrpcReceiveLimit(int64_t max_message_bytes);

// In every refusal of a message over --max_message_bytes (ParseRequest), so
// that the OpenAI API can tell it (413) from other INVALID_ARGUMENTs.
inline constexpr char kMessageLimitWords[] = "over this server's --max_message_bytes";
// ParseRequest's refusal of a message for its size.
bool IsMessageSizeRefusal(const absl::Status& status);

// Parses `bytes` into `message`; `what` names it in errors ("message 2" of
// a stream, "the GetSession request"). INVALID_ARGUMENT naming it and the
// cause: more than `max_bytes` bytes (kMessageLimitWords), bytes that are not
// protobuf wire format, a string field (named) that is not valid UTF-8, or
// another mismatch with the message type.
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, const std::string& what, int64_t max_bytes,
                          google::protobuf::Message* message);

// Reads the next message of a stream of raw bytes, the `index`-th (counting
// from 0): true with the message, false when the client ended the stream
// (or the call ended), or ParseRequest's INVALID_ARGUMENT.
template <typename Stream>
absl::StatusOr<bool> ReadRequest(Stream& stream, int64_t index, int64_t max_bytes,
                                 google::protobuf::Message* message) {
  grpc::ByteBuffer bytes;
  if (!stream.Read(&bytes)) return false;
  if (absl::Status s = ParseRequest(bytes, "message " + std::to_string(index), max_bytes, message);
      !s.ok()) {
    return s;
  }
  return true;
}

}  // namespace drt::server
