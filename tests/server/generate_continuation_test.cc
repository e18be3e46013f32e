// A Generate that leaves pad_to_chunk_boundary unset pads (on a model whose
// default is to pad) only when prompt tokens were appended since the
// session's last Generate: before a new prompt's answer, not before a
// continuation of the answer (review-grpc finding 2: every call padded
// again, 50+ pad ids between the pieces of one answer). The note that
// decides it (SessionSettings::appended_since_generate) goes with the
// session through ForkSession, SaveSession/LoadSession and a --state_dir
// restart, so that a restart changes nothing a Generate gives.
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/crc32c.h"
#include "server/state_files.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

// The fixture with pad_to_chunk_boundary on by default, as the bundled
// drt-text-byte's generation_config.json has it (loaded once).
FixtureModel& PaddingFixture() {
  static FixtureModel* padded = [] {
    auto* f = new FixtureModel(FixtureModel::Load(FixtureDir()));
    f->model->generation.pad_to_chunk_boundary = true;
    return f;
  }();
  return *padded;
}

// Greedy, ignore_eos (the same number of tokens every time), padding left
// to the server (pad_to_chunk_boundary unset).
drt::v1::GenerateRequest Unset(const std::string& id, int32_t tokens) {
  drt::v1::GenerateRequest request = GreedyRequest(id, tokens);
  request.set_ignore_eos(true);
  return request;
}

GenerateResult Run(drt::v1::Drt::Stub& stub, const drt::v1::GenerateRequest& request) {
  GenerateResult r = Generate(stub, request);
  INFO(r.status.error_message());
  REQUIRE(r.status.ok());
  REQUIRE(r.done.has_value());
  return r;
}

// The padding a Generate on a session of `tokens` tokens adds when it pads.
int64_t PaddingAt(int64_t tokens) {
  const int64_t chunk = PaddingFixture().chunk_size();
  return tokens % chunk == 0 ? 0 : chunk - tokens % chunk;
}

TEST_CASE("a Generate continued over four calls pads once and equals one longer call",
          "[server][generate][padding]") {
  InProcessServer server(*PaddingFixture().model, *PaddingFixture().backend, SmallOptions());
  auto& stub = server.stub();
  const auto prompt = RandomTokens(300, 41);  // 300 = 4 chunks + 48: padding 15
  const std::string whole = NewSession(stub);
  REQUIRE(AppendOnce(stub, whole, prompt).ok());
  const InfoResult pieces = ForkSession(stub, whole);
  REQUIRE(pieces.status.ok());

  const GenerateResult one = Run(stub, Unset(whole, 40));
  REQUIRE(one.done->padding_tokens() == PaddingAt(300));
  REQUIRE(one.tokens.size() == 40);

  std::vector<int32_t> continued;
  std::vector<int64_t> paddings;
  for (int call = 0; call < 4; ++call) {
    const GenerateResult part = Run(stub, Unset(pieces.info.session_id(), 10));
    continued.insert(continued.end(), part.tokens.begin(), part.tokens.end());
    paddings.push_back(part.done->padding_tokens());
    // The session holds what the client received: padding, then tokens.
    CHECK(part.done->tokens_appended() == part.done->padding_tokens() + 10);
  }
  // Only the first call pads (the prompt's answer); calls 2-4 continue it,
  // though each leaves the open chunk part-filled (315 + 10k is never a
  // multiple of 63 here), which made every call pad again before.
  CHECK(paddings == std::vector<int64_t>{PaddingAt(300), 0, 0, 0});
  CHECK(continued == one.tokens);  // greedy: the same ids as one call of 40
  CHECK(GetSession(stub, pieces.info.session_id()).info.tokens() ==
        GetSession(stub, whole).info.tokens());
}

TEST_CASE("an Append after a Generate makes the next unset Generate pad again, and explicit "
          "values keep their meaning",
          "[server][generate][padding]") {
  InProcessServer server(*PaddingFixture().model, *PaddingFixture().backend, SmallOptions());
  auto& stub = server.stub();
  const std::string id = NewSession(stub);
  REQUIRE(AppendOnce(stub, id, RandomTokens(100, 42)).ok());
  int64_t held = 100;
  GenerateResult r = Run(stub, Unset(id, 5));  // the first answer: padded
  CHECK(r.done->padding_tokens() == PaddingAt(held));
  held += r.done->tokens_appended();

  // A new question: padded again.
  REQUIRE(AppendOnce(stub, id, RandomTokens(7, 43)).ok());
  held += 7;
  REQUIRE(PaddingAt(held) > 0);
  r = Run(stub, Unset(id, 5));
  CHECK(r.done->padding_tokens() == PaddingAt(held));
  held += r.done->tokens_appended();

  // Explicit true pads a continuation too.
  REQUIRE(PaddingAt(held) > 0);
  drt::v1::GenerateRequest padded = Unset(id, 3);
  padded.set_pad_to_chunk_boundary(true);
  r = Run(stub, padded);
  CHECK(r.done->padding_tokens() == PaddingAt(held));
  held += r.done->tokens_appended();

  // Explicit false after an Append does not pad, and counts as the
  // answer's start: the unset call after it continues without padding.
  REQUIRE(AppendOnce(stub, id, RandomTokens(9, 44)).ok());
  held += 9;
  REQUIRE(PaddingAt(held) > 0);
  drt::v1::GenerateRequest unpadded = Unset(id, 4);
  unpadded.set_pad_to_chunk_boundary(false);
  r = Run(stub, unpadded);
  CHECK(r.done->padding_tokens() == 0);
  held += 4;
  REQUIRE(PaddingAt(held) > 0);
  r = Run(stub, Unset(id, 4));
  CHECK(r.done->padding_tokens() == 0);
  held += 4;
  CHECK(GetSession(stub, id).info.tokens() == held);
}

TEST_CASE("a model without padding by default pads a continuation or a new prompt only on "
          "request",
          "[server][generate][padding]") {
  InProcessServer server;  // the fixture as loaded: pad_to_chunk_boundary false
  REQUIRE_FALSE(FixtureModel::Get().model->generation.pad_to_chunk_boundary);
  auto& stub = server.stub();
  const std::string id = NewSession(stub);
  REQUIRE(AppendOnce(stub, id, RandomTokens(100, 45)).ok());
  CHECK(Run(stub, Unset(id, 5)).done->padding_tokens() == 0);
  REQUIRE(AppendOnce(stub, id, RandomTokens(7, 46)).ok());
  CHECK(Run(stub, Unset(id, 5)).done->padding_tokens() == 0);
}

TEST_CASE("a fork and a saved session keep whether the next unset Generate pads",
          "[server][generate][padding][session_file]") {
  drt::testing::TempDir files;
  ServiceOptions options = SmallOptions();
  options.session_files_dir = files.path();
  InProcessServer server(*PaddingFixture().model, *PaddingFixture().backend, options);
  auto& stub = server.stub();
  const std::string id = NewSession(stub);
  REQUIRE(AppendOnce(stub, id, RandomTokens(200, 47)).ok());
  // After an Append: a fork and a loaded copy pad (the prompt's answer).
  REQUIRE(SaveSession(stub, id, "appended").ok());
  const InfoResult appended_fork = ForkSession(stub, id);
  REQUIRE(appended_fork.status.ok());
  const InfoResult appended_loaded = LoadSession(stub, "appended");
  REQUIRE(appended_loaded.status.ok());
  CHECK(Run(stub, Unset(appended_fork.info.session_id(), 3)).done->padding_tokens() ==
        PaddingAt(200));
  CHECK(Run(stub, Unset(appended_loaded.info.session_id(), 3)).done->padding_tokens() ==
        PaddingAt(200));

  // After a Generate: they continue without padding, as the session itself
  // does, and give its tokens.
  const GenerateResult first = Run(stub, Unset(id, 6));
  REQUIRE(first.done->padding_tokens() == PaddingAt(200));
  REQUIRE(SaveSession(stub, id, "generated").ok());
  const InfoResult fork = ForkSession(stub, id);
  REQUIRE(fork.status.ok());
  const InfoResult loaded = LoadSession(stub, "generated");
  REQUIRE(loaded.status.ok());
  const int64_t held = 200 + first.done->tokens_appended();
  REQUIRE(PaddingAt(held) > 0);
  const GenerateResult own = Run(stub, Unset(id, 6));
  CHECK(own.done->padding_tokens() == 0);
  for (const std::string& copy : {fork.info.session_id(), loaded.info.session_id()}) {
    INFO("copy " << copy);
    const GenerateResult r = Run(stub, Unset(copy, 6));
    CHECK(r.done->padding_tokens() == 0);
    CHECK(r.tokens == own.tokens);
  }
}

TEST_CASE("a restart keeps whether the next unset Generate pads, and what it generates",
          "[server][generate][padding][state_store]") {
  drt::testing::TempDir dir;
  const StateStoreOptions store = DurableService::StoreOptions(dir.path(), StateSync::kStep);
  std::string generated, appended;
  int64_t generated_tokens = 0, appended_tokens = 0;
  GenerateResult without_restart;
  {
    DurableService durable(store, SmallOptions(), PaddingFixture());
    auto& stub = durable.server.stub();
    generated = NewSession(stub);
    REQUIRE(AppendOnce(stub, generated, RandomTokens(300, 48)).ok());
    const GenerateResult first = Run(stub, Unset(generated, 10));
    REQUIRE(first.done->padding_tokens() == PaddingAt(300));
    generated_tokens = first.done->session_tokens();
    REQUIRE(PaddingAt(generated_tokens) > 0);
    // What the continuation gives without a restart: on a fork.
    const InfoResult fork = ForkSession(stub, generated);
    REQUIRE(fork.status.ok());
    without_restart = Run(stub, Unset(fork.info.session_id(), 8));
    REQUIRE(without_restart.done->padding_tokens() == 0);
    REQUIRE(DeleteSession(stub, fork.info.session_id()).ok());

    appended = NewSession(stub);
    REQUIRE(AppendOnce(stub, appended, RandomTokens(100, 49)).ok());
    REQUIRE(Run(stub, Unset(appended, 4)).done->padding_tokens() == PaddingAt(100));
    REQUIRE(AppendOnce(stub, appended, RandomTokens(8, 50)).ok());
    appended_tokens = GetSession(stub, appended).info.tokens();
    REQUIRE(PaddingAt(appended_tokens) > 0);
  }
  // A session that generated since its last Append needs record version 4,
  // which a server of before cannot read: FORMAT says so.
  CHECK(ReadWholeFile(dir.path() + "/FORMAT").value_or("") == "drt-state-dir 4\n");
  // A server of before (FORMAT up to 3) refuses the directory by name
  // rather than quarantine the version-4 records.
  StateStoreOptions older = store;
  older.newest_dir_format_for_test = 3;
  auto refused = StateStore::Open(older, PaddingFixture().model->config());
  REQUIRE_FALSE(refused.ok());
  CHECK(std::string(refused.status().message()).find("says format version 4; this server reads "
                                                     "versions 2 to 3") != std::string::npos);
  DurableService restarted(store, SmallOptions(), PaddingFixture());
  auto& stub = restarted.server.stub();
  REQUIRE(GetSession(stub, generated).info.tokens() == generated_tokens);
  const GenerateResult after = Run(stub, Unset(generated, 8));
  CHECK(after.done->padding_tokens() == 0);
  CHECK(after.tokens == without_restart.tokens);
  const GenerateResult answer = Run(stub, Unset(appended, 4));
  CHECK(answer.done->padding_tokens() == PaddingAt(appended_tokens));
}

TEST_CASE("session records keep appended_since_generate, in version 4 only when it is false",
          "[server][state_store][padding]") {
  SessionRecord record;
  record.id = "s-1";
  record.settings.max_context_tokens = 1000;
  record.settings.idle_ttl_seconds = 60;
  record.segments = {ChunkSegment{"s-1", 0}};
  record.state = "engine state bytes";
  for (const bool appended : {true, false}) {
    INFO("appended_since_generate " << appended);
    record.settings.appended_since_generate = appended;
    const std::string bytes = EncodeSessionRecord(record);
    uint32_t version = 0;
    std::memcpy(&version, bytes.data() + 8, sizeof version);
    // True is what records of before read back as: such a record is written
    // as before (version 2 here, no version-3 field set).
    CHECK(version == (appended ? 2u : 4u));
    auto decoded = DecodeSessionRecord(bytes, "x.state");
    REQUIRE(decoded.ok());
    CHECK(decoded->settings.appended_since_generate == appended);
    CHECK(decoded->settings.max_context_tokens == 1000);
    CHECK(decoded->state == record.state);
  }
  // A version-4 record's flag byte other than 0 or 1 is damage.
  record.settings.appended_since_generate = false;
  std::string bytes = EncodeSessionRecord(record);
  // The flag byte follows id (i64 + 3 bytes), sampling (4+4+4+8 then 4+4+4+8)
  // and the two i64 limits.
  const size_t flag = kSessionRecordHeaderBytes + 8 + 3 + 20 + 20 + 16;
  REQUIRE(bytes[flag] == 0);
  bytes[flag] = 2;
  // (The CRC no longer matches either: recompute it so that the flag is
  // what is refused.)
  const uint32_t crc = Crc32c(bytes.data() + kSessionRecordHeaderBytes,
                              bytes.size() - kSessionRecordHeaderBytes);
  std::memcpy(bytes.data() + 12, &crc, sizeof crc);
  auto refused = DecodeSessionRecord(bytes, "x.state");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kDataLoss);
  CHECK(refused.status().message().find("appended_since_generate is 2") != std::string::npos);
}

}  // namespace
}  // namespace drt::server
