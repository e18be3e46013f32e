// After each case of the CUDA backend tests, while DRT_TEST_CUDA_STREAM_DELAY
// is set (scripts/gpu_bench.sh's stream-delay runs), one line
//   stream_delays=N (STREAM:NS) case: NAME
// with N the delays the case's backends queued (testing::StreamDelayTally,
// fed by the backends PrecisionOptions made). review-cudaprep C3 b: a run
// whose delays never fired passed as if delayed; gpu_bench.sh now fails a
// run whose lines add up to 0, and names the cases with N = 0 (a refusal
// case queues none; a case that runs sessions and queues none does not go
// through PrecisionOptions, or never reaches that stream's sites). Nothing
// is printed without the variable, so ctest's runs are unchanged.
#include <cstdlib>
#include <ostream>

#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include "tests/cuda_backend/cuda_test_support.h"

namespace drt::testing {
namespace {

class StreamDelayReport : public Catch::TestEventListenerBase {
 public:
  using Catch::TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    StreamDelayTally().store(0);
    Catch::TestEventListenerBase::testCaseStarting(info);
  }

  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    const char* delay = std::getenv("DRT_TEST_CUDA_STREAM_DELAY");
    if (delay != nullptr && *delay != '\0') {
      stream << "stream_delays=" << StreamDelayTally().load() << " (" << delay
             << ") case: " << stats.testInfo.name << std::endl;
    }
    Catch::TestEventListenerBase::testCaseEnded(stats);
  }
};

CATCH_REGISTER_LISTENER(StreamDelayReport)

}  // namespace
}  // namespace drt::testing
