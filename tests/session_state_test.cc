// Export and restore of one session's complete state (engine/session_state.h):
// a restored session continues with bit-identical logits and tokens, and bad
// states are refused by name without changing anything.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "engine/backend.h"
#include "engine/crc32c.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/model_dir.h"
#include "engine/model_fingerprint.h"
#include "engine/session.h"
#include "engine/session_state.h"
#include "tests/test_util/random_model.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/tiny_model.h"
#include "tests/test_util/build_paths.h"

namespace drt {
namespace {

using Catch::Matchers::Contains;

// Everything a restore needs, read once from `session`: its small state
// through the byte encoding (as the state files hold it) and its chunks.
struct Exported {
  std::string small;
  std::vector<std::string> chunks;
};

Exported Export(const Session& session) {
  auto state = session.ExportState();
  REQUIRE(state.ok());
  Exported e;
  auto small = EncodeSessionState(*state, session.config());
  REQUIRE(small.ok());
  e.small = *std::move(small);
  for (int64_t c = 0; c < session.num_chunks(); ++c) {
    ChunkData chunk;
    REQUIRE(session.backend_session().ReadChunk(c, chunk).ok());
    e.chunks.emplace_back();
    EncodeChunk(chunk, e.chunks.back());
  }
  return e;
}

// The original and the restored session run on the same backend, so their
// appends are cut into the same forwards (max_step_positions), which keeps
// the float rounding identical.
absl::StatusOr<std::unique_ptr<Session>> Restore(Backend& backend, const Exported& e) {
  auto state = DecodeSessionState(e.small, backend.config());
  if (!state.ok()) return state.status();
  return Session::Restore(
      backend, *state,
      [&](int64_t c, ChunkData& out) { return DecodeChunk(e.chunks.at(c), backend.config(), out); });
}

std::vector<float> Logits(const Session& s) {
  return std::vector<float>(s.last_logits().begin(), s.last_logits().end());
}

// Appends the same tokens to both (every position's logits compared), then
// generates greedily on both; everything must be bit-identical.
void RequireSameContinuation(Session& original, Session& restored, const ModelConfig& config,
                             uint64_t seed) {
  REQUIRE(restored.num_tokens() == original.num_tokens());
  REQUIRE(restored.num_chunks() == original.num_chunks());
  REQUIRE(Logits(restored) == Logits(original));
  // Enough tokens to close chunks (new retrievals over the restored landmarks).
  const auto tail = testing::RandomTokens(config, 3 * config.enc_chunk_size + 5, seed);
  AppendOptions all;
  all.all_logits = true;
  auto a = original.Append(tail, all);
  auto b = restored.Append(tail, all);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->logits.size() == tail.size() * config.vocab_size);
  REQUIRE(b->logits == a->logits);
  // Every closed chunk too, including the one open at the export (its rows
  // came through the state) even when no selection has used it yet.
  REQUIRE(restored.num_chunks() == original.num_chunks());
  for (int64_t c = 0; c < original.num_chunks(); ++c) {
    ChunkData x, y;
    REQUIRE(original.backend_session().ReadChunk(c, x).ok());
    REQUIRE(restored.backend_session().ReadChunk(c, y).ok());
    REQUIRE(y.landmark == x.landmark);
    REQUIRE(y.rows == x.rows);
  }
  GenerateOptions greedy;
  greedy.max_tokens = 20;
  std::vector<float> logprobs_a, logprobs_b;
  greedy.on_token = [&](int32_t, float lp) { logprobs_a.push_back(lp); return true; };
  auto ga = original.Generate(greedy);
  greedy.on_token = [&](int32_t, float lp) { logprobs_b.push_back(lp); return true; };
  auto gb = restored.Generate(greedy);
  REQUIRE(ga.ok());
  REQUIRE(gb.ok());
  REQUIRE(gb->tokens == ga->tokens);
  REQUIRE(logprobs_b == logprobs_a);
  REQUIRE(Logits(restored) == Logits(original));
}

// Sessions at several points: before any token, mid-chunk, on a boundary;
// all but the first with more closed chunks than top-k, so that selections
// are in force when exported.
void CheckRoundTrips(Backend& backend, uint64_t seed) {
  const ModelConfig& c = backend.config();
  const int64_t many = (c.chunk_topk + 2) * c.enc_chunk_size;
  for (int64_t prompt_tokens : {int64_t{0}, many + c.enc_chunk_size / 2, many,
                                many + c.enc_chunk_size - 1}) {
    CAPTURE(prompt_tokens);
    auto original = Session::Create(backend);
    REQUIRE(original.ok());
    if (prompt_tokens > 0) {
      REQUIRE((*original)->Append(testing::RandomTokens(c, prompt_tokens, seed)).ok());
      bool selected = false;
      for (const Retrieval& r : (*original)->backend_session().current_retrieval()) {
        selected = selected || !r.chunks.empty();
      }
      REQUIRE(selected);
    }
    const Exported e = Export(**original);
    auto restored = Restore(backend, e);
    REQUIRE(restored.ok());
    // A restored session exports exactly what it was restored from.
    REQUIRE(Export(**restored).small == e.small);
    if (prompt_tokens == 0) continue;  // nothing to continue from
    RequireSameContinuation(**original, **restored, c, seed + 1);
  }
}

TEST_CASE("a restored session continues bit-identically (tiny random model)", "[session_state]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 31);
  auto backend = MakeCpuBackend(config, weights);
  CheckRoundTrips(*backend, 100);
}

TEST_CASE("a restored session continues bit-identically (reference unittest config)",
          "[session_state]") {
  // Its shapes (chunks of 63, GQA with one K/V head, two groups, window
  // 512) with the flash-attention flag on, as loader_test parses it.
  const std::string path =
      std::string(drt::testing::SourceDir()) + "/tests/fixtures/reference_configs/drt-config_unittest.json";
  std::ifstream in(path);
  nlohmann::json json = nlohmann::json::parse(in);
  json["_flash_attn_2_enabled"] = true;
  auto config = ParseModelConfig(json.dump(), path);
  INFO(config.status().message());
  REQUIRE(config.ok());
  const ModelWeights weights = testing::RandomWeights(*config, 32);
  auto backend = MakeCpuBackend(*config, weights);
  CheckRoundTrips(*backend, 200);
}

TEST_CASE("a restored session continues bit-identically (bundled model)", "[session_state]") {
  auto model = LoadModel(std::string(drt::testing::SourceDir()) + "/models/drt-passkey-byte");
  REQUIRE(model.ok());
  auto backend = MakeCpuBackend((*model)->config(), (*model)->weights());
  CheckRoundTrips(*backend, 300);
}

struct TinyFixture {
  ModelConfig config = testing::TinyConfig();
  ModelWeights weights = testing::RandomWeights(config, 33);
  std::unique_ptr<Backend> backend = MakeCpuBackend(config, weights);
  std::unique_ptr<Session> session;
  Exported exported;
  TinyFixture() {
    auto s = Session::Create(*backend);
    REQUIRE(s.ok());
    session = *std::move(s);
    REQUIRE(session->Append(testing::RandomTokens(config, 45, 7)).ok());
    exported = Export(*session);
  }
};

TEST_CASE("damaged or foreign states are refused by name", "[session_state]") {
  TinyFixture f;
  SECTION("truncated small state") {
    auto s = DecodeSessionState(std::string_view(f.exported.small).substr(0, f.exported.small.size() - 3),
                                f.config);
    REQUIRE(s.status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("trailing bytes") {
    auto s = DecodeSessionState(f.exported.small + "x", f.config);
    REQUIRE_THAT(std::string(s.status().message()), Contains("unexpected bytes"));
  }
  SECTION("another model's shape") {
    ModelConfig other = f.config;
    other.hidden_size = 64;
    auto s = DecodeSessionState(f.exported.small, other);
    REQUIRE(s.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(s.status().message()), Contains("hidden_size 32"));
  }
  SECTION("another model's head counts with the same kv_width") {
    // H=4, 2 K/V heads of 8 against H=2, 1 K/V head of 16: every stored size
    // is the same, so only the head counts tell the models apart.
    ModelConfig other = f.config;
    other.num_attention_heads = 2;
    other.num_key_value_heads = 1;
    REQUIRE(other.num_key_value_heads * other.head_dim() ==
            f.config.num_key_value_heads * f.config.head_dim());
    auto s = DecodeSessionState(f.exported.small, other);
    REQUIRE(s.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(s.status().message()),
                 Contains("num_attention_heads 4; this model has 2"));
    other.num_attention_heads = f.config.num_attention_heads;
    s = DecodeSessionState(f.exported.small, other);
    REQUIRE_THAT(std::string(s.status().message()),
                 Contains("num_key_value_heads 2; this model has 1"));
  }
  SECTION("another model's fingerprint") {
    ModelConfig other = f.config;
    other.fingerprint = std::make_shared<const ModelFingerprint>(0x1234abcd);
    auto s = DecodeSessionState(f.exported.small, other);
    REQUIRE(s.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(s.status().message()),
                 Contains("fingerprint 00000000; this model's is 1234abcd"));
  }
  SECTION("an engine state of version 1 (shape count 8 first, no fingerprint)") {
    std::string v1(8, '\0');
    v1[0] = 8;
    v1 += f.exported.small.substr(12);  // whatever follows: refused before it is read
    auto s = DecodeSessionState(v1, f.config);
    REQUIRE(s.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(s.status().message()), Contains("engine state version 1"));
  }
  SECTION("a newer engine state version, and a foreign magic") {
    std::string newer = f.exported.small;
    newer[8] = 3;  // the u32 version after the 8-byte magic
    auto s = DecodeSessionState(newer, f.config);
    REQUIRE(s.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(s.status().message()),
                 Contains("engine state version 3; this server reads version 2") &&
                     Contains("newer"));
    std::string foreign = f.exported.small;
    foreign[0] = 'X';
    s = DecodeSessionState(foreign, f.config);
    REQUIRE(s.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(s.status().message()), Contains("not an engine session state"));
  }
  SECTION("token count that does not match the position") {
    auto state = DecodeSessionState(f.exported.small, f.config);
    REQUIRE(state.ok());
    state->num_tokens += 1;
    REQUIRE_THAT(std::string(ValidateSessionState(*state, f.config).message()),
                 Contains("does not match"));
  }
  SECTION("non-finite last logits (the sampler would pick an arbitrary token)") {
    auto state = DecodeSessionState(f.exported.small, f.config);
    REQUIRE(state.ok());
    // -inf is a token the sampler never picks (CheckSamplableLogits): allowed.
    {
      SessionState masked = *state;
      masked.last_logits[3] = -std::numeric_limits<float>::infinity();
      REQUIRE(ValidateSessionState(masked, f.config).ok());
      REQUIRE(DecodeSessionState(*EncodeSessionState(masked, f.config), f.config).ok());
    }
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      SessionState damaged = *state;
      damaged.last_logits[3] = bad;
      const std::string want = std::isnan(bad) ? "last_logits[3] is NaN" : "last_logits[3] is +inf";
      INFO(want);
      REQUIRE_THAT(std::string(ValidateSessionState(damaged, f.config).message()), Contains(want));
      // Refused when read back from bytes, and by Session::Restore.
      auto decoded = DecodeSessionState(*EncodeSessionState(damaged, f.config), f.config);
      REQUIRE(decoded.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE_THAT(std::string(decoded.status().message()), Contains(want));
      auto restored = Session::Restore(*f.backend, damaged, [&](int64_t c, ChunkData& out) {
        return DecodeChunk(f.exported.chunks.at(c), f.config, out);
      });
      REQUIRE_THAT(std::string(restored.status().message()), Contains(want));
    }
  }
  SECTION("selection naming a chunk that does not exist") {
    auto state = DecodeSessionState(f.exported.small, f.config);
    REQUIRE(state.ok());
    state->backend.selection[0].chunks[0] = 1000;
    REQUIRE_THAT(std::string(ValidateSessionState(*state, f.config).message()),
                 Contains("names chunk 1000"));
  }
  SECTION("damaged selections and floats (finding F5 of the engine review)") {
    auto state = DecodeSessionState(f.exported.small, f.config);
    REQUIRE(state.ok());
    REQUIRE(state->backend.selection[1].chunks.size() >= 2);
    REQUIRE(state->backend.open_chunk.size() >= 2);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    struct Damage {
      const char* want;
      std::function<void(SessionState&)> apply;
    };
    const std::vector<Damage> damages = {
        {"selection of group 1: weight 1 is nan", [&](SessionState& s) { s.backend.selection[1].weights[1] = nan; }},
        {"selection of group 1: weight 0 is -0.25", [&](SessionState& s) { s.backend.selection[1].weights[0] = -0.25f; }},
        {"selection of group 0: weight 1 is inf", [&](SessionState& s) { s.backend.selection[0].weights[1] = inf; }},
        {"names chunk", [&](SessionState& s) {
           auto& chunks = s.backend.selection[1].chunks;
           chunks[1] = chunks[0];
         }},
        {"window keys of layer 2: float 5 is nan", [&](SessionState& s) { s.backend.windows[2].keys[5] = nan; }},
        {"window values of layer 0: float 0 is -inf", [&](SessionState& s) { s.backend.windows[0].values[0] = -inf; }},
        {"open_chunk: float 1 is inf", [&](SessionState& s) { s.backend.open_chunk[1] = inf; }},
    };
    for (const Damage& d : damages) {
      SessionState damaged = *state;
      d.apply(damaged);
      std::string want = d.want;
      if (want == "names chunk") {
        want = absl::StrFormat("selection of group 1 names chunk %d twice (entries 0 and 1)",
                               damaged.backend.selection[1].chunks[0]);
      }
      INFO(want);
      REQUIRE_THAT(std::string(ValidateSessionState(damaged, f.config).message()), Contains(want));
      auto decoded = DecodeSessionState(*EncodeSessionState(damaged, f.config), f.config);
      REQUIRE(decoded.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE_THAT(std::string(decoded.status().message()), Contains(want));
      auto restored = Session::Restore(*f.backend, damaged, [&](int64_t c, ChunkData& out) {
        return DecodeChunk(f.exported.chunks.at(c), f.config, out);
      });
      REQUIRE(restored.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE_THAT(std::string(restored.status().message()), Contains(want));
    }
    // A weight of exactly 0 (exp underflowed in the softmax) is a valid state.
    SessionState zero = *state;
    zero.backend.selection[1].weights[1] = 0.f;
    REQUIRE(ValidateSessionState(zero, f.config).ok());
  }
  SECTION("a chunk record of the wrong size") {
    ChunkData chunk;
    auto s = DecodeChunk(f.exported.chunks[0].substr(1), f.config, chunk);
    REQUIRE_THAT(std::string(s.message()), Contains("chunk record holds"));
  }
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

uint32_t FingerprintOf(const ModelConfig& config) {
  absl::StatusOr<uint32_t> fingerprint = config.model_fingerprint();
  INFO(fingerprint.status().message());
  REQUIRE(fingerprint.ok());
  return *fingerprint;
}

// Two model directories of one shape whose weights differ in one value (a
// fine-tune in the same --state_dir): each loaded model restores its own
// states exactly and refuses the other's, naming both fingerprints.
TEST_CASE("a state is refused by a model of the same shape with other weights",
          "[session_state]") {
  testing::TempDir dir_a, dir_b;
  const testing::TinyModel model_a = testing::MakeTinyModel();
  testing::TinyModel model_b = testing::MakeTinyModel();
  std::vector<float> norm = model_b.values.at("model.norm.weight");
  norm[0] += 0.125f;
  model_b.weights.SetFloats("model.norm.weight", "F32", {static_cast<int64_t>(norm.size())}, norm);
  testing::WriteModelDir(dir_a.path(), model_a.config, model_a.weights);
  testing::WriteModelDir(dir_b.path(), model_b.config, model_b.weights);
  auto a = LoadModelDir(dir_a.path());
  auto b = LoadModelDir(dir_b.path());
  REQUIRE(a.ok());
  REQUIRE(b.ok());

  // Loading computes no fingerprint: only states need it.
  REQUIRE(a->config.fingerprint != nullptr);
  CHECK_FALSE(a->config.fingerprint->computed());
  CHECK_FALSE(b->config.fingerprint->computed());
  // The fingerprint is CRC-32C of config.json then model.safetensors, as
  // one independent pass over the two files' bytes gives it, and as the
  // eager computation (its own read of the files) gives it.
  const std::string bytes_a =
      ReadBytes(dir_a.File("config.json")) + ReadBytes(dir_a.File("model.safetensors"));
  REQUIRE(FingerprintOf(a->config) == Crc32c(bytes_a.data(), bytes_a.size()));
  CHECK(a->config.fingerprint->computed());
  auto eager = ComputeModelFingerprint(dir_a.File("config.json"), dir_a.File("model.safetensors"));
  REQUIRE(eager.ok());
  REQUIRE(FingerprintOf(a->config) == *eager);
  REQUIRE(FingerprintOf(a->config) != FingerprintOf(b->config));
  auto a_again = LoadModelDir(dir_a.path());
  REQUIRE(a_again.ok());
  REQUIRE(FingerprintOf(a_again->config) == FingerprintOf(a->config));

  auto backend_a = MakeCpuBackend(a->config, a->weights);
  auto backend_b = MakeCpuBackend(b->config, b->weights);
  CheckRoundTrips(*backend_a, 400);  // its own states: exact

  auto session = Session::Create(*backend_a);
  REQUIRE(session.ok());
  REQUIRE((*session)->Append(testing::RandomTokens(a->config, 10, 5)).ok());
  const Exported e = Export(**session);
  auto refused = Restore(*backend_b, e);
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(refused.status().message()),
               Contains(absl::StrFormat("fingerprint %08x; this model's is %08x",
                                        FingerprintOf(a->config),
                                        FingerprintOf(b->config))));
}

TEST_CASE("a model's fingerprint is computed on first use, once, by one of concurrent callers",
          "[session_state]") {
  testing::TempDir dir;
  const testing::TinyModel model = testing::MakeTinyModel();
  testing::WriteModelDir(dir.path(), model.config, model.weights);
  auto eager = ComputeModelFingerprint(dir.File("config.json"), dir.File("model.safetensors"));
  REQUIRE(eager.ok());
  auto loaded = LoadModelDir(dir.path());
  REQUIRE(loaded.ok());
  // A backend and a session that never export or import a state: the
  // fingerprint stays uncomputed (the weights file is not read again).
  auto backend = MakeCpuBackend(loaded->config, loaded->weights);
  {
    auto session = Session::Create(*backend);
    REQUIRE(session.ok());
    REQUIRE((*session)->Append(testing::RandomTokens(loaded->config, 100, 3)).ok());
  }
  CHECK_FALSE(loaded->config.fingerprint->computed());
  // The backend's copy of the config shares it: its first state computes it.
  REQUIRE(backend->config().fingerprint == loaded->config.fingerprint);
  // Many threads at once: each gets the eager value.
  std::vector<uint32_t> seen(8, 0);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&, i] { seen[i] = backend->config().model_fingerprint().value_or(0); });
  }
  for (auto& t : threads) t.join();
  for (uint32_t v : seen) CHECK(v == *eager);
  CHECK(loaded->config.fingerprint->computed());
  // The file replaced on disk afterwards changes nothing: the value is the
  // loaded bytes'.
  std::ofstream(dir.File("model.safetensors"), std::ios::trunc) << "gone";
  CHECK(FingerprintOf(loaded->config) == *eager);
}

// The weights file written to in place (a checkpoint saved over the same
// path) or truncated after load, before the fingerprint's first use: its
// bytes are no longer the ones running, so exporting or importing a state
// fails naming the file, and nothing faults (the old lazy read through the
// load's mapping gave the new file's CRC, or SIGBUS past a shorter file's
// end).
TEST_CASE("a weights file changed since load is refused at the fingerprint's first use",
          "[session_state]") {
  testing::TempDir dir;
  const testing::TinyModel model = testing::MakeTinyModel();
  testing::WriteModelDir(dir.path(), model.config, model.weights);
  auto loaded = LoadModelDir(dir.path());
  REQUIRE(loaded.ok());
  auto backend = MakeCpuBackend(loaded->config, loaded->weights);
  auto session = Session::Create(*backend);
  REQUIRE(session.ok());
  REQUIRE((*session)->Append(testing::RandomTokens(loaded->config, 70, 4)).ok());
  auto state = (*session)->ExportState();
  REQUIRE(state.ok());
  const std::string weights_path = dir.File("model.safetensors");
  const std::string original = ReadBytes(weights_path);
  // File timestamps advance by the kernel's coarse clock tick (1/HZ: 4 ms
  // at HZ=250, 10 ms at HZ=100); a write within the tick of the file's
  // creation would keep its modification time. 50 ms is past any tick.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  SECTION("overwritten in place, same size") {
    std::fstream file(weights_path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(original.size() - 1));
    file.put(static_cast<char>(original.back() ^ 0x5a));
    file.close();
    REQUIRE(ReadBytes(weights_path).size() == original.size());
  }
  SECTION("truncated to 4 bytes") {
    std::filesystem::resize_file(weights_path, 4);
  }
  auto encoded = EncodeSessionState(*state, backend->config());
  REQUIRE(encoded.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(encoded.status().message()),
               Contains(weights_path + ": weights file changed since load"));
  CHECK(loaded->config.fingerprint->computed());
  // Later uses give the same error (a restart loads the file as it is).
  auto again = loaded->config.model_fingerprint();
  REQUIRE(again.status() == encoded.status());
}

TEST_CASE("a failed import leaves the session unchanged", "[session_state]") {
  TinyFixture f;
  auto state = DecodeSessionState(f.exported.small, f.config);
  REQUIRE(state.ok());
  auto fresh = Session::Create(*f.backend);
  REQUIRE(fresh.ok());
  // A chunk reader that fails part-way.
  absl::Status s = (*fresh)->backend_session().ImportState(
      state->backend, ClosedChunks(*state, f.config), [&](int64_t c, ChunkData& out) {
        if (c == 2) return absl::DataLossError("chunk 2 is damaged");
        return DecodeChunk(f.exported.chunks.at(c), f.config, out);
      });
  REQUIRE(s.code() == absl::StatusCode::kDataLoss);
  REQUIRE((*fresh)->backend_session().position() == 0);
  REQUIRE((*fresh)->num_chunks() == 0);
  // Importing into a session that has processed tokens is refused.
  absl::Status used = f.session->backend_session().ImportState(
      state->backend, ClosedChunks(*state, f.config),
      [&](int64_t c, ChunkData& out) { return DecodeChunk(f.exported.chunks.at(c), f.config, out); });
  REQUIRE(used.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(used.message()), Contains("new session"));
}

}  // namespace
}  // namespace drt

namespace drt {
namespace {

// A long session cut into random steps (appends of 1..200 tokens and single
// generated tokens), exported and restored every few steps, against the
// same steps without restores: every logit identical.
TEST_CASE("a session restored many times along the way matches one never restored",
          "[session_state]") {
  auto model = LoadModel(std::string(drt::testing::SourceDir()) + "/tests/fixtures/two_groups");
  REQUIRE(model.ok());
  auto backend = MakeCpuBackend((*model)->config(), (*model)->weights());
  const ModelConfig& c = backend->config();
  auto plain = Session::Create(*backend);
  auto restored = Session::Create(*backend);
  REQUIRE(plain.ok());
  REQUIRE(restored.ok());
  std::mt19937_64 rng(5);
  Sampler sampler(SamplingParams{});
  int restores = 0;
  while ((*plain)->num_tokens() < 3000) {
    if (rng() % 4 == 0 && (*plain)->num_tokens() > 0) {
      auto a = (*plain)->GenerateStep(sampler);
      auto b = (*restored)->GenerateStep(sampler);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      REQUIRE(a->token == b->token);
      REQUIRE(a->logprob == b->logprob);
    } else {
      const auto tokens = testing::RandomTokens(c, 1 + rng() % 200, rng());
      REQUIRE((*plain)->Append(tokens).ok());
      REQUIRE((*restored)->Append(tokens).ok());
    }
    REQUIRE(Logits(**restored) == Logits(**plain));
    if (rng() % 3 == 0) {
      auto again = Restore(*backend, Export(**restored));
      REQUIRE(again.ok());
      restored = std::move(again);
      ++restores;
    }
  }
  REQUIRE(restores > 10);
}

}  // namespace
}  // namespace drt
