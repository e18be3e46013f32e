// The drt.v1.Drt gRPC service: sessions, Append, Generate, Complete, fork,
// info. Engine work goes through the Scheduler (server/scheduler.h), whose
// one engine thread runs batched steps over all sessions: decode first, the
// prompt pieces of all sessions sharing the rest of each step, so sessions
// interleave and cancellation is seen between steps.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "drt/v1/drt.grpc.pb.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "server/limits.h"
#include "server/prefix_cache.h"
#include "server/scheduler.h"
#include "server/metrics.h"

namespace drt::server {

struct ServiceOptions {
  std::string model_name;
  std::string device = "cpu";
  std::string precision = "fp32";  // ModelInfo.precision
  int64_t max_sessions = 64;
  int64_t max_context_tokens = kDefaultMaxContextTokens;  // per session
  int64_t idle_ttl_seconds = 3600;
  // All sessions' host memory. drt-server sets it from the machine's memory
  // (server/host_memory.h) unless --host_memory_budget_gb is given.
  int64_t host_memory_budget_bytes = 8LL << 30;
  // The scheduler's tokens per engine step (server/scheduler.h); 0: the
  // engine's step size.
  int64_t step_tokens = 0;
  // SchedulerOptions::decode_slowdown_limit and decode_step_prefill_tokens.
  double decode_slowdown_limit = kDefaultDecodeSlowdownLimit;
  int64_t decode_step_prefill_tokens = kNoPrefillTokenCap;
  // SchedulerOptions::durable_ack_tokens (--state_ack_tokens).
  int64_t durable_ack_tokens = kDefaultDurableAckTokens;
  // The prefix cache for Complete (server/prefix_cache.h; docs/api.md,
  // "Prefix reuse"): --prefix_cache_bytes and --prefix_cache_entries. Off
  // here (0, 0), so that an embedder or a test opts in; drt-server's flags
  // turn it on by default (server/server_flags.h).
  PrefixCacheLimits prefix_cache;
  std::string bearer_token;  // empty: no authentication
  // --max_message_bytes: a request message larger than this is refused by
  // name (server/request_parsing.h), INVALID_ARGUMENT, and ModelInfo reports
  // it (max_message_bytes). gRPC's own receive limit must be GrpcReceiveLimit
  // of it (main and the tests' server set it).
  int64_t max_message_bytes = 4 << 20;
  // Where SaveSession writes and LoadSession reads; empty: both refused.
  std::string session_files_dir;
  // Tests only: called by SaveSession with the session's id once its file
  // is committed, while the save still holds the session's engine step (a
  // test deletes the session there).
  std::function<void(const std::string& session_id)> after_session_file_saved_for_test;
  // SchedulerOptions::before_progress (tests only).
  std::function<void()> before_progress_for_test;
  // SchedulerOptions::on_step_formed (tests only), with the service's
  // scheduler: a test holds a step until the items it wants in the next one
  // are queued (Scheduler::queued).
  std::function<void(const StepRecord& step, const Scheduler& scheduler)>
      on_step_formed_for_test;
  // Tests only: Complete with n > 1 calls it before writing each piece of
  // choice `choice`, with the tokens that choice sent so far; a status that
  // is not OK fails that choice with it (as a failed engine step would).
  std::function<absl::Status(int32_t choice, int64_t tokens_sent)> choice_piece_for_test;
};

class SessionManager;
class Scheduler;

class DrtService final : public drt::v1::Drt::Service {
 public:
  // model and backend must outlive the service.
  DrtService(const Model& model, Backend& backend, Metrics& metrics, ServiceOptions options);
  ~DrtService() override;

  // From now on new calls get UNAVAILABLE; running streams go on. No
  // durable session expires any more (SessionManager::StopExpiringDurable).
  void StartDraining();
  // Waits until no call is running or `deadline` passes; true when none is.
  bool WaitForRunningCalls(std::chrono::steady_clock::time_point deadline);
  // Ends the grace period: every running call ends at its next engine step
  // with UNAVAILABLE "the server is shutting down". (A call that waits for
  // its client's next message sees that only when the message comes; gRPC's
  // Shutdown cancels it before that.)
  void StopRunningCalls();
  // The sessions (main restores durable ones into it before serving).
  SessionManager& session_manager() { return *sessions_; }
  // The prefix cache (server/prefix_cache.h; its figures, for tests).
  PrefixCache& prefix_cache() { return *prefix_cache_; }
  // The engine's queue and last progress, for liveness
  // (server/engine_watchdog.h). Lock-free.
  Scheduler::EngineProgress engine_progress() const;

  // Every method reads its requests as raw bytes and parses them
  // (server/request_parsing.h): a message over --max_message_bytes or one
  // that does not parse ends the call with INVALID_ARGUMENT naming it and the
  // cause (gRPC's typed reading would end a stream as if the client had
  // closed it, and a unary call with INTERNAL and no message). The
  // constructor installs the handlers that do: AppendStream, GenerateStream
  // and CompleteStream, and for each unary method one that parses its
  // request and calls the method below.
  grpc::Status CreateSession(grpc::ServerContext* context,
                             const drt::v1::CreateSessionRequest* request,
                             drt::v1::CreateSessionResponse* response) override;
  grpc::Status AppendStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<drt::v1::AppendResponse, grpc::ByteBuffer>* stream);
  grpc::Status GenerateStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<drt::v1::GenerateResponse, grpc::ByteBuffer>* stream);
  grpc::Status CompleteStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<drt::v1::GenerateResponse, grpc::ByteBuffer>* stream);
  grpc::Status ForkSession(grpc::ServerContext* context,
                           const drt::v1::ForkSessionRequest* request,
                           drt::v1::SessionInfo* response) override;
  grpc::Status GetSession(grpc::ServerContext* context, const drt::v1::GetSessionRequest* request,
                          drt::v1::SessionInfo* response) override;
  grpc::Status ListSessions(grpc::ServerContext* context,
                            const drt::v1::ListSessionsRequest* request,
                            drt::v1::ListSessionsResponse* response) override;
  grpc::Status DeleteSession(grpc::ServerContext* context,
                             const drt::v1::DeleteSessionRequest* request,
                             drt::v1::DeleteSessionResponse* response) override;
  grpc::Status SaveSession(grpc::ServerContext* context,
                           const drt::v1::SaveSessionRequest* request,
                           drt::v1::SaveSessionResponse* response) override;
  grpc::Status LoadSession(grpc::ServerContext* context,
                           const drt::v1::LoadSessionRequest* request,
                           drt::v1::SessionInfo* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context,
                            const drt::v1::GetModelInfoRequest* request,
                            drt::v1::ModelInfo* response) override;
  // The tokenizer alone (server/tokenize_calls.h): no session, no engine.
  grpc::Status Tokenize(grpc::ServerContext* context, const drt::v1::TokenizeRequest* request,
                        drt::v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context,
                          const drt::v1::DetokenizeRequest* request,
                          drt::v1::DetokenizeResponse* response) override;

 private:
  // UNAUTHENTICATED / UNAVAILABLE checks shared by every method; counts the
  // request in the metrics.
  grpc::Status Admit(grpc::ServerContext* context, const char* method);
  grpc::Status Finish(const grpc::Status& status);

  // Installs the handler of the unary method `name`: it reads the request
  // (ReadSingleRequest), calls `typed` and writes its response.
  template <typename Request, typename Response>
  void ServeUnaryFromBytes(const char* name,
                           grpc::Status (DrtService::*typed)(grpc::ServerContext*, const Request*,
                                                             Response*));
  // Reads and parses the one request of a unary or server-streaming call
  // of `method`: nullopt with `request` set, or else the call's final
  // status (INVALID_ARGUMENT naming the method and the cause), given after
  // Admit (credentials and the drain come first; the call is counted).
  template <typename Stream>
  std::optional<grpc::Status> ReadSingleRequest(grpc::ServerContext* context, Stream& stream,
                                                const char* method,
                                                google::protobuf::Message* request);
  grpc::Status GenerateTo(grpc::ServerContext* context, const drt::v1::GenerateRequest& request,
                          const std::function<bool(const drt::v1::GenerateResponse&)>& write);

  const Model& model_;
  Backend& backend_;
  Metrics& metrics_;
  ServiceOptions options_;
  std::atomic<bool> draining_{false};
  // Calls between Admit and Finish (every handler calls each once).
  std::mutex running_mutex_;
  std::condition_variable running_changed_;
  int64_t running_calls_ = 0;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<Scheduler> scheduler_;
  // After sessions_: it goes first, deleting its snapshots' sessions.
  std::unique_ptr<PrefixCache> prefix_cache_;
};

}  // namespace drt::server
