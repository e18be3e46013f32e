#include "kernels/stream_delay.h"

namespace drt::kernels {
namespace {

__device__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread: the delay needs no more, and a single block leaves the SMs to
// whatever other streams run meanwhile. __nanosleep (sm_70+) keeps the
// spinning warp from taking issue slots from them.
__global__ void StreamDelayKernel(uint64_t ns) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < ns) __nanosleep(1000);
}

}  // namespace

cudaError_t LaunchStreamDelay(int64_t ns, cudaStream_t stream) {
  if (ns <= 0) return cudaErrorInvalidValue;
  StreamDelayKernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(ns));
  return cudaGetLastError();
}

}  // namespace drt::kernels
