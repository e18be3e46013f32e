#include "server/failed_call_log.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/status_util.h"

namespace drt::server {
namespace {

class FailedCallLogInterceptor final : public grpc::experimental::Interceptor {
 public:
  FailedCallLogInterceptor(FailedCallLog* log, const AccessLogSink* access,
                           const FailedCallLog::Clock* clock, grpc::ServerContextBase* context,
                           std::string method)
      : log_(log),
        access_(access),
        clock_(clock),
        context_(context),
        method_(std::move(method)),
        start_(*access_ ? (*clock_)() : std::chrono::steady_clock::time_point{}) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      log_->Record(method_, status);
      if (*access_) {
        const double seconds =
            std::chrono::duration<double>((*clock_)() - start_).count();
        (*access_)(absl::StrFormat("drt-server: call %s from %s: %s in %.3f s", method_,
                                   context_ != nullptr ? context_->peer() : "(unknown)",
                                   GrpcCodeName(status.error_code()), seconds));
      }
    }
    methods->Proceed();
  }

 private:
  FailedCallLog* const log_;
  const AccessLogSink* const access_;
  const FailedCallLog::Clock* const clock_;
  grpc::ServerContextBase* const context_;
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
};

class FailedCallLogInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  FailedCallLogInterceptorFactory(FailedCallLog* log, AccessLogSink access,
                                  FailedCallLog::Clock clock)
      : log_(log), access_(std::move(access)), clock_(std::move(clock)) {
    if (!clock_) clock_ = [] { return std::chrono::steady_clock::now(); };
  }

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new FailedCallLogInterceptor(log_, &access_, &clock_, info->server_context(),
                                        info->method() ? info->method() : "(unknown)");
  }

 private:
  FailedCallLog* const log_;
  AccessLogSink access_;
  FailedCallLog::Clock clock_;
};

// The message on one line, cut to kMaxMessageBytes.
std::string OneLine(const std::string& message) {
  std::string line = message.size() > FailedCallLog::kMaxMessageBytes
                         ? message.substr(0, FailedCallLog::kMaxMessageBytes) + "..."
                         : message;
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return line;
}

}  // namespace

FailedCallLog::FailedCallLog(Sink sink, Clock clock)
    : sink_(std::move(sink)), clock_(std::move(clock)), window_start_(clock_()) {}

bool FailedCallLog::Logs(grpc::StatusCode code) {
  return code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::DATA_LOSS ||
         code == grpc::StatusCode::UNKNOWN;
}

void FailedCallLog::Record(const std::string& method, const grpc::Status& status) {
  if (!Logs(status.error_code())) return;
  std::string line;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::chrono::steady_clock::time_point now = clock_();
    if (now - window_start_ >= kWindow) {
      window_start_ = now;
      lines_in_window_ = 0;
    }
    if (lines_in_window_ >= kMaxLinesPerWindow) {
      ++suppressed_;
      return;
    }
    ++lines_in_window_;
    line = absl::StrCat("drt-server: call ", method, " failed: ",
                        GrpcCodeName(status.error_code()), ": ",
                        OneLine(status.error_message()));
    if (suppressed_ > 0) {
      absl::StrAppend(&line, " (", suppressed_, " earlier failed call(s) not logged: more than ",
                      kMaxLinesPerWindow, " a minute)");
      suppressed_ = 0;
    }
  }
  sink_(line);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeFailedCallLogInterceptor(FailedCallLog* log, AccessLogSink access, FailedCallLog::Clock clock) {
  return std::make_unique<FailedCallLogInterceptorFactory>(log, std::move(access),
                                                           std::move(clock));
}

}  // namespace drt::server
