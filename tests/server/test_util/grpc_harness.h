// Helpers for the gRPC service tests: the fixture model loaded once, an
// in-process drt-server (DrtService + health + reflection on 127.0.0.1:0)
// reached through a real channel, client-side wrappers of the drt.v1 calls,
// the engine's own greedy output for comparison, a tiny protobuf wire-format
// reader for the health/reflection services (whose generated stubs Debian
// does not install), and a child drt-server process that is always killed.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/support/sync_stream.h>

#include "drt/v1/drt.grpc.pb.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/session.h"
#include "server/drt_service.h"
#include "server/metrics.h"
#include "server/request_parsing.h"
#include "tests/test_util/build_paths.h"

extern char** environ;

namespace drt::server::testing {

inline std::string FixtureDir() { return std::string(drt::testing::SourceDir()) + "/tests/fixtures/two_groups"; }

// The two_groups fixture: byte vocabulary (0..255), pad 298, landmark 299,
// vocab 300, chunks of 63 tokens. Loaded once for the whole test binary.
struct FixtureModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;

  static FixtureModel& Get() {
    static FixtureModel* fixture = new FixtureModel(Load(FixtureDir()));
    return *fixture;
  }
  // The model in `dir` on the CPU backend; throws when it does not load.
  static FixtureModel Load(const std::string& dir) {
    FixtureModel f;
    auto loaded = LoadModel(dir);
    if (!loaded.ok()) throw std::runtime_error(std::string(loaded.status().message()));
    f.model = *std::move(loaded);
    f.backend = MakeCpuBackend(f.model->config(), f.model->weights());
    return f;
  }
  int32_t vocab() const { return static_cast<int32_t>(model->config().vocab_size); }
  int32_t pad_id() const { return static_cast<int32_t>(model->config().pad_id); }
  int32_t chunk_id() const { return static_cast<int32_t>(model->config().chunk_id); }
  int64_t chunk_size() const { return model->config().enc_chunk_size; }
};

// Real-token ids (bytes 0..255, which every id below pad/landmark is) from a
// seeded generator.
inline std::vector<int32_t> RandomTokens(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, 255);
  std::vector<int32_t> out(n);
  for (auto& t : out) t = dist(rng);
  return out;
}

// Splits n into random piece sizes in [1, max_piece].
inline std::vector<size_t> RandomPieces(size_t n, size_t max_piece, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> dist(1, max_piece);
  std::vector<size_t> pieces;
  for (size_t done = 0; done < n;) {
    const size_t p = std::min(dist(rng), n - done);
    pieces.push_back(p);
    done += p;
  }
  return pieces;
}

inline std::vector<size_t> EvenPieces(size_t n, size_t piece) {
  std::vector<size_t> pieces;
  for (size_t done = 0; done < n; done += piece) pieces.push_back(std::min(piece, n - done));
  return pieces;
}

// What the engine itself generates greedily after `prompt` (a fresh
// drt::Session on the fixture's backend).
inline std::vector<int32_t> EngineGreedy(const std::vector<int32_t>& prompt, int32_t max_tokens) {
  FixtureModel& f = FixtureModel::Get();
  auto session = Session::Create(*f.backend);
  if (!session.ok()) throw std::runtime_error(std::string(session.status().message()));
  auto appended = (*session)->Append(prompt);
  if (!appended.ok()) throw std::runtime_error(std::string(appended.status().message()));
  GenerateOptions options;
  options.max_tokens = max_tokens;
  auto generated = (*session)->Generate(options);
  if (!generated.ok()) throw std::runtime_error(std::string(generated.status().message()));
  return generated->tokens;
}

// ---------------------------------------------------------------------------
// In-process server.

inline ServiceOptions SmallOptions() {
  ServiceOptions options;
  options.model_name = "two_groups";
  options.max_sessions = 64;
  options.max_context_tokens = 4'000'000;
  options.idle_ttl_seconds = 600;
  options.host_memory_budget_bytes = 4LL << 30;
  return options;
}

class InProcessServer {
 public:
  explicit InProcessServer(ServiceOptions options = SmallOptions())
      : InProcessServer(*FixtureModel::Get().model, *FixtureModel::Get().backend,
                        std::move(options)) {}
  // Serves another model (both must outlive the server).
  InProcessServer(const Model& model, Backend& backend, ServiceOptions options) {
    const int64_t max_message_bytes = options.max_message_bytes;
    service_ = std::make_unique<DrtService>(model, backend, metrics_, std::move(options));
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    // gRPC's receive limit as drt-server's main sets it for the service's
    // --max_message_bytes.
    builder.SetMaxReceiveMessageSize(GrpcReceiveLimit(max_message_bytes));
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) throw std::runtime_error("cannot start the gRPC server");
    server_->GetHealthCheckService()->SetServingStatus(drt::v1::Drt::service_full_name(), true);
    server_->GetHealthCheckService()->SetServingStatus(true);
    channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
    stub_ = drt::v1::Drt::NewStub(channel_);
  }
  ~InProcessServer() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }
  InProcessServer(const InProcessServer&) = delete;
  InProcessServer& operator=(const InProcessServer&) = delete;

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  drt::v1::Drt::Stub& stub() { return *stub_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  DrtService& service() { return *service_; }
  grpc::Server& server() { return *server_; }
  Metrics& metrics() { return metrics_; }

 private:
  Metrics metrics_;
  std::unique_ptr<DrtService> service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<drt::v1::Drt::Stub> stub_;
};

// ---------------------------------------------------------------------------
// Client wrappers.

using Metadata = std::vector<std::pair<std::string, std::string>>;

inline void AddMetadata(grpc::ClientContext& context, const Metadata& metadata) {
  for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
}

inline void SetDeadline(grpc::ClientContext& context, double seconds) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
}

struct CreateResult {
  grpc::Status status;
  std::string id;
};

inline CreateResult CreateSession(drt::v1::Drt::Stub& stub,
                                  const drt::v1::CreateSessionRequest& request = {},
                                  const Metadata& metadata = {}) {
  grpc::ClientContext context;
  SetDeadline(context, 30);
  AddMetadata(context, metadata);
  drt::v1::CreateSessionResponse response;
  CreateResult result;
  result.status = stub.CreateSession(&context, request, &response);
  result.id = response.session_id();
  return result;
}

// A session id or a failed test.
inline std::string NewSession(drt::v1::Drt::Stub& stub, int64_t max_context_tokens = 0) {
  drt::v1::CreateSessionRequest request;
  request.set_max_context_tokens(max_context_tokens);
  CreateResult r = CreateSession(stub, request);
  if (!r.status.ok()) throw std::runtime_error("CreateSession failed: " + r.status.error_message());
  return r.id;
}

struct AppendResult {
  grpc::Status status;
  std::vector<drt::v1::AppendProgress> progress;
  std::optional<drt::v1::AppendSummary> summary;
};

inline drt::v1::AppendRequest TokensMessage(const std::string& session_id, const int32_t* ids,
                                            size_t n) {
  drt::v1::AppendRequest request;
  request.set_session_id(session_id);
  request.mutable_tokens()->mutable_ids()->Add(ids, ids + n);
  return request;
}

// Runs one Append call: writes the messages `next` produces (it returns
// false when there are no more), reading the server's answers on a second
// thread, and waits for the end of the call.
inline AppendResult RunAppend(drt::v1::Drt::Stub& stub, grpc::ClientContext& context,
                              const std::function<bool(drt::v1::AppendRequest*)>& next) {
  auto stream = stub.Append(&context);
  AppendResult result;
  std::thread reader([&] {
    drt::v1::AppendResponse response;
    while (stream->Read(&response)) {
      if (response.has_progress()) result.progress.push_back(response.progress());
      if (response.has_summary()) result.summary = response.summary();
    }
  });
  drt::v1::AppendRequest request;
  while (next(&request) && stream->Write(request)) request.Clear();
  stream->WritesDone();
  reader.join();
  result.status = stream->Finish();
  return result;
}

// Streams `tokens` into a session in pieces of the given sizes and waits for
// the end of the call. Every message names the session (allowed: it must match).
inline AppendResult AppendTokens(drt::v1::Drt::Stub& stub, const std::string& session_id,
                                 const std::vector<int32_t>& tokens,
                                 const std::vector<size_t>& pieces, const Metadata& metadata = {},
                                 double deadline_seconds = 300) {
  grpc::ClientContext context;
  SetDeadline(context, deadline_seconds);
  AddMetadata(context, metadata);
  size_t piece = 0, done = 0;
  return RunAppend(stub, context, [&](drt::v1::AppendRequest* request) {
    if (piece == pieces.size()) return false;
    *request = TokensMessage(session_id, tokens.data() + done, pieces[piece]);
    done += pieces[piece++];
    return true;
  });
}

// as_bytes: send the pieces as text_bytes (they may cut UTF-8 characters).
inline AppendResult AppendTexts(drt::v1::Drt::Stub& stub, const std::string& session_id,
                                const std::vector<std::string>& texts, bool as_bytes = false) {
  grpc::ClientContext context;
  SetDeadline(context, 120);
  size_t i = 0;
  return RunAppend(stub, context, [&](drt::v1::AppendRequest* request) {
    if (i == texts.size()) return false;
    if (i == 0) request->set_session_id(session_id);
    if (as_bytes) {
      request->set_text_bytes(texts[i]);
    } else {
      request->set_text(texts[i]);
    }
    ++i;
    return true;
  });
}

// An Append of one token-id message.
inline grpc::Status AppendOnce(drt::v1::Drt::Stub& stub, const std::string& id,
                               const std::vector<int32_t>& ids, const Metadata& metadata = {}) {
  return AppendTokens(stub, id, ids, {ids.size()}, metadata).status;
}

struct GenerateResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<float> logprobs;
  std::vector<drt::v1::TokenTopLogprobs> top_logprobs;  // GenerateRequest.top_logprobs
  std::optional<drt::v1::GenerateDone> done;
};

inline drt::v1::GenerateRequest GreedyRequest(const std::string& session_id, int32_t max_tokens) {
  drt::v1::GenerateRequest request;
  request.set_session_id(session_id);
  request.set_max_tokens(max_tokens);
  return request;
}

inline GenerateResult Generate(drt::v1::Drt::Stub& stub, const drt::v1::GenerateRequest& request,
                               const Metadata& metadata = {}, double deadline_seconds = 120) {
  grpc::ClientContext context;
  SetDeadline(context, deadline_seconds);
  AddMetadata(context, metadata);
  auto reader = stub.Generate(&context, request);
  GenerateResult result;
  drt::v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.has_piece()) {
      const auto& piece = response.piece();
      result.tokens.insert(result.tokens.end(), piece.token_ids().begin(), piece.token_ids().end());
      result.text += piece.text();
      result.logprobs.insert(result.logprobs.end(), piece.logprobs().begin(),
                             piece.logprobs().end());
      result.top_logprobs.insert(result.top_logprobs.end(), piece.top_logprobs().begin(),
                                 piece.top_logprobs().end());
    }
    if (response.has_done()) result.done = response.done();
  }
  result.status = reader->Finish();
  return result;
}

inline GenerateResult GenerateGreedy(drt::v1::Drt::Stub& stub, const std::string& session_id,
                                     int32_t max_tokens) {
  return Generate(stub, GreedyRequest(session_id, max_tokens));
}

struct InfoResult {
  grpc::Status status;
  drt::v1::SessionInfo info;
};

inline InfoResult GetSession(drt::v1::Drt::Stub& stub, const std::string& session_id,
                             const Metadata& metadata = {}) {
  grpc::ClientContext context;
  SetDeadline(context, 30);
  AddMetadata(context, metadata);
  drt::v1::GetSessionRequest request;
  request.set_session_id(session_id);
  InfoResult result;
  result.status = stub.GetSession(&context, request, &result.info);
  return result;
}

inline InfoResult ForkSession(drt::v1::Drt::Stub& stub, const std::string& session_id) {
  grpc::ClientContext context;
  SetDeadline(context, 30);
  drt::v1::ForkSessionRequest request;
  request.set_session_id(session_id);
  InfoResult result;
  result.status = stub.ForkSession(&context, request, &result.info);
  return result;
}

// SaveSession of `session_id` into the server's --session_files_dir as
// `file_name`; the response is written where given.
inline grpc::Status SaveSession(drt::v1::Drt::Stub& stub, const std::string& session_id,
                                const std::string& file_name,
                                drt::v1::SaveSessionResponse* response = nullptr) {
  drt::v1::SaveSessionResponse ignored;
  grpc::ClientContext context;
  SetDeadline(context, 30);
  drt::v1::SaveSessionRequest request;
  request.set_session_id(session_id);
  request.set_file_name(file_name);
  return stub.SaveSession(&context, request, response != nullptr ? response : &ignored);
}

inline InfoResult LoadSession(drt::v1::Drt::Stub& stub, const std::string& file_name) {
  grpc::ClientContext context;
  SetDeadline(context, 30);
  drt::v1::LoadSessionRequest request;
  request.set_file_name(file_name);
  InfoResult result;
  result.status = stub.LoadSession(&context, request, &result.info);
  return result;
}

inline grpc::Status DeleteSession(drt::v1::Drt::Stub& stub, const std::string& session_id) {
  grpc::ClientContext context;
  SetDeadline(context, 30);
  drt::v1::DeleteSessionRequest request;
  request.set_session_id(session_id);
  drt::v1::DeleteSessionResponse response;
  return stub.DeleteSession(&context, request, &response);
}

// Polls GetSession until the session is not busy (an Append or Generate that
// was cancelled client-side may still be finishing its step on the server).
inline drt::v1::SessionInfo WaitIdle(drt::v1::Drt::Stub& stub, const std::string& session_id,
                                     double timeout_seconds = 30) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  while (true) {
    InfoResult r = GetSession(stub, session_id);
    if (!r.status.ok()) throw std::runtime_error("GetSession failed: " + r.status.error_message());
    if (!r.info.busy()) return r.info;
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("session stays busy");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// A greedy Generate of 2^20 tokens with ignore_eos (far longer than any
// test waits) on a thread of its own: counts the tokens as they arrive and
// keeps the final status, the done message if one came, and when the call
// ended. Destroyed with the call still running (a failed REQUIRE), it
// cancels the call and joins the thread (a joinable std::thread would
// terminate the test binary).
class BackgroundGenerate {
 public:
  BackgroundGenerate(drt::v1::Drt::Stub& stub, const std::string& session_id,
                     double deadline_seconds) {
    SetDeadline(context_, deadline_seconds);
    thread_ = std::thread([this, &stub, session_id] {
      drt::v1::GenerateRequest request = GreedyRequest(session_id, 1 << 20);
      request.set_ignore_eos(true);
      auto reader = stub.Generate(&context_, request);
      drt::v1::GenerateResponse response;
      while (reader->Read(&response)) {
        generated_ += response.piece().token_ids_size();
        if (response.has_done()) done_ = response.done();
      }
      status_ = reader->Finish();
      end_ = std::chrono::steady_clock::now();
    });
  }
  ~BackgroundGenerate() {
    if (thread_.joinable()) {
      context_.TryCancel();
      thread_.join();
    }
  }
  BackgroundGenerate(const BackgroundGenerate&) = delete;
  BackgroundGenerate& operator=(const BackgroundGenerate&) = delete;

  int generated() const { return generated_.load(); }
  // Waits for the call to end; the accessors below are valid after it.
  void Join() { thread_.join(); }
  const grpc::Status& status() const { return status_; }
  const std::optional<drt::v1::GenerateDone>& done() const { return done_; }
  std::chrono::steady_clock::time_point end() const { return end_; }

 private:
  grpc::ClientContext context_;
  std::atomic<int> generated_{0};
  grpc::Status status_;
  std::optional<drt::v1::GenerateDone> done_;
  std::chrono::steady_clock::time_point end_;
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// Raw protobuf messages, for services whose generated C++ stubs are not
// installed (grpc.health.v1, grpc.reflection.v1alpha).

inline std::string EncodeVarint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

// A length-delimited field (string, bytes, sub-message).
inline std::string EncodeBytesField(int field, const std::string& bytes) {
  return EncodeVarint((static_cast<uint64_t>(field) << 3) | 2) + EncodeVarint(bytes.size()) + bytes;
}

// The fields of one message: varints by number, length-delimited ones by
// number (fixed32/64 skipped). Throws on malformed input.
struct WireFields {
  std::multimap<int, uint64_t> varints;
  std::multimap<int, std::string> bytes;

  static WireFields Parse(const std::string& data) {
    WireFields fields;
    size_t i = 0;
    auto varint = [&]() {
      uint64_t v = 0;
      for (int shift = 0; shift < 64; shift += 7) {
        if (i >= data.size()) throw std::runtime_error("truncated varint");
        const uint8_t b = static_cast<uint8_t>(data[i++]);
        v |= static_cast<uint64_t>(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
      }
      throw std::runtime_error("varint too long");
    };
    while (i < data.size()) {
      const uint64_t key = varint();
      const int field = static_cast<int>(key >> 3);
      switch (key & 7) {
        case 0: fields.varints.emplace(field, varint()); break;
        case 1: i += 8; break;
        case 5: i += 4; break;
        case 2: {
          const uint64_t n = varint();
          if (i + n > data.size()) throw std::runtime_error("truncated field");
          fields.bytes.emplace(field, data.substr(i, n));
          i += n;
          break;
        }
        default: throw std::runtime_error("unsupported wire type");
      }
    }
    if (i != data.size()) throw std::runtime_error("truncated message");
    return fields;
  }
  std::vector<std::string> All(int field) const {
    std::vector<std::string> out;
    auto [begin, end] = bytes.equal_range(field);
    for (auto it = begin; it != end; ++it) out.push_back(it->second);
    return out;
  }
};

inline grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

inline std::string FromByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) throw std::runtime_error("cannot read a ByteBuffer");
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// A unary call of any method with raw request bytes.
inline grpc::Status RawUnaryCall(grpc::Channel& channel, const std::string& method,
                                 const std::string& request, std::string* response) {
  grpc::ClientContext context;
  SetDeadline(context, 10);
  grpc::ByteBuffer out;
  grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      &channel, grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC),
      &context, ToByteBuffer(request), &out);
  if (status.ok()) *response = FromByteBuffer(out);
  return status;
}

// grpc.health.v1.Health/Check: the ServingStatus (1 SERVING, 2 NOT_SERVING).
struct HealthResult {
  grpc::Status status;
  int serving_status = 0;
};

inline HealthResult CheckHealth(grpc::Channel& channel, const std::string& service) {
  HealthResult result;
  std::string response;
  result.status = RawUnaryCall(channel, "/grpc.health.v1.Health/Check",
                               service.empty() ? "" : EncodeBytesField(1, service), &response);
  if (result.status.ok()) {
    WireFields fields = WireFields::Parse(response);
    auto it = fields.varints.find(1);
    result.serving_status = it == fields.varints.end() ? 0 : static_cast<int>(it->second);
  }
  return result;
}

// One request/response exchange on
// grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo (raw
// ServerReflectionRequest/Response bytes).
inline std::string ReflectionCall(grpc::Channel& channel, const std::string& request,
                                  grpc::Status* status) {
  grpc::ClientContext context;
  SetDeadline(context, 10);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          &channel,
          grpc::internal::RpcMethod(
              "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
              grpc::internal::RpcMethod::BIDI_STREAMING),
          &context));
  std::string response;
  if (stream->Write(ToByteBuffer(request))) {
    grpc::ByteBuffer buffer;
    if (stream->Read(&buffer)) response = FromByteBuffer(buffer);
  }
  stream->WritesDone();
  *status = stream->Finish();
  return response;
}

// The service names (ServerReflectionRequest.list_services = 7).
inline std::vector<std::string> ReflectionListServices(grpc::Channel& channel,
                                                       grpc::Status* status) {
  const std::string response = ReflectionCall(channel, EncodeBytesField(7, ""), status);
  // ServerReflectionResponse { ListServiceResponse list_services_response = 6; }
  // ListServiceResponse { repeated ServiceResponse service = 1; }
  // ServiceResponse { string name = 1; }
  std::vector<std::string> names;
  for (const std::string& list : WireFields::Parse(response).All(6)) {
    for (const std::string& service : WireFields::Parse(list).All(1)) {
      for (const std::string& name : WireFields::Parse(service).All(1)) names.push_back(name);
    }
  }
  return names;
}

// The serialized FileDescriptorProtos of the file defining `symbol`
// (file_containing_symbol = 4), concatenated.
inline std::string ReflectionFileContainingSymbol(grpc::Channel& channel, const std::string& symbol,
                                                  grpc::Status* status) {
  const std::string response = ReflectionCall(channel, EncodeBytesField(4, symbol), status);
  // ServerReflectionResponse { FileDescriptorResponse file_descriptor_response = 4; }
  // FileDescriptorResponse { repeated bytes file_descriptor_proto = 1; }
  std::string files;
  for (const std::string& fdr : WireFields::Parse(response).All(4)) {
    for (const std::string& file : WireFields::Parse(fdr).All(1)) files += file;
  }
  return files;
}

// ---------------------------------------------------------------------------
// The real drt-server binary as a child process.

// drt-server's arguments for the fixture model on 127.0.0.1:0 with the given
// shutdown grace period; `http_listen` "" turns the HTTP endpoint off. The
// CPU backend explicitly: drt-server's default, auto, would pick CUDA on a
// GPU machine, and these tests are about the server, not the backend (a
// later --device argument overrides this one).
inline std::vector<std::string> ServerProcessArgs(int64_t grace_seconds,
                                                  const std::string& http_listen = "127.0.0.1:0") {
  return {"--model",       FixtureDir(), "--listen",
          "127.0.0.1:0",   "--http_listen", http_listen,
          "--shutdown_grace_seconds", std::to_string(grace_seconds), "--device=cpu"};
}

class ServerProcess {
 public:
  // Starts `binary args...` with stdout on a pipe (and stderr into the file
  // `stderr_path` when it is not empty); waits (up to `startup_seconds`) for
  // its "listening on host:port" line.
  ServerProcess(const std::string& binary, const std::vector<std::string>& args,
                double startup_seconds = 60, const std::string& stderr_path = "") {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    if (!stderr_path.empty()) {
      posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, fds[1]);
    // The test runner may have SIGTERM blocked or ignored in odd harnesses;
    // the child starts with default signal handling and an empty mask.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t empty, all;
    sigemptyset(&empty);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &empty);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::vector<std::string> argv_strings = {binary};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, binary.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(fds[1]);
    out_fd_ = fds[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("posix_spawn " + binary + " failed: " + std::to_string(rc));
    }
    try {
      WaitListening(startup_seconds);
    } catch (...) {
      Kill();
      throw;
    }
  }
  ~ServerProcess() { Kill(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  const std::string& address() const { return address_; }  // host:port, gRPC
  // What the server wrote to stdout up to its "listening on" line.
  const std::string& startup_output() const { return stdout_; }
  pid_t pid() const { return pid_; }
  void Signal(int signal) { kill(pid_, signal); }

  // Waits for the exit; the wait status, or nullopt after `timeout_seconds`.
  std::optional<int> WaitExit(double timeout_seconds) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
    while (true) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        return status;
      }
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  void Kill() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      exited_ = true;
    }
    if (out_fd_ >= 0) close(out_fd_);
    out_fd_ = -1;
  }

  void WaitListening(double startup_seconds) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(startup_seconds * 1000));
    while (true) {
      const size_t at = stdout_.find("listening on ");
      if (at != std::string::npos) {
        const size_t end = stdout_.find_first_of(" \n", at + 13);
        if (end != std::string::npos) {
          address_ = stdout_.substr(at + 13, end - at - 13);
          break;
        }
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) throw std::runtime_error("drt-server did not report its address: " + stdout_);
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buffer[4096];
      const ssize_t n = read(out_fd_, buffer, sizeof(buffer));
      if (n <= 0) throw std::runtime_error("drt-server exited before listening: " + stdout_);
      stdout_.append(buffer, n);
    }
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool exited_ = false;
  std::string stdout_;
  std::string address_;
};

// Starts `binary args...`, waits until it listens, stops it with SIGTERM
// and returns what it wrote to stderr (through a file in `scratch_dir`);
// nullopt when it has not exited `exit_seconds` after the signal.
inline std::optional<std::string> StderrOfStartAndStop(const std::string& binary,
                                                       const std::vector<std::string>& args,
                                                       const std::string& scratch_dir,
                                                       double exit_seconds = 30) {
  const std::string err_path = scratch_dir + "/stderr";
  {
    ServerProcess server(binary, args, 60, err_path);
    server.Signal(SIGTERM);
    if (!server.WaitExit(exit_seconds).has_value()) return std::nullopt;
  }
  std::ifstream in(err_path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace drt::server::testing
