// The test-only stream delay kernel (kernels/stream_delay.h; the CUDA
// backend's debug_stream_delay queues it, review-cuda F1): it holds its
// stream back for at least the time asked, so that work queued after it is
// late, and work on another stream that does not wait for it runs first.
// review-cudaprep C3 (a): without this case nothing showed that the delay
// delays.
#include <cstdint>

#include <catch2/catch.hpp>

#include "kernels/stream_delay.h"
#include "tests/cuda/cuda_test_util.h"

namespace drt::cuda_test {
namespace {

// 50 ms: far above a launch's or a copy's latency (microseconds), so the
// no-wait read below runs inside the delay even with a few time slices of
// other processes on the GPU (each ~ms) in between.
constexpr int64_t kDelayNs = 50'000'000;

struct Streams {
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr, written = nullptr;
  int32_t* flag = nullptr;       // device
  int32_t* host = nullptr;       // pinned, so the copies are asynchronous
  ~Streams() {
    if (a) cudaStreamSynchronize(a);
    if (b) cudaStreamSynchronize(b);
    if (flag) cudaFree(flag);
    if (host) cudaFreeHost(host);
    for (cudaEvent_t e : {start, stop, written}) {
      if (e) cudaEventDestroy(e);
    }
    if (a) cudaStreamDestroy(a);
    if (b) cudaStreamDestroy(b);
  }
};

// On stream a: the delay, then the flag set to `value`. On stream b: the
// flag read back, after a wait for a's write when `wait`. Returns the value
// b read; `elapsed_ms` is a's delay as its events timed it.
int32_t DelayedWriteRead(Streams& s, int32_t value, bool wait, float* elapsed_ms) {
  CUDA_REQUIRE(cudaEventRecord(s.start, s.a));
  CUDA_REQUIRE(kernels::LaunchStreamDelay(kDelayNs, s.a));
  CUDA_REQUIRE(cudaEventRecord(s.stop, s.a));
  CUDA_REQUIRE(cudaMemsetAsync(s.flag, value, sizeof(int32_t), s.a));
  CUDA_REQUIRE(cudaEventRecord(s.written, s.a));
  if (wait) CUDA_REQUIRE(cudaStreamWaitEvent(s.b, s.written, 0));
  CUDA_REQUIRE(cudaMemcpyAsync(s.host, s.flag, sizeof(int32_t), cudaMemcpyDeviceToHost, s.b));
  CUDA_REQUIRE(cudaStreamSynchronize(s.b));
  CUDA_REQUIRE(cudaStreamSynchronize(s.a));
  CUDA_REQUIRE(cudaEventElapsedTime(elapsed_ms, s.start, s.stop));
  return *s.host;
}

// (No ";" in a case's name: catch_discover_tests splits a name there into
// two ctest tests that select nothing; with --warn NoTests they fail.)
TEST_CASE("cuda stream delay: holds its stream back and another stream reads before it unless "
          "it waits",
          "[cuda][stream_delay]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  Streams s;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&s.a, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&s.b, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaEventCreate(&s.start));
  CUDA_REQUIRE(cudaEventCreate(&s.stop));
  CUDA_REQUIRE(cudaEventCreateWithFlags(&s.written, cudaEventDisableTiming));
  CUDA_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&s.flag), sizeof(int32_t)));
  CUDA_REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&s.host), sizeof(int32_t)));
  CUDA_REQUIRE(cudaMemset(s.flag, 0, sizeof(int32_t)));
  CUDA_REQUIRE(cudaDeviceSynchronize());

  // Expected from the kernel's rule (spin until the global timer has
  // advanced ns): at least kDelayNs. Allowance 1%: the events' resolution
  // is about 0.5 us (cudaEventElapsedTime's documentation) and the global
  // timer's update step is of the order of 1 us; not measured here (no GPU).
  const float want_ms = kDelayNs / 1e6f;
  float elapsed_ms = 0;
  // No wait: b reads the value from before the delayed write (memset of
  // bytes 0x01 gives 0x01010101).
  const int32_t early = DelayedWriteRead(s, 1, /*wait=*/false, &elapsed_ms);
  WARN("no wait: read " << early << ", the delay took " << elapsed_ms << " ms of " << want_ms);
  CHECK(early == 0);
  CHECK(elapsed_ms >= 0.99f * want_ms);
  // With the wait: b reads the new value.
  const int32_t late = DelayedWriteRead(s, 2, /*wait=*/true, &elapsed_ms);
  WARN("with the wait: read " << late << ", the delay took " << elapsed_ms << " ms");
  CHECK(late == 0x02020202);
  CHECK(elapsed_ms >= 0.99f * want_ms);
}

TEST_CASE("cuda stream delay: a delay of 0 or less is refused", "[cuda][stream_delay]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  CHECK(kernels::LaunchStreamDelay(0, nullptr) == cudaErrorInvalidValue);
  CHECK(kernels::LaunchStreamDelay(-5, nullptr) == cudaErrorInvalidValue);
}

}  // namespace
}  // namespace drt::cuda_test
