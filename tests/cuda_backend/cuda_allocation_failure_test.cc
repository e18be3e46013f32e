// Allocation failures of the CUDA backend's host side fail what needed the
// memory, and nothing else (review of the CUDA host side, findings 1-3):
// - a failed cudaMalloc / cudaHostAlloc is RESOURCE_EXHAUSTED and leaves
//   no runtime "last error" behind for the next kernel launch on the thread
//   (engine/cuda/allocation_status.h), so the next forward or session
//   creation there runs clean;
// - a landmark matrix or pinned host store that cannot grow fails that
//   session's PrepareSessionForStep, before the forward, and the step's
//   other sessions run as without it; a step whose room was reserved
//   allocates no pinned memory mid-step;
// - the device store grows by a bounded step when doubling does not fit.
// Written without a GPU (NOT YET RUN ON A GPU): these tests skip visibly
// until run on one. Each would fail on the code before the fix (said at
// each case). Logits are compared bit for bit: each session runs its own
// kernels, with the same shapes, alone or in company (as in
// cuda_batch_step_test.cc, slice by slice).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "engine/backend_factory.h"
#include "engine/batch_step.h"
#include "engine/cuda/cuda_resources.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/device_chunk_store.h"
#include "engine/cuda/device_weights.h"
#include "engine/cuda/pinned_allocator.h"
#include "engine/session.h"
#include "engine/step_plan.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/counting_host_allocator.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

// More than any device or host has: the allocation fails for want of
// memory (cudaErrorMemoryAllocation).
constexpr size_t kImpossibleBytes = size_t{1} << 50;
constexpr size_t kMiB = size_t{1} << 20;

// Device memory taken for a test, so that little is left free.
class DeviceFiller {
 public:
  // Takes the free memory but about `leave` bytes (2 MiB steps, the
  // allocation granularity, when the first try fails).
  explicit DeviceFiller(size_t leave) {
    size_t free_bytes = 0, total_bytes = 0;
    REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
    REQUIRE(free_bytes > leave + 64 * kMiB);
    for (size_t take = free_bytes - leave; take > free_bytes - leave - 64 * kMiB;
         take -= 2 * kMiB) {
      if (cudaMalloc(&p_, take) == cudaSuccess) return;
      p_ = nullptr;
      (void)cudaGetLastError();  // this helper's own failed try
    }
    FAIL("could not fill the device to " << leave << " bytes free");
  }
  ~DeviceFiller() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }
  static size_t FreeBytes() {
    size_t free_bytes = 0, total_bytes = 0;
    REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
    return free_bytes;
  }

 private:
  void* p_ = nullptr;
};

TEST_CASE("cuda: a failed allocation is RESOURCE_EXHAUSTED and leaves no error behind",
          "[cuda][allocation]") {
  if (!testing::HaveGpu()) return;
  // Before the fix: INTERNAL, and cudaGetLastError() still
  // cudaErrorMemoryAllocation afterwards.
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  auto device = cuda::DeviceArray<char>::Create(kImpossibleBytes, "a test array");
  CHECK(device.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(device.status().message(), "a test array"));
  CHECK(cudaGetLastError() == cudaSuccess);
  auto pinned = cuda::PinnedArray<char>::Create(kImpossibleBytes, "a test array");
  CHECK(pinned.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(cudaGetLastError() == cudaSuccess);
  cuda::PinnedHostAllocator allocator;
  absl::StatusOr<void*> slab = allocator.Allocate(kImpossibleBytes);
  CHECK(slab.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(cudaGetLastError() == cudaSuccess);
}

// Appends `tokens` to `session` in one RunStep; its logits.
std::vector<float> StepAlone(Backend& backend, Session& session,
                             const std::vector<int32_t>& tokens) {
  std::vector<float> logits;
  StepEntry entry;
  entry.session = &session;
  entry.tokens = tokens;
  entry.all_logits = &logits;
  const std::vector<absl::Status> done = RunStep(backend, {entry});
  INFO(done[0].message());
  REQUIRE(done[0].ok());
  return logits;
}

TEST_CASE("cuda: a failed allocation on a thread fails no later step or session there",
          "[cuda][allocation]") {
  if (!testing::HaveGpu()) return;
  // The scheduler thread's case: an allocation fails (another session's
  // growth), then a forward runs there. And an RPC thread's: a session is
  // created there next (decode_graphs: Init launches a kernel). Before the
  // fix both failed on the stale cudaErrorMemoryAllocation, the forward
  // marking its sessions failed for good.
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 91);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
  options.decode_graphs = true;
  auto backend = MakeCudaBackend(config, weights, options);
  REQUIRE(backend.ok());
  auto session = Session::Create(**backend);
  REQUIRE(session.ok());
  REQUIRE((*session)->Append(testing::RandomTokens(config, 3 * 63 + 5, 92)).ok());
  auto twin = (*session)->Fork();
  REQUIRE(twin.ok());
  const std::vector<int32_t> token = testing::RandomTokens(config, 1, 93);
  const std::vector<float> want = StepAlone(**backend, **twin, token);

  REQUIRE_FALSE(cuda::DeviceArray<char>::Create(kImpossibleBytes, "a test array").ok());
  CHECK(StepAlone(**backend, **session, token) == want);

  REQUIRE_FALSE(cuda::PinnedArray<char>::Create(kImpossibleBytes, "a test array").ok());
  auto created = Session::Create(**backend);
  INFO(created.status().message());
  CHECK(created.ok());
}

TEST_CASE("cuda: a landmark matrix that cannot grow fails its session alone, before the step",
          "[cuda][allocation]") {
  if (!testing::HaveGpu()) return;
  // Session A is asked for room up to 2^20 chunks (a landmark matrix of
  // 2^20 x 64 floats = 256 MiB) with ~32 MiB of the device free: its
  // PrepareSessionForStep is RESOURCE_EXHAUSTED naming the landmark
  // matrix (before the fix: INTERNAL, and the error left set). Then, the
  // memory given back, A and B step together: both succeed (before the fix
  // the stale error failed that forward and marked both failed), with the
  // logits their untouched twins had.
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 94);
  auto backend = MakeCudaBackend(config, weights, testing::PrecisionOptions(CudaPrecision::kFp32));
  REQUIRE(backend.ok());
  std::vector<std::unique_ptr<Session>> sessions, twins;
  for (int i = 0; i < 2; ++i) {
    auto s = Session::Create(**backend);
    REQUIRE(s.ok());
    REQUIRE((*s)->Append(testing::RandomTokens(config, (4 + i) * 63 + 7, 95 + i)).ok());
    auto t = (*s)->Fork();
    REQUIRE(t.ok());
    sessions.push_back(*std::move(s));
    twins.push_back(*std::move(t));
  }
  const std::vector<std::vector<int32_t>> tokens = {testing::RandomTokens(config, 1, 97),
                                                    testing::RandomTokens(config, 1, 98)};
  std::vector<std::vector<float>> want(2), got(2);
  std::vector<StepEntry> entries(2);
  for (int i = 0; i < 2; ++i) entries[i] = {twins[i].get(), tokens[i], false, &want[i]};
  for (const absl::Status& s : RunStep(**backend, entries)) REQUIRE(s.ok());

  BackendSession& a = sessions[0]->backend_session();
  const int64_t position = a.position();
  const SessionMemory memory = a.memory();
  {
    DeviceFiller filler(32 * kMiB);
    REQUIRE(DeviceFiller::FreeBytes() < 256 * kMiB);
    const absl::Status refused = (*backend)->PrepareSessionForStep(a, int64_t{64} << 20);
    INFO(refused.message());
    CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(refused.message(), "landmark matrix"));
  }
  CHECK(a.position() == position);
  CHECK(a.memory().device_bytes == memory.device_bytes);
  for (int i = 0; i < 2; ++i) entries[i] = {sessions[i].get(), tokens[i], false, &got[i]};
  for (const absl::Status& s : RunStep(**backend, entries)) {
    INFO(s.message());
    CHECK(s.ok());
  }
  CHECK(got[0] == want[0]);
  CHECK(got[1] == want[1]);
}

// Steps CudaSessions made outside the backend (with a test allocator) through
// its Step: one forward of every (session, tokens) pair; each session's
// logits. `tokens_held[i]`: real tokens session i holds, advanced.
std::vector<std::vector<float>> StepSessions(Backend& backend,
                                             const std::vector<BackendSession*>& sessions,
                                             std::vector<int64_t>& tokens_held,
                                             const std::vector<std::vector<int32_t>>& tokens) {
  const ModelConfig& config = backend.config();
  std::vector<SliceRequest> requests(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i) {
    requests[i].position = sessions[i]->position();
    requests[i].num_tokens = tokens_held[i];
    requests[i].tokens = tokens[i];
    requests[i].all_logits = true;
  }
  absl::StatusOr<StepPlan> plan = PlanStep(config, requests);
  REQUIRE(plan.ok());
  std::vector<float> logits(plan->logit_rows.size() * config.vocab_size);
  const absl::Status status = backend.Step(*plan, sessions, absl::MakeSpan(logits));
  INFO(status.message());
  REQUIRE(status.ok());
  std::vector<std::vector<float>> out(sessions.size());
  for (size_t r = 0; r < plan->logit_rows.size(); ++r) {
    const int64_t request = plan->slices[plan->logit_rows[r].slice].request;
    out[request].insert(out[request].end(), logits.begin() + r * config.vocab_size,
                        logits.begin() + (r + 1) * config.vocab_size);
  }
  for (size_t i = 0; i < sessions.size(); ++i) {
    tokens_held[i] += static_cast<int64_t>(tokens[i].size());
  }
  return out;
}

TEST_CASE("cuda: a pinned host store that cannot grow fails its session alone, before the step",
          "[cuda][allocation]") {
  if (!testing::HaveGpu()) return;
  // Session A's host store allocates from a test allocator that can be
  // told to fail; B's from the pinned one. A holds 16 closed chunks (its
  // first slab, full: CudaSlabOptions(1024) starts at 16) and 62 tokens:
  // its next token closes chunk 16, which needs a new slab. With the
  // allocator failing, A's PrepareSessionForStep is RESOURCE_EXHAUSTED
  // naming the host store, A unchanged (before the fix: OK, and the slab
  // was allocated inside the forward, failing it and every session in it);
  // B steps alone meanwhile, with its twin's logits. Then A's room is
  // reserved and the allocator fails again: A's step closes the chunk
  // without allocating (before the fix: it failed), with its twin's
  // logits.
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 99);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
  options.max_step_positions = 2048;
  auto backend = MakeCudaBackend(config, weights, options);
  REQUIRE(backend.ok());
  auto device_weights = cuda::DeviceWeights<float>::Upload(config, weights);
  REQUIRE(device_weights.ok());
  auto failing = std::make_shared<testing::CountingHostAllocator>();
  auto pinned = std::make_shared<cuda::PinnedHostAllocator>();
  auto a = cuda::CudaSession<float>::Create(config, **device_weights, options, failing);
  auto b = cuda::CudaSession<float>::Create(config, **device_weights, options, pinned);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  std::vector<int64_t> held = {0, 0};
  StepSessions(**backend, {a->get(), b->get()}, held,
               {testing::RandomTokens(config, 16 * 63 + 62, 100),
                testing::RandomTokens(config, 5 * 63 + 10, 101)});
  REQUIRE((*a)->num_chunks() == 16);
  auto a_twin = (*a)->Fork();
  auto b_twin = (*b)->Fork();
  REQUIRE(a_twin.ok());
  REQUIRE(b_twin.ok());
  std::vector<int64_t> twin_held = held;
  const std::vector<std::vector<int32_t>> tokens = {testing::RandomTokens(config, 1, 102),
                                                    testing::RandomTokens(config, 1, 103)};
  // The twins first, the allocator working (A's twin opens its own slab).
  const std::vector<std::vector<float>> want =
      StepSessions(**backend, {a_twin->get(), b_twin->get()}, twin_held, tokens);

  const int64_t end = (*a)->position() + 2;  // its token and the landmark
  const auto slabs_bytes = (*a)->memory().chunk_store_bytes;
  failing->fail = true;
  const absl::Status refused = (*backend)->PrepareSessionForStep(**a, end);
  INFO(refused.message());
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(refused.message(), "pinned host chunk store"));
  CHECK((*a)->memory().chunk_store_bytes == slabs_bytes);
  CHECK((*a)->position() == end - 2);
  std::vector<int64_t> b_held = {held[1]};
  CHECK(StepSessions(**backend, {b->get()}, b_held, {tokens[1]})[0] == want[1]);

  failing->fail = false;
  REQUIRE((*backend)->PrepareSessionForStep(**a, end).ok());
  CHECK((*a)->memory().chunk_store_bytes > slabs_bytes);  // the slab, opened ahead
  failing->fail = true;
  std::vector<int64_t> a_held = {held[0]};
  CHECK(StepSessions(**backend, {a->get()}, a_held, {tokens[0]})[0] == want[0]);
  CHECK((*a)->num_chunks() == 17);
}

TEST_CASE("cuda: a device store grows by a bounded step where doubling does not fit",
          "[cuda][allocation][device_tier]") {
  if (!testing::HaveGpu()) return;
  // 64 rows x 64 floats a block: 32 KiB of K and V a chunk; 1024 chunks
  // held (32 MiB). Chunk 1025 with ~48 MiB free: doubling (2048 chunks,
  // 64 MiB) does not fit, the bounded step does: 1025 + 1025 / 8 = 1153
  // chunks (36 MiB) (engine/cuda/host/chunk_tier_policy.h). Before the fix:
  // RESOURCE_EXHAUSTED. The held chunks are copied.
  constexpr int64_t kElements = 64 * 64;
  cuda::DeviceChunkStore<float> store(kElements);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  REQUIRE(store.Reserve(1024, /*exact=*/true, stream).ok());
  std::vector<float> first(kElements), last(kElements);
  for (int64_t i = 0; i < kElements; ++i) {
    first[i] = static_cast<float>(i);
    last[i] = -static_cast<float>(i);
  }
  REQUIRE(cudaMemcpy(store.keys(0), first.data(), kElements * 4, cudaMemcpyHostToDevice) ==
          cudaSuccess);
  REQUIRE(cudaMemcpy(store.values(1023), last.data(), kElements * 4, cudaMemcpyHostToDevice) ==
          cudaSuccess);
  REQUIRE(store.Append(1024).ok());
  {
    DeviceFiller filler(48 * kMiB);
    const size_t free_bytes = DeviceFiller::FreeBytes();
    INFO("free MiB " << free_bytes / kMiB);
    REQUIRE(free_bytes < 64 * kMiB);  // doubling cannot fit
    REQUIRE(free_bytes > 40 * kMiB);  // the step can
    const absl::Status grown = store.Reserve(1025, /*exact=*/false, stream);
    INFO(grown.message());
    REQUIRE(grown.ok());
    CHECK(store.capacity() == 1153);
  }
  std::vector<float> first_after(kElements), last_after(kElements);
  REQUIRE(cudaMemcpy(first_after.data(), store.keys(0), kElements * 4, cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  REQUIRE(cudaMemcpy(last_after.data(), store.values(1023), kElements * 4,
                     cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(first_after == first);
  CHECK(last_after == last);

  // The cap (the largest context's chunks): 1100, not 2048, with room.
  cuda::DeviceChunkStore<float> capped(kElements, /*cap_chunks=*/1100);
  REQUIRE(capped.Reserve(1024, /*exact=*/true, stream).ok());
  REQUIRE(capped.Reserve(1025, /*exact=*/false, stream).ok());
  CHECK(capped.capacity() == 1100);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

}  // namespace
}  // namespace drt
