#include "server/background_fingerprint.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <system_error>
#include <utility>

namespace drt::server {

BackgroundFingerprint::BackgroundFingerprint(std::shared_ptr<const ModelFingerprint> fingerprint) {
  if (fingerprint == nullptr || fingerprint->computed()) return;
  auto compute = [fingerprint = std::move(fingerprint), cancel = &cancel_] {
    const auto started = std::chrono::steady_clock::now();
    const absl::StatusOr<uint32_t> value = fingerprint->ValueUnlessCancelled(*cancel);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (value.ok()) {
      std::fprintf(stderr, "drt-server: model fingerprint %08x (%.2f s, in the background)\n",
                   *value, seconds);
    } else if (cancel->load()) {
      std::fprintf(stderr, "drt-server: model fingerprint not taken (stopped after %.2f s)\n",
                   seconds);
    } else {
      std::fprintf(stderr,
                   "drt-server: the model's fingerprint cannot be taken, so SaveSession and "
                   "LoadSession will fail: %s\n",
                   std::string(value.status().message()).c_str());
    }
  };
  // std::thread reports a failed start (a thread limit) only by throwing;
  // it is caught here, so that it does not leave this module.
  try {
    thread_ = std::thread(std::move(compute));
  } catch (const std::system_error& e) {
    std::fprintf(stderr,
                 "drt-server: cannot start the model fingerprint's thread (%s); the first "
                 "SaveSession or LoadSession will read the weights file instead\n",
                 e.what());
  }
}

BackgroundFingerprint::~BackgroundFingerprint() {
  cancel_.store(true);
  Wait();
}

void BackgroundFingerprint::Wait() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace drt::server
