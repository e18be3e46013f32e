#include "server/request_bytes_admission.h"

#include <malloc.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace drt::server {

RequestBytesAdmission::Ticket::Ticket(Ticket&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), bytes_(other.bytes_) {}

RequestBytesAdmission::Ticket& RequestBytesAdmission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    bytes_ = other.bytes_;
  }
  return *this;
}

void RequestBytesAdmission::Ticket::Release() {
  if (owner_ != nullptr) std::exchange(owner_, nullptr)->Give(bytes_);
}

std::optional<RequestBytesAdmission::Ticket> RequestBytesAdmission::TryAdmit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool fits = admitted_ == 0 || (bytes <= capacity_ && admitted_ <= capacity_ - bytes);
  if (!fits) {
    ++refused_;
    return std::nullopt;
  }
  admitted_ += bytes;
  return Ticket(this, bytes);
}

size_t RequestBytesAdmission::admitted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return admitted_;
}

uint64_t RequestBytesAdmission::refused_total() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refused_;
}

void RequestBytesAdmission::Give(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  admitted_ -= bytes;
}

std::string RenderRequestBytesMetrics(const RequestBytesAdmission& admission) {
  return absl::StrCat(
      "# HELP drt_openai_requests_overloaded_total OpenAI API requests answered 503 because "
      "their body did not fit beside the bodies being parsed "
      "(--openai_max_inflight_request_bytes)\n"
      "# TYPE drt_openai_requests_overloaded_total counter\n"
      "drt_openai_requests_overloaded_total ", admission.refused_total(), "\n",
      "# HELP drt_openai_request_bytes_in_flight bytes of OpenAI API request bodies being "
      "parsed now (at most --openai_max_inflight_request_bytes)\n"
      "# TYPE drt_openai_request_bytes_in_flight gauge\n"
      "drt_openai_request_bytes_in_flight ", admission.admitted(), "\n");
}

void ParseTickets::Hold(RequestBytesAdmission::Ticket ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  held_.insert_or_assign(std::this_thread::get_id(), std::move(ticket));
}

void ParseTickets::EndParse() {
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = held_.find(std::this_thread::get_id());
    if (it == held_.end()) return;
    bytes = it->second.bytes();
    held_.erase(it);  // releases the ticket
  }
  if (bytes >= kTrimAfterBytes) malloc_trim(0);
}

}  // namespace drt::server
