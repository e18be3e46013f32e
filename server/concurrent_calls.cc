#include "server/concurrent_calls.h"

#include <system_error>
#include <thread>

namespace drt::server {

std::vector<absl::Status> RunConcurrently(absl::Span<const std::function<absl::Status()>> calls,
                                          bool concurrent) {
  std::vector<absl::Status> results(calls.size());
  if (!concurrent || calls.size() < 2) {
    for (size_t i = 0; i < calls.size(); ++i) results[i] = calls[i]();
    return results;
  }
  std::vector<std::thread> threads;
  threads.reserve(calls.size() - 1);
  for (size_t i = 1; i < calls.size(); ++i) {
    try {
      threads.emplace_back([&, i] { results[i] = calls[i](); });
    } catch (const std::system_error&) {
      results[i] = calls[i]();  // no thread to be had: this one runs here, in turn
    }
  }
  results[0] = calls[0]();
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace drt::server
