// A message that does not parse in the middle of an Append (or Complete)
// stream: gRPC's typed Read() would report it as the end of the stream, and
// the call ended OK with every later message dropped. A raw client sends the
// bytes a careless or hostile client would; the call must end with
// INVALID_ARGUMENT naming the message and the cause, keeping the earlier
// messages whole and nothing of the bad one.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

struct RawStreamResult {
  grpc::Status status;
  std::vector<std::string> responses;  // serialized response messages
};

// A bidirectional call of `method` that sends `messages` as they are (no
// serialization, so anything can be sent), then half-closes and reads every
// answer.
RawStreamResult RawStream(grpc::Channel& channel, const std::string& method,
                          const std::vector<std::string>& messages) {
  grpc::ClientContext context;
  SetDeadline(context, 60);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          &channel, grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::BIDI_STREAMING),
          &context));
  for (const std::string& m : messages) {
    if (!stream->Write(ToByteBuffer(m))) break;  // the server has ended the call
  }
  stream->WritesDone();
  RawStreamResult result;
  grpc::ByteBuffer buffer;
  while (stream->Read(&buffer)) result.responses.push_back(FromByteBuffer(buffer));
  result.status = stream->Finish();
  return result;
}

// AppendRequest fields: session_id = 1, text = 2 (string), text_bytes = 4.
std::string TextMessage(const std::string& session_id, const std::string& text) {
  return (session_id.empty() ? "" : EncodeBytesField(1, session_id)) + EncodeBytesField(2, text);
}

bool HasSummary(const RawStreamResult& r) {
  for (const std::string& bytes : r.responses) {
    drt::v1::AppendResponse response;
    if (response.ParseFromString(bytes) && response.has_summary()) return true;
  }
  return false;
}

constexpr const char* kAppend = "/drt.v1.Drt/Append";

TEST_CASE("Append: invalid UTF-8 in text mid-stream is INVALID_ARGUMENT, not OK",
          "[server][append_faults]") {
  InProcessServer server;
  const std::string id = NewSession(server.stub());
  // The example: the bad message 1 used to end the stream as if the
  // client had closed it; OK with tokens_ingested=6, the three "world" lost.
  RawStreamResult r = RawStream(*server.channel(), kAppend,
                                {TextMessage(id, "hello "), TextMessage("", "\xc3\x28" "bad"),
                                 TextMessage("", "world"), TextMessage("", "world"),
                                 TextMessage("", "world")});
  INFO("status " << r.status.error_code() << " '" << r.status.error_message() << "'");
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(),
             Contains("message 1 is not a valid drt.v1.AppendRequest: field text is not valid "
                      "UTF-8 (byte 0 of 5 is 0xc3); send text that is not valid UTF-8 as "
                      "text_bytes"));
  CHECK_THAT(r.status.error_message(), Contains("the earlier messages of this Append were kept (6 tokens)"));
  CHECK_FALSE(HasSummary(r));
  // Message 0 is kept whole ("hello ", one id per byte); nothing after it.
  drt::v1::SessionInfo info = WaitIdle(server.stub(), id);
  CHECK(info.tokens() == 6);
  CHECK_FALSE(info.busy());
}

TEST_CASE("Append: bytes that are not an AppendRequest are INVALID_ARGUMENT",
          "[server][append_faults]") {
  InProcessServer server;
  const std::string id = NewSession(server.stub());
  // Field 1, length-delimited, claiming 2^35 bytes: not wire format.
  const std::string garbage = "\x0a\xff\xff\xff\xff\x7f" "abc";
  RawStreamResult r =
      RawStream(*server.channel(), kAppend,
                {TextMessage(id, "one "), TextMessage("", "two "), garbage, TextMessage("", "x")});
  INFO("status " << r.status.error_code() << " '" << r.status.error_message() << "'");
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(),
             Contains("message 2 is not a valid drt.v1.AppendRequest: its 9 bytes are not "
                      "protobuf wire format"));
  CHECK_FALSE(HasSummary(r));
  CHECK(WaitIdle(server.stub(), id).tokens() == 8);  // "one two "
}

TEST_CASE("Append: a bad first message names the real problem", "[server][append_faults]") {
  InProcessServer server;
  const std::string id = NewSession(server.stub());
  RawStreamResult r =
      RawStream(*server.channel(), kAppend, {TextMessage(id, "ok \xff"), TextMessage("", "more")});
  INFO("status " << r.status.error_code() << " '" << r.status.error_message() << "'");
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(),
             Contains("message 0 is not a valid drt.v1.AppendRequest: field text is not valid "
                      "UTF-8 (byte 3 of 4 is 0xff)"));
  CHECK_THAT(r.status.error_message(), !Contains("at least one message"));
  CHECK(WaitIdle(server.stub(), id).tokens() == 0);

  // An invalid session_id string is named as such.
  r = RawStream(*server.channel(), kAppend, {EncodeBytesField(1, "s-\xc0\xaf")});
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(), Contains("message 0 is not a valid drt.v1.AppendRequest: "
                                                "field session_id is not valid UTF-8 (byte 2 of 4"));

  // A stream with no message at all still says so.
  r = RawStream(*server.channel(), kAppend, {});
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(),
             Contains("Append needs at least one message naming the session"));
}

TEST_CASE("Append: well-formed raw messages still work, text_bytes may cut characters",
          "[server][append_faults]") {
  InProcessServer server;
  const std::string id = NewSession(server.stub());
  // "é" (c3 a9) cut between two text_bytes pieces is fine.
  RawStream(*server.channel(), kAppend, {});  // an empty call changes nothing
  RawStreamResult r = RawStream(*server.channel(), kAppend,
                                {EncodeBytesField(1, id) + EncodeBytesField(4, "caf\xc3"),
                                 EncodeBytesField(4, "\xa9 au lait")});
  INFO("status '" << r.status.error_message() << "'");
  REQUIRE(r.status.ok());
  CHECK(HasSummary(r));
  CHECK(WaitIdle(server.stub(), id).tokens() == 13);  // bytes of "café au lait"
}

TEST_CASE("Complete: a bad prompt message is INVALID_ARGUMENT, nothing generated",
          "[server][append_faults]") {
  InProcessServer server;
  // CompleteRequest: generate = 1 (GenerateRequest: max_tokens = 2), text = 2.
  const std::string options = EncodeBytesField(1, std::string("\x10\x04", 2));
  RawStreamResult r =
      RawStream(*server.channel(), "/drt.v1.Drt/Complete",
                {options, EncodeBytesField(2, "a prompt "), EncodeBytesField(2, "\xe2\x82"),
                 EncodeBytesField(2, "the rest")});
  INFO("status " << r.status.error_code() << " '" << r.status.error_message() << "'");
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(),
             Contains("message 2 is not a valid drt.v1.CompleteRequest: field text is not valid "
                      "UTF-8 (byte 0 of 2 is 0xe2)"));
  CHECK(r.responses.empty());  // no answer to a part of the prompt

  // A bad string inside the options names its path.
  const std::string bad_stop = EncodeBytesField(1, std::string("\x10\x04", 2) + EncodeBytesField(5, "\xff"));
  r = RawStream(*server.channel(), "/drt.v1.Drt/Complete", {bad_stop, EncodeBytesField(2, "hi")});
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(),
             Contains("message 0 is not a valid drt.v1.CompleteRequest: field generate.stop is "
                      "not valid UTF-8"));
}

// A server whose --max_message_bytes is 1024: gRPC itself takes messages up
// to 2048 bytes (GrpcReceiveLimit), the service refuses those over 1024.
ServiceOptions SmallMessageOptions() {
  ServiceOptions options = SmallOptions();
  options.max_message_bytes = 1024;
  return options;
}

TEST_CASE("Append: a message over --max_message_bytes is refused by name, the earlier kept whole",
          "[server][append_faults]") {
  InProcessServer server(SmallMessageOptions());
  const std::string id = NewSession(server.stub());
  // Message 1: 1 byte of tag, 2 of length, 1500 of text = 1503 bytes. The
  // review's case: gRPC refused it with its own RESOURCE_EXHAUSTED and the
  // held-back " world" of message 0 was lost (5 tokens kept, not 11).
  RawStreamResult r =
      RawStream(*server.channel(), kAppend,
                {TextMessage(id, "hello world"), TextMessage("", std::string(1500, 'a')),
                 TextMessage("", "more")});
  INFO("status " << r.status.error_code() << " '" << r.status.error_message() << "'");
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(),
             Contains("message 1 has 1503 bytes, over this server's --max_message_bytes (1024)"));
  CHECK_THAT(r.status.error_message(),
             Contains("the earlier messages of this Append were kept (11 tokens)"));
  CHECK_FALSE(HasSummary(r));
  CHECK(WaitIdle(server.stub(), id).tokens() == 11);  // "hello world", nothing of message 1

  // The limit itself passes: 1 + 2 + 1021 = 1024 bytes; one more byte does not.
  const std::string at_limit = TextMessage("", " " + std::string(1020, 'b'));
  REQUIRE(at_limit.size() == 1024);
  r = RawStream(*server.channel(), kAppend, {TextMessage(id, " x"), at_limit});
  INFO("status '" << r.status.error_message() << "'");
  CHECK(r.status.ok());
  CHECK(WaitIdle(server.stub(), id).tokens() == 11 + 2 + 1021);
  const std::string over_limit = TextMessage("", " " + std::string(1021, 'c'));
  REQUIRE(over_limit.size() == 1025);
  r = RawStream(*server.channel(), kAppend, {EncodeBytesField(1, id), over_limit});
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(), Contains("message 1 has 1025 bytes"));
  CHECK(WaitIdle(server.stub(), id).tokens() == 11 + 2 + 1021);
}

TEST_CASE("Append: a message gRPC refuses itself still leaves the earlier messages whole",
          "[server][append_faults]") {
  InProcessServer server(SmallMessageOptions());
  const std::string id = NewSession(server.stub());
  // 3003 bytes, over gRPC's own receive limit (2048): gRPC ends the call
  // before the service sees the message. The stream ended between messages,
  // so message 0 is kept whole, its held-back " world" included.
  RawStreamResult r =
      RawStream(*server.channel(), kAppend,
                {TextMessage(id, "hello world"), TextMessage("", std::string(3000, 'a'))});
  INFO("status " << r.status.error_code() << " '" << r.status.error_message() << "'");
  CHECK_FALSE(r.status.ok());
  CHECK_FALSE(HasSummary(r));
  CHECK(WaitIdle(server.stub(), id).tokens() == 11);
}

TEST_CASE("Complete and unary calls: a request over --max_message_bytes is refused by name",
          "[server][append_faults]") {
  InProcessServer server(SmallMessageOptions());
  const std::string options = EncodeBytesField(1, std::string("\x10\x04", 2));
  RawStreamResult r = RawStream(*server.channel(), "/drt.v1.Drt/Complete",
                                {options, EncodeBytesField(2, "a prompt "),
                                 EncodeBytesField(2, std::string(1100, 'p'))});
  INFO("status " << r.status.error_code() << " '" << r.status.error_message() << "'");
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(),
             Contains("message 2 has 1103 bytes, over this server's --max_message_bytes (1024)"));
  CHECK(r.responses.empty());

  // Tokenize: text = 1, 1100 bytes.
  std::string response;
  const grpc::Status status = RawUnaryCall(*server.channel(), "/drt.v1.Drt/Tokenize",
                                           EncodeBytesField(1, std::string(1100, 't')), &response);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(),
             Contains("the Tokenize request has 1103 bytes, over this server's "
                      "--max_message_bytes (1024)"));
}

}  // namespace
}  // namespace drt::server
