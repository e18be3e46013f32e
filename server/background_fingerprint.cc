#include "server/background_fingerprint.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

namespace drt::server {

BackgroundFingerprint::BackgroundFingerprint(std::shared_ptr<const ModelFingerprint> fingerprint) {
  if (fingerprint == nullptr || fingerprint->computed()) return;
  thread_ = std::thread([fingerprint = std::move(fingerprint)] {
    const auto started = std::chrono::steady_clock::now();
    const absl::StatusOr<uint32_t> value = fingerprint->value();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (value.ok()) {
      std::fprintf(stderr, "drt-server: model fingerprint %08x (%.2f s, in the background)\n",
                   *value, seconds);
    } else {
      std::fprintf(stderr,
                   "drt-server: the model's fingerprint cannot be taken, so SaveSession and "
                   "LoadSession will fail: %s\n",
                   std::string(value.status().message()).c_str());
    }
  });
}

BackgroundFingerprint::~BackgroundFingerprint() { Wait(); }

void BackgroundFingerprint::Wait() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace drt::server
