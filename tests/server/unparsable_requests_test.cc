// A request of a unary or server-streaming drt.v1 method that does not parse
// (a string field that is not valid UTF-8, bytes that are not the request
// type): gRPC's typed handlers answer INTERNAL with an empty message, which
// the failed-call log reports as a fault of the server and which no metric
// counts (review-grpc finding 3). Every method reads raw bytes instead and
// refuses them with INVALID_ARGUMENT naming the method and the cause, after
// the credentials check, counted in drt_requests_total/drt_errors_total.
// The requests are sent as raw bytes (C++ protobuf, proxies and hand-made
// encoders send such bytes; Go, Java and Python refuse to).
#include <memory>
#include <string>

#include <catch2/catch.hpp>
#include <google/protobuf/descriptor.h>

#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

// Field 1, length-delimited, claiming 2^35 bytes: not protobuf wire format
// for any message type.
const std::string kGarbage = "\x0a\xff\xff\xff\xff\x7f" "abc";

// A server-streaming call of `method` sending `request` as it is; reads every
// answer and returns the status.
grpc::Status RawServerStream(grpc::Channel& channel, const std::string& method,
                             const std::string& request, int* answers = nullptr) {
  grpc::ClientContext context;
  SetDeadline(context, 30);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          &channel,
          grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING),
          &context, ToByteBuffer(request)));
  grpc::ByteBuffer buffer;
  int n = 0;
  while (reader->Read(&buffer)) ++n;
  if (answers != nullptr) *answers = n;
  return reader->Finish();
}

// A bidirectional call of `method` sending `request` as its one message.
grpc::Status RawBidiStream(grpc::Channel& channel, const std::string& method,
                           const std::string& request) {
  grpc::ClientContext context;
  SetDeadline(context, 30);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          &channel,
          grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::BIDI_STREAMING),
          &context));
  stream->Write(ToByteBuffer(request));
  stream->WritesDone();
  grpc::ByteBuffer buffer;
  while (stream->Read(&buffer)) {
  }
  return stream->Finish();
}

// Calls the drt.v1.Drt method `method` with `request` as its (first)
// message, as a client of its declared kind does.
grpc::Status CallWithBytes(grpc::Channel& channel, const google::protobuf::MethodDescriptor& method,
                           const std::string& request) {
  const std::string path = "/drt.v1.Drt/" + method.name();
  if (method.client_streaming()) return RawBidiStream(channel, path, request);
  if (method.server_streaming()) return RawServerStream(channel, path, request);
  std::string response;
  return RawUnaryCall(channel, path, request, &response);
}

const google::protobuf::ServiceDescriptor& DrtServiceDescriptor() {
  return *drt::v1::AppendRequest::descriptor()->file()->FindServiceByName("Drt");
}

// The value of a Prometheus counter line `series` (e.g.
// drt_requests_total{method="Tokenize"}), or -1.
int64_t Counter(Metrics& metrics, const std::string& series) {
  const std::string text = metrics.RenderPrometheus();
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + series.size() + 2));
}

TEST_CASE("Every method refuses bytes that are not its request type with INVALID_ARGUMENT",
          "[server][unparsable]") {
  InProcessServer server;
  const google::protobuf::ServiceDescriptor& service = DrtServiceDescriptor();
  REQUIRE(service.method_count() == 13);  // a new method is covered by this loop
  for (int i = 0; i < service.method_count(); ++i) {
    const google::protobuf::MethodDescriptor& method = *service.method(i);
    const grpc::Status status = CallWithBytes(*server.channel(), method, kGarbage);
    INFO(method.name() << ": " << status.error_code() << " '" << status.error_message() << "'");
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    // Streams of requests number their messages; the others name the method.
    const std::string what = method.client_streaming()
                                 ? "message 0"
                                 : "the " + method.name() + " request";
    CHECK_THAT(status.error_message(),
               Contains(what + " is not a valid " + method.input_type()->full_name() +
                        ": its 9 bytes are not protobuf wire format"));
  }
}

TEST_CASE("Unary and Generate requests with invalid UTF-8 name the field", "[server][unparsable]") {
  InProcessServer server;
  const std::string id = NewSession(server.stub());
  std::string response;
  // GetSession, DeleteSession, ForkSession: session_id = 1 holding "a\xffb".
  const std::string bad_id = EncodeBytesField(1, "a\xff" "b");
  for (const char* method : {"GetSession", "DeleteSession", "ForkSession"}) {
    const grpc::Status status =
        RawUnaryCall(*server.channel(), std::string("/drt.v1.Drt/") + method, bad_id, &response);
    INFO(method << ": '" << status.error_message() << "'");
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(status.error_message(),
               Contains(std::string("the ") + method + " request is not a valid drt.v1." + method +
                        "Request: field session_id is not valid UTF-8 (byte 1 of 3 is 0xff)"));
  }
  // Tokenize: text = 1 not UTF-8; the message points at text_bytes (field 2).
  grpc::Status status = RawUnaryCall(*server.channel(), "/drt.v1.Drt/Tokenize",
                                     EncodeBytesField(1, "ok\xc3"), &response);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(),
             Contains("the Tokenize request is not a valid drt.v1.TokenizeRequest: field text is "
                      "not valid UTF-8 (byte 2 of 3 is 0xc3); send text that is not valid UTF-8 "
                      "as text_bytes"));
  // Generate: a stop sequence (field 5) not UTF-8; nothing generated.
  int answers = -1;
  status = RawServerStream(*server.channel(), "/drt.v1.Drt/Generate",
                           EncodeBytesField(1, id) + EncodeBytesField(5, "\xff"), &answers);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(),
             Contains("the Generate request is not a valid drt.v1.GenerateRequest: field stop is "
                      "not valid UTF-8 (byte 0 of 1 is 0xff)"));
  CHECK(answers == 0);

  // Well-formed raw requests are served: the session is still there and empty.
  drt::v1::GetSessionRequest get;
  get.set_session_id(id);
  status = RawUnaryCall(*server.channel(), "/drt.v1.Drt/GetSession", get.SerializeAsString(),
                        &response);
  REQUIRE(status.ok());
  drt::v1::SessionInfo info;
  REQUIRE(info.ParseFromString(response));
  CHECK(info.session_id() == id);
  CHECK(info.tokens() == 0);
}

TEST_CASE("An unparsable request is counted as a client error", "[server][unparsable]") {
  InProcessServer server;
  Metrics& metrics = server.metrics();
  const std::string requests = "drt_requests_total{method=\"Tokenize\"}";
  const std::string invalid = "drt_errors_total{code=\"INVALID_ARGUMENT\"}";
  const std::string internal = "drt_errors_total{code=\"INTERNAL\"}";
  const int64_t requests_before = Counter(metrics, requests);
  const int64_t invalid_before = Counter(metrics, invalid);
  REQUIRE(requests_before >= 0);
  REQUIRE(invalid_before >= 0);
  std::string response;
  for (int i = 0; i < 3; ++i) {
    CHECK(RawUnaryCall(*server.channel(), "/drt.v1.Drt/Tokenize", kGarbage, &response)
              .error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  CHECK(Counter(metrics, requests) == requests_before + 3);
  CHECK(Counter(metrics, invalid) == invalid_before + 3);
  CHECK(Counter(metrics, internal) == 0);
}

TEST_CASE("Credentials are checked before an unparsable request is refused",
          "[server][unparsable]") {
  ServiceOptions options = SmallOptions();
  options.bearer_token = "s3cret";
  InProcessServer server(options);
  std::string response;
  const grpc::Status status =
      RawUnaryCall(*server.channel(), "/drt.v1.Drt/GetSession", kGarbage, &response);
  CHECK(status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace drt::server
