// CHECK_STATUS(status, code, text): a grpc::Status has the code and its
// message contains `text`. On failure the code and the first 300 characters
// of the message are printed (some messages under test are very long).
#pragma once

#include <grpcpp/support/status.h>

#include <catch2/catch.hpp>

#define CHECK_STATUS(status, code, text)                                                      \
  do {                                                                                        \
    const grpc::Status s_ = (status);                                                         \
    INFO("code " << s_.error_code() << " message: " << s_.error_message().substr(0, 300));   \
    CHECK(s_.error_code() == (code));                                                         \
    CHECK_THAT(s_.error_message(), Catch::Matchers::Contains(text));                          \
  } while (false)
