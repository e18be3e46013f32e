// Parses client-stream messages that arrive as raw bytes. gRPC's typed
// Read() returns false both when the client ends the stream and when a
// message does not parse (a proto3 string that is not valid UTF-8, bytes that
// are not the message type), so a bad message looks like the end of the
// stream and the call would end as a success with every later message
// dropped. Append and Complete therefore read grpc::ByteBuffer and parse
// here, where the two are told apart and the cause can be named.
#pragma once

#include <cstdint>

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace drt::server {

// Parses `bytes`, the `index`-th message of its stream (counting from 0),
// into `message`. INVALID_ARGUMENT naming the index and the cause: bytes that
// are not protobuf wire format, a string field (named) that is not valid
// UTF-8, or another mismatch with the message type.
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, int64_t index,
                          google::protobuf::Message* message);

// Reads the next message of a stream of raw bytes: true with the message,
// false when the client ended the stream (or the call ended), or ParseRequest's
// INVALID_ARGUMENT.
template <typename Stream>
absl::StatusOr<bool> ReadRequest(Stream& stream, int64_t index,
                                 google::protobuf::Message* message) {
  grpc::ByteBuffer bytes;
  if (!stream.Read(&bytes)) return false;
  if (absl::Status s = ParseRequest(bytes, index, message); !s.ok()) return s;
  return true;
}

}  // namespace drt::server
