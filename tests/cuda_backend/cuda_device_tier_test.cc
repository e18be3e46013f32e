// The CUDA backend's device chunk tier (CudaBackendOptions::chunk_tier =
// kDevice or kAuto, engine/cuda/device_chunk_store.h, docs/cuda.md "Device
// tier") against the host tier (the default, verified): the same sessions
// on two backends alike but for the option.
//
// Both tiers make a chunk's K/V with the same two GEMMs (same shapes, same
// handle, destinations equally aligned) of the same encoder output; the host
// tier copies those bytes to the pinned store and back into a slot buffer,
// the device tier leaves them where the GEMMs wrote them. The GCA kernel
// then reads the same values in the same order (the slot table lists a
// selection's chunks in the same order; only the slot numbers differ), so
// the logits must be bit-identical, not merely close: the bound is 0.
// Written without a GPU and NOT YET RUN: each case WARNs what it saw for
// the first GPU run to record.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "engine/batch_step.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/device_chunk_store.h"
#include "engine/cuda/host/chunk_tier_policy.h"
#include "kernels/elementwise.h"
#include "engine/session.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

struct HostAndDevice {
  std::unique_ptr<Backend> host, device;
};

// `device_options` differ from `host_options` in the tier only.
HostAndDevice MakeBackends(const ModelConfig& config, const ModelWeights& weights,
                           CudaBackendOptions host_options, CudaBackendOptions device_options) {
  host_options.chunk_tier = CudaChunkTier::kHost;
  auto host = MakeCudaBackend(config, weights, host_options);
  auto device = MakeCudaBackend(config, weights, device_options);
  REQUIRE(host.ok());
  REQUIRE(device.ok());
  return {*std::move(host), *std::move(device)};
}

struct Twins {
  std::unique_ptr<Session> host, device;
  testing::RetrievalLog host_log, device_log;
};

void Attach(Twins& t, std::unique_ptr<Session> host, std::unique_ptr<Session> device) {
  t.host = std::move(host);
  t.device = std::move(device);
  testing::Record(t.host->backend_session(), t.host_log);
  testing::Record(t.device->backend_session(), t.device_log);
}

std::unique_ptr<Twins> NewTwins(const HostAndDevice& backends) {
  auto host = Session::Create(*backends.host);
  auto device = Session::Create(*backends.device);
  REQUIRE(host.ok());
  REQUIRE(device.ok());
  auto twins = std::make_unique<Twins>();
  Attach(*twins, *std::move(host), *std::move(device));
  return twins;
}

// The closed chunks a CUDA session's store holds (its own count, not the
// position's).
int64_t StoredChunks(BackendSession& session) {
  if (auto* f = dynamic_cast<cuda::CudaSession<float>*>(&session)) return f->stored_chunks();
  auto* b = dynamic_cast<cuda::CudaSession<cuda::bf16>*>(&session);
  REQUIRE(b != nullptr);
  return b->stored_chunks();
}

int64_t DifferingBits(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  int64_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    // Bits, not values: NaN != NaN would count, -0 vs +0 too.
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differing;
  }
  return differing;
}

// Landmarks after the first at which group `group`'s selection changed.
int64_t SelectionChanges(const testing::RetrievalLog& log, int64_t group) {
  int64_t changes = 0;
  const Retrieval* last = nullptr;
  for (const auto& [key, r] : log) {
    if (key.second != group) continue;
    if (last != nullptr && r.chunks != last->chunks) ++changes;
    last = &r;
  }
  return changes;
}

// Runs `tokens` on both as one step each; returns how many logits differ in
// their bits (0 expected) and REQUIREs both steps ok.
int64_t StepBoth(const HostAndDevice& backends, Twins& t, const std::vector<int32_t>& tokens) {
  const int64_t V = backends.host->config().vocab_size;
  std::vector<float> host_logits, device_logits;
  StepEntry host;
  host.session = t.host.get();
  host.tokens = tokens;
  host.all_logits = &host_logits;
  REQUIRE(RunStep(*backends.host, {host})[0].ok());
  StepEntry device = host;
  device.session = t.device.get();
  device.all_logits = &device_logits;
  REQUIRE(RunStep(*backends.device, {device})[0].ok());
  REQUIRE(host_logits.size() == tokens.size() * V);
  REQUIRE(device_logits.size() == host_logits.size());
  // Each tier's store holds every chunk the position has closed.
  REQUIRE(StoredChunks(t.device->backend_session()) == t.host->num_chunks());
  REQUIRE(StoredChunks(t.host->backend_session()) == t.host->num_chunks());
  return DifferingBits(host_logits, device_logits);
}

// The same selections, chunk for chunk, with the same weights to the bit.
void CheckSameRetrievals(const Twins& t) {
  testing::ForEachRetrievalPair(t.host_log, t.device_log,
                                [](const Retrieval& h, const Retrieval& d) {
                                  CHECK(d.chunks == h.chunks);
                                  CHECK(d.weights == h.weights);
                                });
}

int64_t ElementBytes(CudaPrecision precision) {
  return precision == CudaPrecision::kFp32 ? 4 : 2;
}

// K and V of one chunk: 2 x 64 x d elements.
int64_t ChunkBytes(const ModelConfig& config, CudaPrecision precision) {
  return 2 * 64 * config.hidden_size * ElementBytes(precision);
}

// Prefill of `tokens` in steps of `step` tokens on both; returns the
// differing logits.
int64_t PrefillBoth(const HostAndDevice& backends, Twins& t, const std::vector<int32_t>& prompt,
                    size_t step) {
  int64_t differing = 0;
  for (size_t at = 0; at < prompt.size(); at += step) {
    const size_t n = std::min(step, prompt.size() - at);
    differing += StepBoth(backends, t,
                          std::vector<int32_t>(prompt.begin() + at, prompt.begin() + at + n));
  }
  return differing;
}

TEST_CASE("cuda: the device tier is refused with encoder rows and state export, naming both",
          "[cuda][device_tier]") {
  // MakeCudaBackend checks the options before it looks for a GPU: these
  // run (and must pass) on a machine without one too.
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 80);
  struct Case {
    CudaChunkTier tier;
    bool state_export;
    CudaChunkStore store;
    std::string tier_flag, other_flag;
  };
  for (const Case& c : {
           Case{CudaChunkTier::kDevice, false, CudaChunkStore::kEncoderRows,
                "--cuda_chunk_tier=device", "--cuda_chunk_store=encoder_rows"},
           Case{CudaChunkTier::kDevice, true, CudaChunkStore::kKeysValues,
                "--cuda_chunk_tier=device", "--cuda_state_export"},
           Case{CudaChunkTier::kAuto, true, CudaChunkStore::kKeysValues,
                "--cuda_chunk_tier=auto", "--cuda_state_export"},
           Case{CudaChunkTier::kAuto, false, CudaChunkStore::kEncoderRows,
                "--cuda_chunk_tier=auto", "--cuda_chunk_store=encoder_rows"},
       }) {
    INFO(c.tier_flag << " with " << c.other_flag);
    CudaBackendOptions options;
    options.chunk_tier = c.tier;
    options.state_export = c.state_export;
    options.chunk_store = c.store;
    options.auto_tier_max_tokens = 4096;
    auto made = MakeCudaBackend(config, weights, options);
    REQUIRE_FALSE(made.ok());
    CHECK(made.status().code() == absl::StatusCode::kInvalidArgument);
    const std::string message(made.status().message());
    CHECK(message.find(c.tier_flag) != std::string::npos);
    CHECK(message.find(c.other_flag) != std::string::npos);
    // drt-bench spells the tier option its own way: named too.
    CHECK(message.find("drt-bench --chunk_tier=" + std::string(CudaChunkTierName(c.tier))) !=
          std::string::npos);
  }
  // auto needs a context to size its stores by, and a budget is not negative.
  CudaBackendOptions options;
  options.chunk_tier = CudaChunkTier::kAuto;
  auto no_context = MakeCudaBackend(config, weights, options);
  CHECK(no_context.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(no_context.status().message()).find("auto_tier_max_tokens") !=
        std::string::npos);
  options.auto_tier_max_tokens = 4096;
  options.auto_tier_budget_bytes = -1;
  auto negative = MakeCudaBackend(config, weights, options);
  CHECK(negative.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("cuda: the device tier gives the host tier's logits and retrievals bit for bit",
          "[cuda][device_tier]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 81);
  const int64_t k = config.enc_chunk_size;
  for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    INFO("precision " << CudaPrecisionName(precision));
    CudaBackendOptions device_options = testing::PrecisionOptions(precision);
    device_options.chunk_tier = CudaChunkTier::kDevice;
    const HostAndDevice backends = MakeBackends(config, weights,
                                                testing::PrecisionOptions(precision),
                                                device_options);
    auto t = NewTwins(backends);
    // A prefill of 40 chunks in steps of the backend's size (1024
    // positions: up to 17 query chunks a slice, each with its own
    // selection; the store grows 16 -> 32 -> 64 chunks on the way), then
    // decode across two chunk boundaries (the landmark's selection serves
    // the next chunk).
    const std::vector<int32_t> prompt = testing::RandomTokens(config, 40 * k + 17, 5);
    const int64_t prefill_differing = PrefillBoth(backends, *t, prompt, 1000);
    REQUIRE(t->host->num_chunks() > 8 * config.chunk_topk);
    int64_t decode_differing = 0;
    for (int step = 0; step < 2 * k; ++step) {
      decode_differing += StepBoth(backends, *t, testing::RandomTokens(config, 1, 1000 + step));
    }
    WARN("cuda " << CudaPrecisionName(precision)
                 << " device vs host chunk tier: logits differing in their bits: prefill "
                 << prefill_differing << ", decode " << decode_differing);
    CHECK(prefill_differing == 0);
    CHECK(decode_differing == 0);
    CheckSameRetrievals(*t);
    // The selections changed along the way, else equal logits would not
    // show that the device tier serves the right chunks: the CPU backend
    // with these weights and tokens changes group 0's selection at most
    // landmarks (the CPU-run case "the bit-identity case's tokens change the
    // selection", below, measures and checks it).
    CHECK(SelectionChanges(t->device_log, 0) > 10);

    // Nothing crossed the bus, nothing is on the host.
    const BackendSessionStats host_stats = t->host->backend_session().stats();
    const BackendSessionStats device_stats = t->device->backend_session().stats();
    CHECK(host_stats.h2d_chunks > 0);
    CHECK(device_stats.h2d_chunks == 0);
    CHECK(device_stats.h2d_bytes == 0);
    CHECK(device_stats.d2d_chunks == 0);
    CHECK(device_stats.d2h_bytes == 0);
    CHECK(device_stats.resident_hits > 0);
    const SessionMemory host_memory = t->host->backend_session().memory();
    const SessionMemory device_memory = t->device->backend_session().memory();
    CHECK(host_memory.chunk_store_bytes > 0);
    CHECK(device_memory.chunk_store_bytes == 0);
    CHECK(backends.device->host_bytes_per_chunk() == 0);
    CHECK(backends.host->host_bytes_per_chunk() == ChunkBytes(config, precision));
    // Device memory: the store (doubled from 16 chunks to hold them all)
    // instead of the groups' slot buffers ((1024/64 + 1) query chunks x
    // top-k slots of K and V each) and the encoder's K/V output (1024 rows
    // of K and V).
    const int64_t chunks = t->device->num_chunks();
    const int64_t capacity = cuda::GrownDeviceStoreCapacity(0, chunks, 16);
    CHECK(capacity == 64);
    const int64_t slots = (1024 / 64 + 1) * config.chunk_topk;
    const int64_t slot_buffers = config.num_groups() * slots * ChunkBytes(config, precision);
    const int64_t encoder_kv = 2 * 1024 * config.hidden_size * ElementBytes(precision);
    CHECK(static_cast<int64_t>(device_memory.device_bytes) -
              static_cast<int64_t>(host_memory.device_bytes) ==
          capacity * ChunkBytes(config, precision) - slot_buffers - encoder_kv);
  }
}

TEST_CASE("the bit-identity case's tokens change the selection at most landmarks (CPU)",
          "[cuda][device_tier]") {
  // The premise of the case above (its CHECK of more than 10 changes), on
  // the CPU backend with the same weights and tokens, so that it is seen
  // without a GPU: group 0's selection changes at 39 of the 41 landmarks
  // after the first (measured here, on this machine's CPU backend; the GPU
  // case counts its own selections' changes).
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 81);
  const int64_t k = config.enc_chunk_size;
  auto backend = MakeCpuBackend(config, weights, {});
  auto session = Session::Create(*backend);
  REQUIRE(session.ok());
  testing::RetrievalLog log;
  testing::Record((*session)->backend_session(), log);
  const std::vector<int32_t> prompt = testing::RandomTokens(config, 40 * k + 17, 5);
  for (size_t at = 0; at < prompt.size(); at += 1000) {
    const size_t n = std::min<size_t>(1000, prompt.size() - at);
    REQUIRE((*session)
                ->Append(std::vector<int32_t>(prompt.begin() + at, prompt.begin() + at + n))
                .ok());
  }
  for (int step = 0; step < 2 * k; ++step) {
    REQUIRE((*session)->Append(testing::RandomTokens(config, 1, 1000 + step)).ok());
  }
  int64_t landmarks = 0;
  for (const auto& [key, r] : log) landmarks += key.second == 0 ? 1 : 0;
  const int64_t changes = SelectionChanges(log, 0);
  INFO("group 0: " << changes << " changes over " << landmarks << " landmarks");
  CHECK(landmarks == 42);
  CHECK(changes == 39);
}

TEST_CASE("cuda: the device store grows by doubling, counted in device_bytes",
          "[cuda][device_tier]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 82);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kBf16);
  options.chunk_tier = CudaChunkTier::kDevice;
  auto backend = MakeCudaBackend(config, weights, options);
  REQUIRE(backend.ok());
  auto session = Session::Create(**backend);
  REQUIRE(session.ok());
  const int64_t chunk_bytes = ChunkBytes(config, CudaPrecision::kBf16);
  auto device_bytes = [&] {
    return static_cast<int64_t>((*session)->backend_session().memory().device_bytes);
  };
  // A fresh session's store holds 16 chunks already (GCA runs before the
  // first chunk closes and needs its arrays): 16 more than a host-tier
  // session of the same options would have in their place.
  const int64_t created = device_bytes();
  auto append = [&](int64_t tokens, uint32_t seed) {
    const std::vector<int32_t> ids = testing::RandomTokens(config, tokens, seed);
    StepEntry entry;
    entry.session = session->get();
    entry.tokens = ids;
    REQUIRE(RunStep(**backend, {entry})[0].ok());
  };
  // 16 chunks (16 x 63 tokens) fit the first capacity.
  append(16 * 63, 1);
  REQUIRE((*session)->num_chunks() == 16);
  CHECK(device_bytes() == created);
  // One more: doubled to 32 (the landmark matrix keeps its first 1024).
  append(63, 2);
  REQUIRE((*session)->num_chunks() == 17);
  CHECK(device_bytes() - created == 16 * chunk_bytes);
  // Up to 32 stays; the 33rd doubles again.
  append(15 * 63, 3);
  CHECK(device_bytes() - created == 16 * chunk_bytes);
  append(63, 4);
  REQUIRE((*session)->num_chunks() == 33);
  CHECK(device_bytes() - created == 48 * chunk_bytes);
  CHECK((*session)->backend_session().memory().chunk_store_bytes == 0);
  // Without state export the disk tier is UNIMPLEMENTED (naming the flag),
  // as for any session, before the device tier's own refusal.
  const absl::Status map = (*session)->backend_session().MapChunks(nullptr);
  CHECK(map.code() == absl::StatusCode::kUnimplemented);
}

TEST_CASE("cuda: device-tier forks match host-tier forks bit for bit", "[cuda][device_tier]") {
  if (!testing::HaveGpu()) return;
  // Steps of two chunks (the store grows inside the prefill), then a fork
  // of each: the device fork copies the store, the host fork shares the
  // records. Then both parents and both forks decode on.
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 83);
  for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    INFO("precision " << CudaPrecisionName(precision));
    CudaBackendOptions host_options = testing::PrecisionOptions(precision);
    host_options.max_step_positions = 128;
    CudaBackendOptions device_options = host_options;
    device_options.chunk_tier = CudaChunkTier::kDevice;
    const HostAndDevice backends = MakeBackends(config, weights, host_options, device_options);
    auto t = NewTwins(backends);
    int64_t differing =
        PrefillBoth(backends, *t, testing::RandomTokens(config, 20 * 63 + 5, 9), 100);
    Twins forks;
    auto host_fork = t->host->Fork();
    auto device_fork = t->device->Fork();
    REQUIRE(host_fork.ok());
    REQUIRE(device_fork.ok());
    Attach(forks, *std::move(host_fork), *std::move(device_fork));
    CHECK(forks.device->backend_session().memory().chunk_store_bytes == 0);
    int64_t fork_differing = 0;
    for (int step = 0; step < 70; ++step) {
      // The forks and the parents take different tokens: the parents' own
      // stores must not have been touched by the forks.
      fork_differing +=
          StepBoth(backends, forks, testing::RandomTokens(config, 1, 50 + step));
      differing += StepBoth(backends, *t, testing::RandomTokens(config, 1, 500 + step));
    }
    WARN("cuda " << CudaPrecisionName(precision)
                 << " device vs host tier, small steps and a fork: logits differing: parents "
                 << differing << ", forks " << fork_differing);
    CHECK(differing == 0);
    CHECK(fork_differing == 0);
    CheckSameRetrievals(*t);
    CheckSameRetrievals(forks);
  }
}

TEST_CASE("cuda: auto puts a session on the device while its store fits, else on the host",
          "[cuda][device_tier]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 84);
  const CudaPrecision precision = CudaPrecision::kFp32;
  const int64_t chunk_bytes = ChunkBytes(config, precision);
  // Sessions of up to 1400 tokens (23 chunks), a budget of one such store:
  // the first session gets the device, a second (here: the fork) the host.
  const int64_t max_tokens = 1400;
  const int64_t store_chunks = cuda::MaxChunksForTokens(max_tokens, config.enc_chunk_size);
  REQUIRE(store_chunks == 23);
  CudaBackendOptions host_options = testing::PrecisionOptions(precision);
  host_options.max_step_positions = 256;
  CudaBackendOptions auto_options = host_options;
  auto_options.chunk_tier = CudaChunkTier::kAuto;
  auto_options.auto_tier_max_tokens = max_tokens;
  auto_options.auto_tier_budget_bytes = store_chunks * chunk_bytes;
  const HostAndDevice backends = MakeBackends(config, weights, host_options, auto_options);
  // A session's store of a host-tier figure: auto may put it on either.
  CHECK(backends.device->host_bytes_per_chunk() == chunk_bytes);

  auto t = NewTwins(backends);
  // The device tier from the start: the whole store is made at creation.
  const SessionMemory fresh = t->device->backend_session().memory();
  int64_t differing =
      PrefillBoth(backends, *t, testing::RandomTokens(config, 15 * 63 + 10, 11), 250);
  CHECK(t->device->backend_session().memory().chunk_store_bytes == 0);
  CHECK(t->device->backend_session().stats().h2d_chunks == 0);
  CHECK(static_cast<int64_t>(t->device->backend_session().memory().device_bytes) ==
        static_cast<int64_t>(fresh.device_bytes));  // no growth within the grant

  // The fork finds no room: the host tier, its chunks copied off the device.
  Twins forks;
  auto host_fork = t->host->Fork();
  auto auto_fork = t->device->Fork();
  REQUIRE(host_fork.ok());
  REQUIRE(auto_fork.ok());
  Attach(forks, *std::move(host_fork), *std::move(auto_fork));
  int64_t fork_differing = 0;
  for (int step = 0; step < 70; ++step) {
    fork_differing += StepBoth(backends, forks, testing::RandomTokens(config, 1, 70 + step));
    differing += StepBoth(backends, *t, testing::RandomTokens(config, 1, 700 + step));
  }
  const SessionMemory fork_memory = forks.device->backend_session().memory();
  CHECK(fork_memory.chunk_store_bytes > 0);  // on the host
  CHECK(t->device->backend_session().stats().chunks_on_device);
  CHECK_FALSE(forks.device->backend_session().stats().chunks_on_device);
  CHECK(forks.device->backend_session().stats().h2d_chunks > 0);
  CHECK(t->device->backend_session().stats().h2d_chunks == 0);  // the parent stays on the device
  WARN("cuda fp32 auto vs host tier: logits differing: parents " << differing << ", forks "
                                                                  << fork_differing);
  CHECK(differing == 0);
  CHECK(fork_differing == 0);
  CheckSameRetrievals(*t);
  CheckSameRetrievals(forks);

  // Once the device-tier session is gone, its grant is free again: a new
  // session gets the device tier (its store made whole at creation), and
  // a context that never fits gives the host tier.
  t.reset();
  auto again = Session::Create(*backends.device);
  REQUIRE(again.ok());
  CHECK(static_cast<int64_t>((*again)->backend_session().memory().device_bytes) ==
        static_cast<int64_t>(fresh.device_bytes));
  auto_options.auto_tier_max_tokens = int64_t{1} << 32;
  auto big = MakeCudaBackend(config, weights, auto_options);
  REQUIRE(big.ok());
  auto host_session = Session::Create(**big);
  REQUIRE(host_session.ok());
  CHECK(static_cast<int64_t>((*host_session)->backend_session().memory().device_bytes) ==
        static_cast<int64_t>(fresh.device_bytes) - store_chunks * chunk_bytes +
            // a host-tier session has the slot buffers and the encoder's K/V
            // output instead: (256/64 + 1) x top-k slots per group, 256 rows
            config.num_groups() * (256 / 64 + 1) * config.chunk_topk * chunk_bytes +
            2 * 256 * config.hidden_size * ElementBytes(precision));
}

// Runs tokens[i] on twins i, all in one RunStep per backend; returns the
// logits differing in their bits over every twin.
int64_t StepAllBoth(const HostAndDevice& backends, std::vector<std::unique_ptr<Twins>>& twins,
                    const std::vector<std::vector<int32_t>>& tokens) {
  const int64_t V = backends.host->config().vocab_size;
  const size_t n = twins.size();
  std::vector<std::vector<float>> host_logits(n), device_logits(n);
  std::vector<StepEntry> host(n), device(n);
  for (size_t i = 0; i < n; ++i) {
    host[i].session = twins[i]->host.get();
    host[i].tokens = tokens[i];
    host[i].all_logits = &host_logits[i];
    device[i] = host[i];
    device[i].session = twins[i]->device.get();
    device[i].all_logits = &device_logits[i];
  }
  for (const absl::Status& s : RunStep(*backends.host, host)) REQUIRE(s.ok());
  for (const absl::Status& s : RunStep(*backends.device, device)) REQUIRE(s.ok());
  int64_t differing = 0;
  for (size_t i = 0; i < n; ++i) {
    INFO("session " << i);
    REQUIRE(host_logits[i].size() == tokens[i].size() * V);
    REQUIRE(StoredChunks(twins[i]->device->backend_session()) == twins[i]->host->num_chunks());
    differing += DifferingBits(host_logits[i], device_logits[i]);
  }
  return differing;
}

TEST_CASE("cuda: batched steps of several device-tier sessions, one growing, match the host tier",
          "[cuda][device_tier]") {
  if (!testing::HaveGpu()) return;
  // batched_step_rows: the sessions' rows share the step's GEMMs, and each
  // session's GCA reads its own store (device) or slot buffers (host). One
  // session crosses its store's first capacity (16 chunks) inside a
  // batched step: the growth happens before the forward (RunStep's
  // PrepareSessionForStep) and the others' rows are unaffected.
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 85);
  const int64_t k = config.enc_chunk_size;
  for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    INFO("precision " << CudaPrecisionName(precision));
    CudaBackendOptions host_options = testing::PrecisionOptions(precision);
    host_options.batched_step_rows = true;
    host_options.max_step_positions = 512;
    CudaBackendOptions device_options = host_options;
    device_options.chunk_tier = CudaChunkTier::kDevice;
    const HostAndDevice backends = MakeBackends(config, weights, host_options, device_options);
    std::vector<std::unique_ptr<Twins>> twins;
    int64_t differing = 0;
    const int64_t histories[] = {15 * k + 3, 5 * k + 10, 30};
    for (int i = 0; i < 3; ++i) {
      twins.push_back(NewTwins(backends));
      differing += PrefillBoth(backends, *twins.back(),
                               testing::RandomTokens(config, histories[i], 20 + i), 400);
    }
    const int64_t chunk_bytes = ChunkBytes(config, precision);
    auto device_bytes = [&](int i) {
      return static_cast<int64_t>(twins[i]->device->backend_session().memory().device_bytes);
    };
    const int64_t before = device_bytes(0);
    REQUIRE(twins[0]->device->num_chunks() == 15);
    // Session 0 closes two chunks (15 -> 17: its store doubles to 32).
    differing += StepAllBoth(backends, twins,
                             {testing::RandomTokens(config, 2 * k, 30),
                              testing::RandomTokens(config, 7, 31),
                              testing::RandomTokens(config, 100, 32)});
    CHECK(twins[0]->device->num_chunks() == 17);
    CHECK(device_bytes(0) - before == 16 * chunk_bytes);
    for (int step = 0; step < 70; ++step) {
      differing += StepAllBoth(backends, twins,
                               {testing::RandomTokens(config, 1, 100 + step),
                                testing::RandomTokens(config, 1, 200 + step),
                                testing::RandomTokens(config, 1, 300 + step)});
    }
    WARN("cuda " << CudaPrecisionName(precision)
                 << " batched steps, device vs host tier: logits differing " << differing);
    CHECK(differing == 0);
    for (const auto& t : twins) CheckSameRetrievals(*t);
  }
}

TEST_CASE("cuda: tensor-core prefill reads the device store as it reads the slot buffers",
          "[cuda][device_tier]") {
  if (!testing::HaveGpu()) return;
  // prefill_tensor_cores (bf16 mma.sync GCA and window kernels): the
  // kernel reads chunk K/V through the slot table, slot = chunk id in the
  // device tier; same values in the same order, so the same bits.
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 86);
  const int64_t k = config.enc_chunk_size;
  CudaBackendOptions host_options = testing::PrecisionOptions(CudaPrecision::kBf16);
  host_options.prefill_tensor_cores = true;
  CudaBackendOptions device_options = host_options;
  device_options.chunk_tier = CudaChunkTier::kDevice;
  const HostAndDevice backends = MakeBackends(config, weights, host_options, device_options);
  auto t = NewTwins(backends);
  const int64_t prefill_differing =
      PrefillBoth(backends, *t, testing::RandomTokens(config, 40 * k + 17, 12), 1000);
  int64_t decode_differing = 0;
  for (int step = 0; step < k + 2; ++step) {
    decode_differing += StepBoth(backends, *t, testing::RandomTokens(config, 1, 400 + step));
  }
  WARN("cuda bf16 tensor-core prefill, device vs host tier: logits differing: prefill "
       << prefill_differing << ", decode " << decode_differing);
  CHECK(prefill_differing == 0);
  CHECK(decode_differing == 0);
  CheckSameRetrievals(*t);
  CHECK(SelectionChanges(t->device_log, 0) > 10);
}

TEST_CASE("cuda: an auto fork with room gets the device tier, bit for bit the host fork",
          "[cuda][device_tier]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 87);
  const CudaPrecision precision = CudaPrecision::kBf16;
  const int64_t chunk_bytes = ChunkBytes(config, precision);
  const int64_t max_tokens = 1400;  // 23 chunks a store
  const int64_t store_chunks = cuda::MaxChunksForTokens(max_tokens, config.enc_chunk_size);
  CudaBackendOptions host_options = testing::PrecisionOptions(precision);
  host_options.max_step_positions = 256;
  CudaBackendOptions auto_options = host_options;
  auto_options.chunk_tier = CudaChunkTier::kAuto;
  auto_options.auto_tier_max_tokens = max_tokens;
  // Room for two stores: the parent's and its fork's; a third session
  // finds none.
  auto_options.auto_tier_budget_bytes = 2 * store_chunks * chunk_bytes;
  const HostAndDevice backends = MakeBackends(config, weights, host_options, auto_options);
  auto t = NewTwins(backends);
  int64_t differing =
      PrefillBoth(backends, *t, testing::RandomTokens(config, 12 * 63 + 5, 13), 250);
  Twins forks;
  auto host_fork = t->host->Fork();
  auto auto_fork = t->device->Fork();
  REQUIRE(host_fork.ok());
  REQUIRE(auto_fork.ok());
  Attach(forks, *std::move(host_fork), *std::move(auto_fork));
  BackendSession& fork = forks.device->backend_session();
  CHECK(t->device->backend_session().stats().chunks_on_device);
  CHECK(fork.stats().chunks_on_device);
  CHECK(fork.memory().chunk_store_bytes == 0);
  CHECK(StoredChunks(fork) == 12);
  // Its store made whole at creation, like its parent's.
  CHECK(fork.memory().device_bytes == t->device->backend_session().memory().device_bytes);
  auto third = Session::Create(*backends.device);
  REQUIRE(third.ok());
  CHECK_FALSE((*third)->backend_session().stats().chunks_on_device);
  int64_t fork_differing = 0;
  for (int step = 0; step < 70; ++step) {
    fork_differing += StepBoth(backends, forks, testing::RandomTokens(config, 1, 80 + step));
    differing += StepBoth(backends, *t, testing::RandomTokens(config, 1, 800 + step));
  }
  CHECK(fork.stats().h2d_chunks == 0);
  WARN("cuda bf16 auto fork on the device vs host fork: logits differing: parents "
       << differing << ", forks " << fork_differing);
  CHECK(differing == 0);
  CHECK(fork_differing == 0);
  CheckSameRetrievals(*t);
  CheckSameRetrievals(forks);
}

// [allocation]: fails an allocation on purpose, so it runs alone on the
// device (tests/cuda_backend/CMakeLists.txt) and outside memcheck.
TEST_CASE("cuda: a device store that cannot grow says so and changes nothing",
          "[cuda][device_tier][allocation]") {
  if (!testing::HaveGpu()) return;
  // 4 chunks of 64 rows x 16 floats, 3 held with known values; a Reserve
  // of 2^40 chunks (2^52 bytes a array) must fail as RESOURCE_EXHAUSTED,
  // keep the capacity, the count and the contents, and leave no error
  // behind for the next launch (cudaGetLastError is cleared).
  constexpr int64_t kWidth = 16, kElements = 64 * kWidth;
  cuda::DeviceChunkStore<float> store(kElements);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  REQUIRE(store.Reserve(4, /*exact=*/true, stream).ok());
  REQUIRE(store.capacity() == 4);
  std::vector<float> keys(4 * kElements), values(4 * kElements);
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = static_cast<float>(i);
    values[i] = -static_cast<float>(i);
  }
  REQUIRE(cudaMemcpy(store.keys(), keys.data(), keys.size() * 4, cudaMemcpyHostToDevice) ==
          cudaSuccess);
  REQUIRE(cudaMemcpy(store.values(), values.data(), values.size() * 4,
                     cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(store.Append(3).ok());
  const int64_t bytes = store.bytes();
  const float* keys_before = store.keys();

  const absl::Status refused = store.Reserve(int64_t{1} << 40, /*exact=*/true, stream);
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(refused.message()).find("device chunk store cannot grow") !=
        std::string::npos);
  CHECK(store.capacity() == 4);
  CHECK(store.size() == 3);
  CHECK(store.bytes() == bytes);
  CHECK(store.keys() == keys_before);
  CHECK(cudaGetLastError() == cudaSuccess);

  // The next launch is clean: zero row 5 of every chunk's keys.
  CHECK(kernels::LaunchZeroChunkRow(store.keys(), 4, 5, static_cast<int>(kWidth), stream) ==
        cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
  std::vector<float> keys_after(keys.size()), values_after(values.size());
  REQUIRE(cudaMemcpy(keys_after.data(), store.keys(), keys.size() * 4, cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  REQUIRE(cudaMemcpy(values_after.data(), store.values(), values.size() * 4,
                     cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(values_after == values);
  for (int64_t c = 0; c < 4; ++c) {
    for (int64_t e = 0; e < kElements; ++e) {
      const size_t i = static_cast<size_t>(c * kElements + e);
      const float expected = e / kWidth == 5 ? 0.f : keys[i];
      if (keys_after[i] != expected) {
        FAIL_CHECK("chunk " << c << " element " << e << ": " << keys_after[i] << " vs "
                            << expected);
      }
    }
  }
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

}  // namespace
}  // namespace drt
