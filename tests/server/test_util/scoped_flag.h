// Sets an absl flag for the rest of a scope, for tests of flag handling.
// (absl::FlagSaver would do, but this absl version logs every value it
// restores.)
#pragma once

#include <string>

#include <catch2/catch.hpp>

#include "absl/flags/reflection.h"

namespace drt::server::testing {

class ScopedFlag {
 public:
  ScopedFlag(const char* name, const std::string& value)
      : flag_(absl::FindCommandLineFlag(name)) {
    REQUIRE(flag_ != nullptr);
    saved_ = flag_->CurrentValue();
    std::string error;
    REQUIRE(flag_->ParseFrom(value, &error));
  }
  ~ScopedFlag() {
    std::string error;
    flag_->ParseFrom(saved_, &error);
  }
  ScopedFlag(const ScopedFlag&) = delete;
  ScopedFlag& operator=(const ScopedFlag&) = delete;

 private:
  absl::CommandLineFlag* flag_;
  std::string saved_;
};

}  // namespace drt::server::testing
