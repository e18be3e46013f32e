// The bound on OpenAI API request bodies being parsed at once
// (--openai_max_inflight_request_bytes; review-deploy F2). Parsing JSON
// costs up to about 33 times the body (a 64 MiB body of arrays nested 63
// deep: about 2 GB, measured by review-deploy), so without a bound
// --max_sessions + 4 such requests at once could take far more memory than
// the pod has, outside --host_memory_budget_gb.
//
// A body is admitted once it has been read whole, at its real size, just
// before it is parsed (review-deployfix 3-5): reading costs 1x the body and
// is already bounded by the threads x --openai_max_request_bytes, so a slow
// or stalled upload holds no admission, and a small chunked body counts as
// small. One whose bytes would take the admitted bytes past the bound is
// not queued: the caller answers it 503 with Retry-After at once. Waiting would
// hold one of the API's few serving threads (--max_sessions + 4) and the
// client's connection while the request time (--openai_request_timeout_seconds,
// counted from the accept) runs out, and the clients the API serves
// (openai-python, the gateway) already retry a 503 after Retry-After.
// The bound is at least one body of the largest size, so a request alone
// is always admitted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

namespace drt::server {

class RequestBytesAdmission {
 public:
  // Gives its bytes back when released or destroyed. Move-only; must not
  // outlive the admission that made it.
  class Ticket {
   public:
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { Release(); }
    void Release();
    size_t bytes() const { return bytes_; }

   private:
    friend class RequestBytesAdmission;
    Ticket(RequestBytesAdmission* owner, size_t bytes) : owner_(owner), bytes_(bytes) {}
    RequestBytesAdmission* owner_;
    size_t bytes_;
  };

  explicit RequestBytesAdmission(size_t capacity) : capacity_(capacity) {}

  // A ticket for `bytes` when they fit beside the bytes admitted now (a
  // request of more than the capacity is admitted only when nothing else is,
  // so it is never refused forever); nullopt, counted as refused, when not.
  std::optional<Ticket> TryAdmit(size_t bytes);

  size_t capacity() const { return capacity_; }
  size_t admitted() const;
  uint64_t refused_total() const;

 private:
  void Give(size_t bytes);
  const size_t capacity_;
  mutable std::mutex mutex_;
  size_t admitted_ = 0;
  uint64_t refused_ = 0;
};

// drt_openai_requests_overloaded_total (requests refused for the bound)
// and drt_openai_request_bytes_in_flight (bytes admitted now), as
// Prometheus text.
std::string RenderRequestBytesMetrics(const RequestBytesAdmission& admission);

// The ticket of the request each serving thread is parsing: the route that
// has read a body holds it here, and the handler ends it once the body is
// parsed (EndParse), so that a long completion does not hold it.
class ParseTickets {
 public:
  void Hold(RequestBytesAdmission::Ticket ticket);
  // Releases this thread's ticket, if any; after a body of at least
  // kTrimAfterBytes it also returns the allocator's free memory to the
  // system (malloc_trim), which glibc otherwise keeps: review-deploy
  // measured 6 GiB still held after three 64 MiB parses had ended.
  void EndParse();
  static constexpr size_t kTrimAfterBytes = size_t{1} << 20;

  // Ends this thread's parse (EndParse) when it goes out of scope, however
  // the scope is left: a handler that throws (httplib answers 500) must not
  // keep its bytes admitted for good (review-deployfix 1).
  class Scope {
   public:
    explicit Scope(ParseTickets& tickets) : tickets_(tickets) {}
    ~Scope() { tickets_.EndParse(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ParseTickets& tickets_;
  };

 private:
  std::mutex mutex_;
  std::unordered_map<std::thread::id, RequestBytesAdmission::Ticket> held_;
};

}  // namespace drt::server
