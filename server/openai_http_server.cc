#include "server/openai_http_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <ctime>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <unordered_map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "drt/v1/drt.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/bearer_token.h"
#include "server/connection_pool.h"
#include "server/http_endpoint.h"
#include "server/http_connection_io.h"
#include "server/openai_api.h"
#include "server/openai_auth_refusals.h"
#include "server/openai_tokenize.h"
#include "server/request_bytes_admission.h"
#include "server/request_parsing.h"
#include "server/session_manager.h"
#include "server/stop_text_cutter.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt::server {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kJson[] = "application/json";
// What the API serves, for the 404s and 405s that name it.
constexpr char kServed[] =
    "served: POST /v1/completions, GET /v1/models, POST /tokenize, POST /detokenize, "
    "GET /tokenizer_info (also as /v1/tokenize, /v1/detokenize, /v1/tokenizer_info), GET /health";
// The paths of the probe endpoint (--http_listen), which a 404 here points to.
bool IsProbePath(const std::string& path) {
  return path == "/healthz" || path == "/livez" || path == "/metrics";
}
// "no such path: GET /metrics (...)", pointing a probe path to its endpoint.
std::string NoSuchPath(const httplib::Request& req) {
  return absl::StrCat("no such path: ", req.method, " ", req.path, " (", kServed, ")",
                      IsProbePath(req.path)
                          ? "; GET /healthz, /livez and /metrics are served on the "
                            "--http_listen endpoint (port 9090 by default), not on this API's"
                          : "");
}
// vLLM's tokenizer paths, and the same under /v1/, which the gateway
// (deploy/k8s/gateway) routes to the OpenAI API with the rest of /v1/.
bool IsTokenizerPath(const std::string& path) {
  return path == "/tokenize" || path == "/detokenize" || path == "/v1/tokenize" ||
         path == "/v1/detokenize";
}
// vLLM's GET /tokenizer_info (lm-evaluation-harness's "remote" tokenizer
// asks for it), and the same under /v1/.
bool IsTokenizerInfoPath(const std::string& path) {
  return path == "/tokenizer_info" || path == "/v1/tokenizer_info";
}
// The routes that take a request body.
bool TakesBody(const httplib::Request& req) {
  return req.method == "POST" && (req.path == "/v1/completions" || IsTokenizerPath(req.path));
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return ServiceStatus(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// A prompt over the context limit (the temporary session's, the server's
// --max_context_tokens) in OpenAI's shape: 400,
// invalid_request_error, code context_length_exceeded, param "prompt".
// (Not 429, which clients retry: it can never succeed. A prompt that fits
// with too large a max_tokens is refused up front, param "max_tokens":
// RoomForMaxTokens.)
std::string ContextLengthErrorJson(absl::string_view message) {
  return ErrorJson(message, "invalid_request_error", "prompt", "context_length_exceeded");
}

// Every 503 carries Retry-After (kRetryAfterSeconds). The session limit
// (every session held: by running completions, each of which holds one per
// choice, n of them, or by gRPC clients; n above --max_sessions is refused
// before, 400 naming n) is answered 503 "unavailable", not 429: it is a load to
// wait out, as all threads busy is, and unlike the other
// RESOURCE_EXHAUSTED it says nothing about the request. The context limit
// is 400 (above); the memory budget stays 429 (it passes as running
// requests end).
//
// `label`: "prompt[i]" for a batch's prompt i, whose errors start with it
// ("prompt[1]: ..."); "" for a request of one prompt.
std::string Labeled(absl::string_view label, absl::string_view message) {
  return label.empty() ? std::string(message) : absl::StrCat(label, ": ", message);
}
void SendError(httplib::Response& res, absl::Status status, absl::string_view label = "") {
  // Classified before the label goes on (IsSessionLimitRefusal reads the
  // message's start).
  if (SessionManager::IsContextLimitRefusal(status)) {
    res.status = 400;
    res.set_content(ContextLengthErrorJson(Labeled(label, status.message())), kJson);
    return;
  }
  if (SessionManager::IsSessionLimitRefusal(status)) {
    status = absl::UnavailableError(status.message());
  }
  res.status = HttpStatusFor(status.code());
  if (res.status == 503) res.set_header("Retry-After", absl::StrCat(kRetryAfterSeconds));
  if (!label.empty()) {
    absl::Status labeled(status.code(), Labeled(label, status.message()));
    status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
      labeled.SetPayload(url, payload);  // the param
    });
    status = labeled;
  }
  res.set_content(ErrorJson(status), kJson);
}

// The Complete calls whose status the handlers have not read yet, and the
// handlers that make several calls (Hold). The drain waits for it to reach
// 0 before gRPC's Shutdown (server/main.cc).
class CallCount {
 public:
  // Counts one while it lives. A handler that makes several calls (a
  // batch's prompts, one after another; GetModelInfo or Tokenize before
  // Complete) holds one for all of them: else the count passes through 0
  // between two, the drain shuts gRPC down there, and the next call runs on
  // a transport that is gone (a crash, review-lmeval F1).
  class Hold {
   public:
    explicit Hold(CallCount& count) : count_(count) { count_.Add(1); }
    ~Hold() { count_.Add(-1); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    CallCount& count_;
  };

  void Add(int n) {
    std::lock_guard<std::mutex> lock(mutex_);
    count_ += n;
    if (count_ == 0) zero_.notify_all();
  }
  bool WaitForZero(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    return zero_.wait_until(lock, deadline, [&] { return count_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable zero_;
  int64_t count_ = 0;
};

// One Complete call, shared by the handler and (streaming) the content
// provider that httplib runs after it on the same thread.
struct CompleteCall {
  explicit CompleteCall(CallCount& count) : running(count) { running.Add(1); }
  CallCount& running;  // counts this call until its status is read
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<drt::v1::CompleteRequest, drt::v1::GenerateResponse>>
      stream;
  bool finished = false;
  // Last: stopped (joined) before the context it cancels goes.
  std::unique_ptr<DisconnectWatch> watch;

  // Reads what is left and ends the call.
  grpc::Status Finish() {
    drt::v1::GenerateResponse ignored;
    while (stream->Read(&ignored)) {
    }
    grpc::Status status = stream->Finish();
    if (!finished) running.Add(-1);
    finished = true;
    return status;
  }
  ~CompleteCall() {
    watch.reset();
    if (stream != nullptr && !finished) {
      context.TryCancel();
      Finish();
    }
    if (!finished) running.Add(-1);  // no stream was made
  }
};

// One choice's text, cut at stop strings, how it ended, and (when asked)
// its tokens' logprobs.
struct ChoiceProgress {
  explicit ChoiceProgress(const CompletionRequest& request)
      : cutter(std::vector<std::string>(request.generate.stop().begin(),
                                        request.generate.stop().end()),
               request.include_stop_str) {
    if (request.logprobs.has_value()) logprobs.emplace(*request.logprobs);
  }
  StopTextCutter cutter;
  std::optional<drt::v1::GenerateDone> done;
  // Every generated token is listed, the one that completed a stop string
  // too (as usage counts it), though the text leaves that string out.
  std::optional<LogprobsCollector> logprobs;
  bool echoed = false;  // with echo: the prompt went with this choice's first text

  std::string finish_reason() const {
    return cutter.stopped() ? "stop" : FinishReasonName(done->finish_reason());
  }
  // The logprobs entries not sent yet; nullopt when not asked for.
  std::optional<ChoiceLogprobs> TakeLogprobs() {
    if (!logprobs.has_value()) return std::nullopt;
    return logprobs->Take();
  }
};

// The completion's choices (n of them; Complete tags each message with its
// choice when n > 1).
struct CompletionProgress {
  explicit CompletionProgress(const CompletionRequest& request)
      : choices(request.n, ChoiceProgress(request)),
        echo(request.echo),
        prompt_text(request.echo ? request.prompt_text : "") {}
  std::vector<ChoiceProgress> choices;
  // echo: the prompt's text (a text prompt's as sent; a token-id prompt's
  // as SpellPromptIds spelled it) starts each choice's text, and its
  // scores' entries each choice's logprobs; the scores all come before any
  // piece.
  bool echo;
  std::string prompt_text;
  std::vector<drt::v1::PromptLogprobs> prompt_scores;
  int32_t done_count = 0;
  absl::Status status;  // the first message refused (a choice out of range, logprobs short)

  // The choice a response is about, and the text it adds (for a piece: what
  // the cutter lets out now; for its final message: what it held back).
  // nullopt for a response refused (status says why) or of no choice.
  struct Taken {
    int32_t choice;
    std::string text;
  };
  std::optional<Taken> Take(const drt::v1::GenerateResponse& response) {
    if (!status.ok()) return std::nullopt;
    if (response.has_prompt_logprobs()) {
      prompt_scores.push_back(response.prompt_logprobs());
      return std::nullopt;
    }
    const int32_t index = response.has_piece()  ? response.piece().choice()
                          : response.has_done() ? response.done().choice()
                                                : 0;
    if (index < 0 || index >= static_cast<int32_t>(choices.size())) {
      status = absl::InternalError(absl::StrCat("Complete sent a message of choice ", index, " of ",
                                                choices.size()));
      return std::nullopt;
    }
    ChoiceProgress& choice = choices[index];
    std::string echo_text;
    if (echo && !choice.echoed) {
      choice.echoed = true;
      echo_text = prompt_text;
      if (choice.logprobs.has_value()) {
        for (const drt::v1::PromptLogprobs& scores : prompt_scores) {
          status = choice.logprobs->AddPrompt(scores);
          if (!status.ok()) return std::nullopt;
        }
      }
    }
    if (response.has_piece()) {
      if (choice.logprobs.has_value()) {
        status = choice.logprobs->Add(response.piece());
        if (!status.ok()) return std::nullopt;
      }
      return Taken{index, echo_text + choice.cutter.Push(response.piece().text())};
    }
    if (response.has_done()) {
      if (choice.done.has_value()) {
        status = absl::InternalError(absl::StrCat("Complete ended choice ", index, " twice"));
        return std::nullopt;
      }
      choice.done = response.done();
      ++done_count;
      return Taken{index, echo_text + choice.cutter.Finish()};
    }
    return std::nullopt;
  }
  bool all_done() const { return done_count == static_cast<int32_t>(choices.size()); }
  // Prompt tokens once, the generated tokens of every choice.
  Usage usage() const {
    Usage usage{choices[0].done->timings().prompt_tokens(), 0,
                choices[0].done->timings().cached_prompt_tokens()};
    for (const ChoiceProgress& c : choices) usage.completion_tokens += c.done->timings().generated_tokens();
    return usage;
  }
};

void ChatNotServed(httplib::Response& res) {
  res.status = 404;
  res.set_content(
      ErrorJson("/v1/chat/completions is not served: the models drt-server serves are base "
                "models without a chat template; use /v1/completions with a prompt",
                "invalid_request_error", "", "not_found"),
      kJson);
}

// What a connection closed unserved gets (server/connection_pool.h): no
// thread took it before its header time passed, too many were waiting, or
// no thread could be started.
std::string OverloadedResponse() {
  return CannedResponse(
      503, "Service Unavailable", kJson,
      ErrorJson("the OpenAI HTTP API is overloaded: no thread was free to serve this connection "
                "in time; retry after the Retry-After seconds",
                "server_error", "", "overloaded"),
      kRetryAfterSeconds);
}

std::string RandomHex(std::random_device& random, int digits) {
  std::string out;
  while (static_cast<int>(out.size()) < digits) out += absl::StrFormat("%08x", random());
  return out.substr(0, digits);
}

}  // namespace

class OpenAiHttpServer::Server : public httplib::Server {
 public:
  Server(std::shared_ptr<grpc::Channel> channel, const OpenAiHttpOptions& options,
         ConnectionPoolCounters& counters, RequestBytesAdmission& admission,
         OpenAiAuthRefusals& auth_refusals, const std::atomic<bool>& draining)
      : options_(options),
        counters_(counters),
        admission_(admission),
        auth_refusals_(auth_refusals),
        draining_(draining),
        stub_(drt::v1::Drt::NewStub(std::move(channel))) {
    // The accept loop only queues each socket with its accept time; the
    // pool's threads serve them (server/connection_pool.h).
    new_task_queue = [this] { return new InlineAcceptQueue([this] { pool_->Drain(); }); };
    set_payload_max_length(options_.max_request_bytes);
    // With a content reader: the body is read here, whatever its
    // Content-Type. (httplib's own reading parses an
    // application/x-www-form-urlencoded body, what `curl -d` sends without
    // -H, and refuses it with 413 above 8 KiB.)
    // Each POST route reads its body with ReadBody.
    const auto post = [this](const char* path,
                             void (Server::*handle)(const httplib::Request&, const std::string&,
                                                    httplib::Response&)) {
      Post(path, HandlerWithContentReader([this, handle](const httplib::Request& req,
                                                         httplib::Response& res,
                                                         const httplib::ContentReader& reader) {
        // The parse is admitted (or refused 503) once the body is read, at
        // its real size: a slow or stalled upload holds no admission, and
        // a small chunked body counts as small. The handler ends the
        // admission once the body is parsed (EndParse), and the scope ends
        // it whatever happens (an exception included).
        std::string body;
        if (!ReadBody(req, res, reader, body)) return;
        const ParseTickets::Scope parsing(parse_tickets_);
        if (AdmitParse(body.size(), res)) (this->*handle)(req, body, res);
      }));
    };
    post("/v1/completions", &Server::Completions);
    for (const char* path : {"/tokenize", "/v1/tokenize"}) post(path, &Server::Tokenize);
    for (const char* path : {"/detokenize", "/v1/detokenize"}) post(path, &Server::Detokenize);
    Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      Models(req, res);
    });
    for (const char* path : {"/tokenizer_info", "/v1/tokenizer_info"}) {
      Get(path, [this](const httplib::Request& req, httplib::Response& res) {
        TokenizerInfo(req, res);
      });
    }
    // The probe endpoint's readiness answer (/healthz), for clients and
    // load balancers that look for vLLM's /health on the API's port. No
    // credentials needed, as on the probe endpoint (pre-routing handler).
    Get("/health", [&draining](const httplib::Request&, httplib::Response& res) {
      AnswerReadiness(draining.load(), res);
    });
    Post("/v1/chat/completions", [](const httplib::Request&, httplib::Response& res) {
      ChatNotServed(res);
    });
    // Runs once httplib has parsed the headers, before it reads any body,
    // for every request. In this order: the credentials (401); both
    // Content-Length and Transfer-Encoding (400); a
    // Content-Length that is no number (400) or over the limit (413); a
    // body (Content-Length > 0 or a Transfer-Encoding) sent anywhere but
    // POST /v1/completions (404, or 405 for a served path's other method).
    // All are answered without reading the body: httplib would first read
    // (and, off that route, discard) it, a thread held up to the request
    // time (--openai_request_timeout_seconds), unauthenticated, and a
    // chunked body with no size limit.
    set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // The header deadline ends here, whatever bytes ended the headers.
      if (ConnectionStream* stream = ThisThreadsStream(); stream != nullptr) {
        stream->MarkHeadersRead();
      }
      // GET /health needs no credentials, as /healthz on the probe endpoint:
      // a load balancer's probe carries none, and it tells nothing else.
      const bool health = (req.method == "GET" || req.method == "HEAD") && req.path == "/health";
      if (absl::Status auth = CheckCredentials(req); !auth.ok() && !health) {
        auth_refusals_.Count();
        SendError(res, auth);
        return HandlerResponse::Handled;
      }
      // Both framings at once is the request-smuggling shape (RFC 9112
      // section 6.3): httplib reads the body as chunked, so the
      // Content-Length (what AdmitBody would count) says nothing of its size.
      if (req.has_header("Content-Length") && req.has_header("Transfer-Encoding")) {
        res.status = 400;
        res.set_content(ErrorJson("a request may not have both Content-Length and "
                                  "Transfer-Encoding (RFC 9112 section 6.3)",
                                  "invalid_request_error", "", ""),
                        kJson);
        return HandlerResponse::Handled;
      }
      uint64_t length = 0;
      if (req.has_header("Content-Length")) {
        const std::string value = req.get_header_value("Content-Length");
        if (value.empty() || value.size() > 19 ||
            !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          res.status = 400;
          res.set_content(
              ErrorJson(absl::StrCat("Content-Length must be a non-negative integer, got '",
                                     absl::CEscape(value.substr(0, 40)), "'"),
                        "invalid_request_error", "", ""),
              kJson);
          return HandlerResponse::Handled;
        }
        length = std::stoull(value);
        if (length > options_.max_request_bytes) {
          res.status = 413;
          res.set_content(ErrorJson(absl::StrCat("the request body is larger than drt-server "
                                                 "accepts (", options_.max_request_bytes,
                                                 " bytes, --openai_max_request_bytes)"),
                                    "invalid_request_error", "", ""),
                          kJson);
          return HandlerResponse::Handled;
        }
      }
      const bool has_body = length > 0 || req.has_header("Transfer-Encoding");
      if (!has_body || TakesBody(req)) {
        return HandlerResponse::Unhandled;
      }
      if (req.path == "/v1/chat/completions") {
        ChatNotServed(res);
      } else if (req.path == "/v1/completions" || req.path == "/v1/models" ||
                 req.path == "/health" || IsTokenizerPath(req.path) ||
                 IsTokenizerInfoPath(req.path)) {
        res.status = 405;
        res.set_header("Allow", req.path == "/v1/models" || req.path == "/health" ||
                                        IsTokenizerInfoPath(req.path)
                                    ? "GET"
                                    : "POST");
        res.set_content(ErrorJson(absl::StrCat(req.method, " ", req.path, " with a request body "
                                               "is not served (", kServed,
                                               "; GET /v1/models, GET /tokenizer_info and GET /health without a body)"),
                                  "invalid_request_error", "", "method_not_allowed"),
                        kJson);
      } else {
        res.status = 404;
        res.set_content(ErrorJson(NoSuchPath(req), "invalid_request_error", "", "not_found"),
                        kJson);
      }
      return HandlerResponse::Handled;
    });
    // httplib's own refusals (no route, 413 for a body over the limit, a
    // request that does not parse) in OpenAI's error shape too.
    set_error_handler(HandlerWithResponse([max_bytes = options_.max_request_bytes](
                                              const httplib::Request& req,
                                              httplib::Response& res) {
      if (!res.body.empty()) return HandlerResponse::Unhandled;  // ours, already shaped
      std::string message;
      if (res.status == 404) {
        message = NoSuchPath(req);
      } else if (res.status == 413) {
        message = absl::StrCat("the request body is larger than drt-server accepts (",
                               max_bytes, " bytes, --openai_max_request_bytes)");
      } else {
        message = absl::StrCat("HTTP ", res.status, " for ", req.method, " ", req.path);
      }
      res.set_content(ErrorJson(message, res.status >= 500 ? "server_error" : "invalid_request_error",
                                "", res.status == 404 ? "not_found" : ""),
                      kJson);
      return HandlerResponse::Handled;
    }));
  }

  // From now on reads and writes of every connection give up (within
  // 100 ms): Stop does not wait for a client that sends or reads slowly.
  void StartStopping() { stopping_.store(true); }
  bool WaitForCalls(Clock::time_point deadline) { return calls_.WaitForZero(deadline); }

 private:
  // httplib's accept loop calls this, on its own thread, for each accepted
  // socket: it waits for a pool thread, its deadlines counting from now.
  bool process_and_close_socket(socket_t sock) override {
    pool_->Push(sock, Clock::now());
    return true;
  }

  // On a pool thread: one request per connection (an idle kept-alive
  // connection would hold a thread of the bounded pool), the socket noted
  // for the thread so that the handler can watch it for a hang-up.
  // `header_deadline` is the accept time + request_header_timeout.
  void Serve(socket_t sock, Clock::time_point header_deadline) {
    const Clock::time_point accepted = header_deadline - header_timeout_;
    ConnectionStream stream(sock, header_deadline, accepted + options_.request_read_timeout,
                            options_.write_timeout, stopping_);
    {
      std::lock_guard<std::mutex> lock(sockets_mutex_);
      sockets_[std::this_thread::get_id()] = {sock, &stream};
    }
    bool connection_closed = false;
    process_request(stream, /*close_connection=*/true, connection_closed, nullptr);
    {
      std::lock_guard<std::mutex> lock(sockets_mutex_);
      sockets_.erase(std::this_thread::get_id());
    }
    if (stream.headers_read()) {
      LingeringClose(sock);
    } else {  // nothing was answered (a silent or slow client): no wait
      ::shutdown(sock, SHUT_RDWR);
      ::close(sock);
    }
  }

  // Closes `sock` once the answer is out. A request may be answered before
  // its body was read (401, or 413/400 for its Content-Length): closing a
  // socket with unread bytes sends a reset, which can destroy the answer
  // before the client reads it (a client still sending gets ECONNRESET).
  // So: end our side, then read and drop what the client still sends until
  // it closes, for at most kLingerTime (not when stopping).
  void LingeringClose(socket_t sock) const {
    ::shutdown(sock, SHUT_WR);
    const Clock::time_point until = Clock::now() + kLingerTime;
    char buffer[16384];
    while (!stopping_.load()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) break;
      pollfd p{sock, POLLIN, 0};
      const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
      if (ready < 0 && errno != EINTR) break;
      if (ready > 0 && recv(sock, buffer, sizeof(buffer), 0) <= 0) break;  // closed, or broken
    }
    ::close(sock);
  }
  static constexpr std::chrono::milliseconds kLingerTime{1000};

  socket_t ThisThreadsSocket() {
    std::lock_guard<std::mutex> lock(sockets_mutex_);
    auto it = sockets_.find(std::this_thread::get_id());
    return it == sockets_.end() ? INVALID_SOCKET : it->second.sock;
  }
  ConnectionStream* ThisThreadsStream() {
    std::lock_guard<std::mutex> lock(sockets_mutex_);
    auto it = sockets_.find(std::this_thread::get_id());
    return it == sockets_.end() ? nullptr : it->second.stream;
  }

  // The request's credentials, checked first for every request (by the
  // pre-routing handler, before its body is read): an Authorization value with a
  // byte outside printable ASCII (0x20-0x7E: a TAB, UTF-8, which HTTP
  // allows) is refused, since gRPC metadata cannot carry it (gRPC calls
  // that "API misuse" and aborts the process); with a bearer token set, the
  // header must be "Bearer <token>" (the service checks it again).
  absl::Status CheckCredentials(const httplib::Request& req) const {
    const std::string authorization = req.get_header_value("Authorization");
    for (const unsigned char c : authorization) {
      if (c < 0x20 || c > 0x7E) {
        return absl::UnauthenticatedError(
            "the Authorization header holds bytes outside printable ASCII (0x20-0x7E)");
      }
    }
    if (!options_.bearer_token.empty() &&
        !BearerTokenMatches(authorization, options_.bearer_token)) {
      return absl::UnauthenticatedError(
          "missing or wrong credentials: send the header 'Authorization: Bearer <token>'");
    }
    return absl::OkStatus();
  }

  // Forwards the Authorization header (CheckCredentials passed), so the
  // service checks it as for any gRPC client. It is the only request header
  // forwarded.
  static void Authorize(const httplib::Request& req, grpc::ClientContext& context) {
    const std::string authorization = req.get_header_value("Authorization");
    if (!authorization.empty()) context.AddMetadata("authorization", authorization);
  }

  // Admits the parse of a body of `bytes` (read whole) under
  // --openai_max_inflight_request_bytes; false with a 503 and Retry-After
  // in `res` when it does not fit now.
  bool AdmitParse(size_t bytes, httplib::Response& res) {
    std::optional<RequestBytesAdmission::Ticket> ticket = admission_.TryAdmit(bytes);
    if (!ticket.has_value()) {
      SendError(res, absl::UnavailableError(absl::StrCat(
                         "overloaded: this request's body (", bytes, " bytes) does not fit beside "
                         "the bodies being parsed now (at most ", admission_.capacity(),
                         " bytes at once, --openai_max_inflight_request_bytes); retry after the "
                         "Retry-After seconds")));
      return false;
    }
    parse_tickets_.Hold(*std::move(ticket));
    return true;
  }

  // Reads the request's body into `body`; false when it could not be (too
  // large, not in time, the credentials), with `res` set to say why.
  bool ReadBody(const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader, std::string& body) {
    if (absl::Status auth = CheckCredentials(req); !auth.ok()) {
      SendError(res, auth);
      return false;
    }
    bool too_big = false;
    const bool read = reader([&](const char* data, size_t n) {
      if (body.size() + n > options_.max_request_bytes) {
        too_big = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    if (!read) {
      // (httplib has set 413 itself for a Content-Length over the limit.)
      if (too_big || res.status == 413) {
        res.status = 413;
        res.set_content(ErrorJson(absl::StrCat("the request body is larger than drt-server "
                                               "accepts (", options_.max_request_bytes,
                                               " bytes, --openai_max_request_bytes)"),
                                  "invalid_request_error", "", ""),
                        kJson);
        return false;
      }
      // A body that did not come within the request time is 408 (which
      // clients such as openai-python retry); one that could not be read
      // for another reason (the client closed its end, say) stays 400.
      const ConnectionStream* stream = ThisThreadsStream();
      const bool timed_out = stream != nullptr && stream->request_time_passed();
      res.status = timed_out ? 408 : 400;
      res.set_content(
          ErrorJson(timed_out ? absl::StrCat("the request body did not arrive within the "
                                             "request time (",
                                             options_.request_read_timeout.count() / 1000.0,
                                             " s from the accept, "
                                             "--openai_request_timeout_seconds)")
                              : "the request body could not be read",
                    "invalid_request_error", "", ""),
          kJson);
      return false;
    }
    return true;
  }

  void Models(const httplib::Request& req, httplib::Response& res) {
    if (absl::Status auth = CheckCredentials(req); !auth.ok()) return SendError(res, auth);
    // Every handler that calls the service holds the count and checks the
    // drain first (RefusedWhileDraining): one arriving after the drain's
    // wait would call a gRPC server already shut down, which crashes in
    // gRPC (review-lmeval F1; the single-call handlers had the same gap).
    const CallCount::Hold hold(calls_);
    if (RefusedWhileDraining("the request was", res)) return;
    grpc::ClientContext context;
    Authorize(req, context);
    drt::v1::ModelInfo info;
    const grpc::Status status = stub_->GetModelInfo(&context, {}, &info);
    if (!status.ok()) return SendError(res, FromGrpc(status));
    res.set_content(ModelsJson(info, started_), kJson);
  }

  // A request's `model`, when given, must be the one served: else false,
  // with `res` the 404 model_not_found.
  bool ModelServed(const std::optional<std::string>& model, httplib::Response& res) const {
    if (!model.has_value() || *model == options_.model_name) return true;
    res.status = 404;
    res.set_content(ErrorJson(absl::StrCat("The model `", *model,
                                           "` does not exist: this server serves `",
                                           options_.model_name, "`"),
                              "invalid_request_error", "model", "model_not_found"),
                    kJson);
    return false;
  }

  // Whether a Tokenize or Detokenize call failed for the message limit
  // (--max_message_bytes): the service's refusal of the request by name, or
  // gRPC's own RESOURCE_EXHAUSTED (the only one these calls get), for a
  // request over gRPC's receive limit or an answer over the send limit.
  static bool OverMessageLimit(const grpc::Status& status) {
    return status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
           IsMessageSizeRefusal(absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                             status.error_message()));
  }

  // A Tokenize or Detokenize call's failure: the message limit is 413, not
  // 429 (a retry cannot succeed); its other refusals of the request are a
  // 400 naming `field`.
  static void SendTokenizerError(httplib::Response& res, const grpc::Status& status,
                                 const char* field) {
    if (OverMessageLimit(status)) {
      res.status = 413;
      res.set_content(ErrorJson(absl::StrCat("the request or its answer is larger than one gRPC "
                                             "message of drt-server (--max_message_bytes): ",
                                             status.error_message()),
                                "invalid_request_error", field, ""),
                      kJson);
      return;
    }
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      return SendError(res, FieldError(field, status.error_message()));
    }
    SendError(res, FromGrpc(status));
  }

  // vLLM's POST /tokenize, by the service's Tokenize.
  void Tokenize(const httplib::Request& req, const std::string& body, httplib::Response& res) {
    const CallCount::Hold hold(calls_);  // as Models
    absl::StatusOr<TokenizeHttpRequest> request = ParseTokenizeBody(body);
    parse_tickets_.EndParse();  // the parsed JSON is gone
    if (!request.ok()) return SendError(res, request.status());
    if (!ModelServed(request->model, res)) return;
    if (RefusedWhileDraining("the request was", res)) return;
    grpc::ClientContext context;
    Authorize(req, context);
    drt::v1::TokenizeResponse response;
    const grpc::Status status = stub_->Tokenize(&context, request->request, &response);
    if (!status.ok()) return SendTokenizerError(res, status, "prompt");
    res.set_content(TokenizeJson(response), kJson);
  }

  // vLLM's POST /detokenize, by the service's Detokenize.
  void Detokenize(const httplib::Request& req, const std::string& body, httplib::Response& res) {
    const CallCount::Hold hold(calls_);  // as Models
    absl::StatusOr<DetokenizeHttpRequest> request = ParseDetokenizeBody(body);
    parse_tickets_.EndParse();  // the parsed JSON is gone
    if (!request.ok()) return SendError(res, request.status());
    if (!ModelServed(request->model, res)) return;
    if (RefusedWhileDraining("the request was", res)) return;
    grpc::ClientContext context;
    Authorize(req, context);
    drt::v1::DetokenizeResponse response;
    const grpc::Status status = stub_->Detokenize(&context, request->request, &response);
    if (!status.ok()) return SendTokenizerError(res, status, "tokens");
    res.set_content(DetokenizeJson(response), kJson);
  }

  // The model's constants the max_tokens check needs (GetModelInfo: the
  // context limit, chunk size, default padding, vocabulary and special ids),
  // asked once and kept: they do not change while the server runs. False
  // with `res` set when the call fails (credentials, drain).
  bool ModelFacts(const httplib::Request& req, drt::v1::ModelInfo& info,
                  httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(model_info_mutex_);
      if (model_info_.has_value()) {
        info = *model_info_;
        return true;
      }
    }
    grpc::ClientContext context;
    Authorize(req, context);
    const grpc::Status status = stub_->GetModelInfo(&context, drt::v1::GetModelInfoRequest(), &info);
    if (!status.ok()) {
      SendError(res, FromGrpc(status));
      return false;
    }
    std::lock_guard<std::mutex> lock(model_info_mutex_);
    model_info_ = info;
    return true;
  }

  // A prompt that fits the context limit with a max_tokens that does not
  // beside it and its padding to the chunk boundary (when the request pads:
  // the model's default, as the OpenAI API sets none) is refused before
  // anything runs, 400 param max_tokens (as OpenAI and vLLM do), and one
  // that leaves no room for its padding and a token, param prompt. A text
  // prompt's count is the service's Tokenize (count_only); an id prompt's
  // is its length, with no call (its ids were checked by PromptIdsAccepted).
  // False with `res` set when refused or when a call fails; a text prompt
  // larger than one gRPC message is not checked (its completion ends at the
  // limit with "length", as before).
  // `label`: "prompt[i]" in a batch ("" alone), which starts the refusal's
  // message; a batch's prompt over the context limit is refused here too
  // (CheckPromptFitsContext), echo with max_tokens 0 included, so that no
  // prompt runs before a later one is refused.
  bool RoomForMaxTokens(const httplib::Request& req, const CompletionRequest& request,
                        absl::string_view label, httplib::Response& res) {
    const bool batch = !label.empty();
    // Echo with max_tokens 0 generates nothing and pads nothing (Complete's
    // prompt_only): a prompt within the limit is all it needs, which the
    // service checks as it ingests (review-echo E2); in a batch it is
    // counted here (review-lmeval F2).
    if (request.prompt_only && !batch) return true;
    drt::v1::ModelInfo info;
    if (!ModelFacts(req, info, res)) return false;
    int64_t prompt_tokens = 0;
    if (request.prompt_is_ids) {
      prompt_tokens = static_cast<int64_t>(request.prompt_ids.size());
    } else {
      grpc::ClientContext context;
      Authorize(req, context);
      drt::v1::TokenizeRequest count;
      count.set_count_only(true);
      count.set_text_bytes(request.prompt_text);
      drt::v1::TokenizeResponse counted;
      const grpc::Status status = stub_->Tokenize(&context, count, &counted);
      if (OverMessageLimit(status)) return true;
      if (!status.ok()) {
        SendError(res, FromGrpc(status));
        return false;
      }
      prompt_tokens = counted.count();
    }
    absl::Status room = batch ? CheckPromptFitsContext(prompt_tokens, info.max_context_tokens(),
                                                       !request.prompt_only)
                              : absl::OkStatus();
    if (room.ok() && !request.prompt_only) {
      const bool pad = request.generate.has_pad_to_chunk_boundary()
                           ? request.generate.pad_to_chunk_boundary()
                           : info.pad_to_chunk_boundary();
      const int64_t padding = ChunkPadding(prompt_tokens, info.enc_chunk_size(), pad);
      room = CheckRoomForMaxTokens(prompt_tokens, request.generate.max_tokens(),
                                   info.max_context_tokens(), padding, info.enc_chunk_size());
    }
    if (room.ok()) return true;
    res.status = 400;
    res.set_content(ErrorJson(Labeled(label, room.message()), "invalid_request_error",
                              OpenAiErrorParam(room), "context_length_exceeded"),
                    kJson);
    return false;
  }

  // An id prompt holding an id the engine refuses (outside the vocabulary,
  // the landmark id, the pad id) is refused before anything runs, echo with
  // max_tokens 0 included: 400 param "prompt" naming prompt[INDEX] as sent
  // (CheckPromptIds). The service would refuse it too, but only once the
  // 16 Ki-id pieces before it had run, naming the index within its piece.
  // False with `res` set when refused or when GetModelInfo fails.
  // `name`: the prompt's in the request ("prompt", or "prompt[i]" in a batch).
  bool PromptIdsAccepted(const httplib::Request& req, const CompletionRequest& request,
                         const std::string& name, httplib::Response& res) {
    if (!request.prompt_is_ids) return true;
    drt::v1::ModelInfo info;
    if (!ModelFacts(req, info, res)) return false;
    const absl::Status ids = CheckPromptIds(request.prompt_ids, info.vocab_size(),
                                            info.chunk_id(), info.pad_id(), name);
    if (ids.ok()) return true;
    SendError(res, ids);
    return false;
  }

  // With echo, a token-id prompt's text: its ids spelled by the service's
  // Detokenize in pieces of kPromptPieceIds (one gRPC message each), their
  // bytes joined before they are read as UTF-8 (SpellTokenBytes), into
  // request.prompt_text. Not from the prompt's scores, which would make an
  // echo without logprobs pay for scoring. False with `res` set when a call
  // fails (its ids were checked by PromptIdsAccepted).
  bool SpellPromptIds(const httplib::Request& req, CompletionRequest& request,
                      httplib::Response& res) {
    if (!request.echo || !request.prompt_is_ids) return true;
    std::vector<std::string> pieces;
    for (size_t at = 0; at < request.prompt_ids.size(); at += kPromptPieceIds) {
      const size_t n = std::min(kPromptPieceIds, request.prompt_ids.size() - at);
      grpc::ClientContext context;
      Authorize(req, context);
      drt::v1::DetokenizeRequest piece;
      piece.mutable_ids()->Add(request.prompt_ids.begin() + at,
                               request.prompt_ids.begin() + at + n);
      drt::v1::DetokenizeResponse spelled;
      const grpc::Status status = stub_->Detokenize(&context, piece, &spelled);
      if (!status.ok()) {
        SendTokenizerError(res, status, "prompt");
        return false;
      }
      pieces.push_back(std::move(*spelled.mutable_text_bytes()));
    }
    request.prompt_text = SpellTokenBytes(pieces);
    return true;
  }

  // GET /tokenizer_info: vLLM's answer from GetModelInfo, its eos_token
  // the first of the spellings a tokenizer.json names its end-of-text
  // token by (kEosSpellings) that the service's Tokenize turns into the
  // eos id alone; none does for the byte models (null).
  void TokenizerInfo(const httplib::Request& req, httplib::Response& res) {
    const CallCount::Hold hold(calls_);  // several calls
    if (RefusedWhileDraining("the request was", res)) return;
    drt::v1::ModelInfo info;
    if (!ModelFacts(req, info, res)) return;
    std::optional<std::string> eos;
    for (const std::string_view spelling : kEosSpellings) {
      if (info.eos_id() < 0) break;
      grpc::ClientContext context;
      Authorize(req, context);
      drt::v1::TokenizeRequest tokenize;
      tokenize.set_text(std::string(spelling));
      drt::v1::TokenizeResponse ids;
      const grpc::Status status = stub_->Tokenize(&context, tokenize, &ids);
      if (!status.ok()) return SendError(res, FromGrpc(status));
      if (ids.ids_size() == 1 && ids.ids(0) == info.eos_id()) {
        eos = std::string(spelling);
        break;
      }
    }
    res.set_content(TokenizerInfoJson(info, eos), kJson);
  }

  // One completion's Complete call, begun: the messages written and the
  // first answer read (the prompt's scores before it kept in `progress`).
  struct StartedCall {
    std::shared_ptr<CompleteCall> call;
    std::shared_ptr<CompletionProgress> progress;
    drt::v1::GenerateResponse first;
  };
  // Starts `request`'s Complete call. An error before the first answer
  // (after the prompt ran) is the call's status.
  absl::StatusOr<StartedCall> StartCall(const httplib::Request& req,
                                        const CompletionRequest& request) {
    StartedCall started;
    started.call = std::make_shared<CompleteCall>(calls_);
    CompleteCall& call = *started.call;
    Authorize(req, call.context);
    call.stream = stub_->Complete(&call.context);
    if (const socket_t sock = ThisThreadsSocket(); sock != INVALID_SOCKET) {
      call.watch = std::make_unique<DisconnectWatch>(
          sock, [context = &call.context] { context->TryCancel(); });
    }
    for (const drt::v1::CompleteRequest& message : CompleteMessages(request)) {
      if (!call.stream->Write(message)) break;  // the call ended: Finish says why
    }
    call.stream->WritesDone();
    // The first answer (after the prompt ran) decides the HTTP status: an
    // error before it is a plain error response. The prompt's scores (echo)
    // come during the prompt, so they are kept, not taken as that answer.
    started.progress = std::make_shared<CompletionProgress>(request);
    bool answered = call.stream->Read(&started.first);
    while (answered && started.first.has_prompt_logprobs()) {
      started.progress->Take(started.first);
      answered = call.stream->Read(&started.first);
    }
    if (!answered) {
      const grpc::Status status = call.Finish();
      return status.ok() ? absl::InternalError("Complete ended without an answer")
                         : FromGrpc(status);
    }
    return started;
  }

  // A started call read to its end: its choices and usage.
  struct FinishedCall {
    std::vector<CompletionChoice> choices;
    Usage usage;
  };
  absl::StatusOr<FinishedCall> ReadToEnd(StartedCall& started, const CompletionRequest& request) {
    const int32_t n = request.n;
    CompletionProgress& progress = *started.progress;
    std::vector<std::string> texts(n);
    drt::v1::GenerateResponse response = started.first;
    do {
      if (auto taken = progress.Take(response); taken.has_value()) {
        texts[taken->choice] += taken->text;
      }
    } while (started.call->stream->Read(&response));
    const grpc::Status status = started.call->Finish();
    if (!status.ok()) return FromGrpc(status);
    if (!progress.status.ok()) return progress.status;
    if (!progress.all_done()) {
      return absl::InternalError("Complete ended without its final message");
    }
    // vLLM's prompt_logprobs: the same list in every choice.
    std::optional<std::string> prompt_logprobs;
    if (request.prompt_logprobs.has_value()) {
      absl::StatusOr<std::string> json =
          PromptLogprobsJson(progress.prompt_scores, *request.prompt_logprobs);
      if (!json.ok()) return json.status();
      prompt_logprobs = *std::move(json);
    }
    FinishedCall out;
    for (int32_t i = 0; i < n; ++i) {
      ChoiceProgress& c = progress.choices[i];
      out.choices.push_back(
          {std::move(texts[i]), c.finish_reason(), c.TakeLogprobs(), prompt_logprobs});
    }
    out.usage = progress.usage();
    return out;
  }

  // Draining (SIGTERM): true with `res` set to 503 UNAVAILABLE (with
  // Retry-After, SendError) in the service's words, `what` saying what was
  // not run. Checked after a Hold is taken: then either the drain waits for
  // this handler, or it had passed its wait and this sees draining_ set
  // (set before the drain began), so no call goes to a gRPC server shut down.
  bool RefusedWhileDraining(absl::string_view what, httplib::Response& res) {
    if (!draining_.load()) return false;
    SendError(res, absl::UnavailableError(absl::StrCat(
                       "the server is shutting down; ", what,
                       " not run: retry the request on another replica")));
    return true;
  }

  void Completions(const httplib::Request& req, const std::string& body, httplib::Response& res) {
    // Held until the answer is built (a stream's call holds its own count
    // until the content provider reads its status).
    const CallCount::Hold hold(calls_);
    if (RefusedWhileDraining("the completion was", res)) return;
    absl::StatusOr<CompletionRequest> parsed = ParseCompletionRequest(body);
    parse_tickets_.EndParse();  // the parsed JSON is gone
    if (!parsed.ok()) return SendError(res, parsed.status());
    if (!ModelServed(parsed->model, res)) return;
    // A batch's prompts run one after another, each as a request of its own
    // (docs/api.md, "Batches"); every prompt is checked before any runs.
    std::vector<CompletionRequest> items = SplitBatch(*std::move(parsed));
    const bool batch = items.size() > 1;
    std::random_device random;
    for (size_t i = 0; i < items.size(); ++i) {
      CompletionRequest& item = items[i];
      const std::string label = batch ? absl::StrCat("prompt[", i, "]") : "";
      if (!PromptIdsAccepted(req, item, batch ? label : "prompt", res)) return;
      if (!RoomForMaxTokens(req, item, label, res)) return;
      if (!SpellPromptIds(req, item, res)) return;
      // Without a seed OpenAI samples afresh each time; drt.v1's unset seed
      // (0) would repeat one answer.
      if (!item.seed_given) {
        item.generate.mutable_sampling()->set_seed((uint64_t{random()} << 32) | random());
      }
    }
    CompletionHeader header{absl::StrCat("cmpl-", RandomHex(random, 24)),
                            static_cast<int64_t>(std::time(nullptr)), options_.model_name};
    if (batch) {
      // Prompt i's choice j is choice i*n+j (OpenAI's and vLLM's order);
      // usage sums the prompts'.
      std::vector<CompletionChoice> choices;
      Usage usage;
      for (size_t i = 0; i < items.size(); ++i) {
        const CompletionRequest& item = items[i];
        // A drain that began during prompt i-1 ends the batch: 503, the
        // whole request to retry (an HTTP answer cannot carry part of a
        // batch). The drain waits for this handler (hold), not for the rest.
        if (i > 0 && RefusedWhileDraining(absl::StrCat("prompt[", i, "] of ", items.size(),
                                                       " and those after it were"),
                                          res)) {
          return;
        }
        const std::string label = absl::StrCat("prompt[", i, "]");
        absl::StatusOr<StartedCall> started = StartCall(req, item);
        if (!started.ok()) return SendError(res, started.status(), label);
        absl::StatusOr<FinishedCall> finished = ReadToEnd(*started, item);
        if (!finished.ok()) return SendError(res, finished.status(), label);
        for (CompletionChoice& c : finished->choices) choices.push_back(std::move(c));
        usage.prompt_tokens += finished->usage.prompt_tokens;
        usage.completion_tokens += finished->usage.completion_tokens;
        usage.cached_tokens += finished->usage.cached_tokens;
      }
      res.set_content(CompletionJson(header, choices, usage), kJson);
      return;
    }
    const CompletionRequest& request = items[0];
    absl::StatusOr<StartedCall> started = StartCall(req, request);
    if (!started.ok()) return SendError(res, started.status());
    if (!request.stream) {
      absl::StatusOr<FinishedCall> finished = ReadToEnd(*started, request);
      if (!finished.ok()) return SendError(res, finished.status());
      res.set_content(CompletionJson(header, finished->choices, finished->usage), kJson);
      return;
    }
    std::shared_ptr<CompleteCall> call = started->call;
    std::shared_ptr<CompletionProgress> progress = started->progress;
    const drt::v1::GenerateResponse first = started->first;
    res.set_header("Cache-Control", "no-cache");
    const bool include_usage = request.include_usage;
    res.set_chunked_content_provider(
        "text/event-stream",
        [call, progress, header, include_usage, first](size_t, httplib::DataSink& sink) {
          // A failed write: the client is gone; the call is cancelled so the
          // engine stops generating for it.
          auto send = [&](const std::string& event) {
            if (sink.write(event.data(), event.size())) return true;
            call->context.TryCancel();
            return false;
          };
          drt::v1::GenerateResponse response = first;
          bool more = true;
          while (more) {
            const std::optional<CompletionProgress::Taken> taken = progress->Take(response);
            if (!progress->status.ok()) {
              call->context.TryCancel();  // Finish's status is then CANCELLED, not reported
              break;
            }
            // Tokens whose text is held back wait for the next chunk sent of
            // their choice: their logprobs go with it. Each choice's last
            // chunk carries its finish_reason; choices interleave, each chunk
            // with its index.
            if (taken.has_value()) {
              ChoiceProgress& choice = progress->choices[taken->choice];
              const bool ended = response.has_done();
              if (ended || !taken->text.empty()) {
                const std::optional<ChoiceLogprobs> logprobs = choice.TakeLogprobs();
                std::optional<std::string> reason;
                if (ended) reason = choice.finish_reason();
                if (!send(SseEvent(CompletionChunkJson(
                        header, taken->text,
                        reason.has_value() ? std::optional<absl::string_view>(*reason) : std::nullopt,
                        logprobs.has_value() ? &*logprobs : nullptr, taken->choice)))) {
                  return false;
                }
              }
              if (ended && progress->all_done() && include_usage &&
                  !send(SseEvent(UsageChunkJson(header, progress->usage())))) {
                return false;
              }
            }
            more = call->stream->Read(&response);
          }
          grpc::Status status = call->Finish();
          if (!progress->status.ok()) {
            status = grpc::Status(grpc::StatusCode::INTERNAL, std::string(progress->status.message()));
          }
          // An error after the stream began: one event in the error shape,
          // then [DONE] (as vLLM does); a stream cut short that way carries
          // no finish_reason.
          // (The context limit ends no stream: it refuses before the first
          // answer, or generation ends at it with "length".)
          if (!status.ok() && !send(SseEvent(ErrorJson(FromGrpc(status))))) return false;
          if (status.ok() && !progress->all_done()) {
            const absl::Status missing = absl::InternalError("Complete ended without its final message");
            if (!send(SseEvent(ErrorJson(missing)))) return false;
          }
          if (!send(SseEvent("[DONE]"))) return false;
          sink.done();
          return true;
        });
  }

  const OpenAiHttpOptions options_;
  ConnectionPoolCounters& counters_;  // the OpenAiHttpServer's
  RequestBytesAdmission& admission_;  // the OpenAiHttpServer's
  OpenAiAuthRefusals& auth_refusals_;  // the OpenAiHttpServer's
  ParseTickets parse_tickets_;
  const std::atomic<bool>& draining_;  // the OpenAiHttpServer's: set on SIGTERM
  // request_header_timeout, at most request_read_timeout.
  const std::chrono::milliseconds header_timeout_ =
      std::min(options_.request_header_timeout, options_.request_read_timeout);
  std::unique_ptr<drt::v1::Drt::Stub> stub_;
  const int64_t started_ = static_cast<int64_t>(std::time(nullptr));
  std::atomic<bool> stopping_{false};
  CallCount calls_;
  std::mutex model_info_mutex_;
  std::optional<drt::v1::ModelInfo> model_info_;  // ModelFacts's, once asked
  std::mutex sockets_mutex_;
  // Each pool thread's connection, while it serves one.
  struct Connection {
    socket_t sock;
    ConnectionStream* stream;
  };
  std::unordered_map<std::thread::id, Connection> sockets_;
  // Last: destroyed first, its destructor draining the pool (joining the
  // threads) while everything Serve uses is still alive.
  std::unique_ptr<ConnectionPool> pool_ = std::make_unique<ConnectionPool>(
      ConnectionPoolOptions{options_.threads, options_.max_waiting_connections,
                            header_timeout_, options_.start_thread,
                            OverloadedResponse()},
      [this](socket_t sock, Clock::time_point deadline) { Serve(sock, deadline); }, counters_);
};

OpenAiHttpServer::OpenAiHttpServer(std::shared_ptr<grpc::Channel> channel,
                                   OpenAiHttpOptions options)
    : channel_(std::move(channel)),
      options_(std::move(options)),
      counters_(std::make_unique<ConnectionPoolCounters>()),
      admission_(std::make_unique<RequestBytesAdmission>(options_.max_inflight_request_bytes)),
      auth_refusals_(std::make_unique<OpenAiAuthRefusals>()) {}

std::string OpenAiHttpServer::RenderMetrics() const {
  return RenderConnectionPoolMetrics("drt_openai", "OpenAI HTTP API connections", *counters_) +
         RenderRequestBytesMetrics(*admission_) + auth_refusals_->RenderPrometheus();
}

OpenAiHttpServer::~OpenAiHttpServer() { Stop(); }

absl::Status OpenAiHttpServer::Start(const std::string& host, int port) {
  if (server_ != nullptr) return absl::FailedPreconditionError("OpenAI HTTP API already started");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--openai_listen port out of range: ", port));
  }
  auto server = std::make_unique<Server>(channel_, options_, *counters_, *admission_,
                                         *auth_refusals_, *draining_);
  UseReuseAddressOnly(*server);
  absl::StatusOr<int> bound_port = BindHttpServer(*server, host, port, "the OpenAI HTTP API");
  if (!bound_port.ok()) return bound_port.status();
  port_ = *bound_port;
  server_ = std::move(server);
  listener_.Start(*server_);
  return absl::OkStatus();
}

bool OpenAiHttpServer::WaitForCalls(std::chrono::steady_clock::time_point deadline) {
  return server_ == nullptr || server_->WaitForCalls(deadline);
}

void OpenAiHttpServer::Stop() {
  if (server_ == nullptr) return;
  listener_.WaitUntilLoopStarted(*server_);
  server_->StartStopping();
  server_->stop();
  listener_.Join();
  server_.reset();
  port_ = 0;
}

}  // namespace drt::server
