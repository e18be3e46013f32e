// A session's min_p, presence/frequency penalties and logit_bias as
// CreateSession defaults (docs/api.md, "CreateSession"): a Generate that
// leaves sampling unset draws what a Generate sending them draws on another
// session with the same prompt (the request's sampling, not the session's:
// another path to the same sampler), ForkSession copies them, a restart
// with --state_dir and SaveSession/LoadSession keep them (session record
// version 3, docs/state_format.md), a version-2 record (today's encoder,
// kept below) reads with them off, and bad values are refused by name with
// no session created.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/byte_codec.h"
#include "engine/crc32c.h"
#include "engine/sampler.h"
#include "server/state_files.h"
#include "tests/server/test_util/check_status.h"
#include "tests/server/test_util/directory_snapshot.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

constexpr int32_t kTokens = 20;

struct Defaults {
  float temperature = 0.f;
  uint64_t seed = 0;
  float min_p = 0.f;
  float presence = 0.f;
  float frequency = 0.f;
  std::map<int32_t, float> bias;
};

void Fill(const Defaults& d, drt::v1::SamplingParams& s) {
  s.set_temperature(d.temperature);
  s.set_seed(d.seed);
  s.set_min_p(d.min_p);
  s.set_presence_penalty(d.presence);
  s.set_frequency_penalty(d.frequency);
  s.mutable_logit_bias()->insert(d.bias.begin(), d.bias.end());
}

drt::v1::CreateSessionRequest CreateWith(const Defaults& d) {
  drt::v1::CreateSessionRequest create;
  Fill(d, *create.mutable_sampling());
  return create;
}

drt::v1::GenerateRequest Request(const std::string& id) {
  drt::v1::GenerateRequest request = GreedyRequest(id, kTokens);
  request.set_ignore_eos(true);
  request.set_pad_to_chunk_boundary(false);
  request.set_return_logprobs(true);
  return request;
}

// A Generate that leaves sampling unset: the session's defaults apply.
GenerateResult WithDefaults(drt::v1::Drt::Stub& stub, const std::string& id) {
  return Generate(stub, Request(id));
}

// The same Generate sending `d` as its sampling.
GenerateResult Sending(drt::v1::Drt::Stub& stub, const std::string& id, const Defaults& d) {
  drt::v1::GenerateRequest request = Request(id);
  Fill(d, *request.mutable_sampling());
  return Generate(stub, request);
}

// What a plain session holding `prompt` generates when the request sends `d`.
GenerateResult SentOnPlainSession(drt::v1::Drt::Stub& stub, const std::vector<int32_t>& prompt,
                                  const Defaults& d) {
  const std::string id = NewSession(stub);
  REQUIRE(AppendOnce(stub, id, prompt).ok());
  GenerateResult r = Sending(stub, id, d);
  REQUIRE(r.status.ok());
  REQUIRE(DeleteSession(stub, id).ok());
  return r;
}

// Each field alone (with sampling where min_p needs it), then all at once.
// The values are ones that change this prompt's text on the fixture model
// (checked below against the same call without the field).
std::vector<std::pair<std::string, Defaults>> Cases() {
  return {
      {"min_p", {4.f, 5, 0.5f, 0.f, 0.f, {}}},
      {"presence_penalty", {0.f, 0, 0.f, 2.f, 0.f, {}}},
      {"frequency_penalty", {0.f, 0, 0.f, 0.f, 1.5f, {}}},
      {"logit_bias", {0.f, 0, 0.f, 0.f, 0.f, {{70, 100.f}, {12, -3.f}}}},
      {"all", {0.9f, 17, 0.05f, 0.5f, 0.7f, {{65, 3.f}, {66, -100.f}}}},
  };
}

// The same defaults without min_p, the penalties and logit_bias.
Defaults Plain(const Defaults& d) { return {d.temperature, d.seed, 0.f, 0.f, 0.f, {}}; }

// Today's (version 2) session record encoder, kept as it was written before
// version 3 (server/state_files.cc at 5f68a1e): the record a server of
// before this change wrote.
std::string EncodeVersion2Record(const SessionRecord& record) {
  std::string body;
  ByteWriter w(body);
  w.Str(record.id);
  w.Put(record.settings.sampling.temperature);
  w.Put(record.settings.sampling.top_k);
  w.Put(record.settings.sampling.top_p);
  w.Put(record.settings.sampling.seed);
  w.I64(record.settings.max_context_tokens);
  w.I64(record.settings.idle_ttl_seconds);
  w.I64(static_cast<int64_t>(record.segments.size()));
  for (const ChunkSegment& s : record.segments) {
    w.Str(s.log);
    w.I64(s.chunks);
  }
  w.Str(record.state);
  std::string out;
  ByteWriter h(out);
  h.Raw("DRTSTATE", 8);
  h.Put<uint32_t>(2);
  h.Put<uint32_t>(Crc32c(body.data(), body.size()));
  h.Put<uint64_t>(body.size());
  out += body;
  return out;
}

uint32_t HeaderVersion(const std::string& bytes) {
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  return version;
}

}  // namespace

TEST_CASE("session defaults: min_p, penalties and logit_bias apply to a Generate without sampling",
          "[server][sampling][session_defaults]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::vector<int32_t> prompt = RandomTokens(100, 7);
  for (const auto& [name, d] : Cases()) {
    INFO(name);
    const CreateResult created = CreateSession(stub, CreateWith(d));
    REQUIRE(created.status.ok());
    REQUIRE(AppendOnce(stub, created.id, prompt).ok());
    // A fork made before the session generates holds the same defaults.
    const InfoResult fork = ForkSession(stub, created.id);
    REQUIRE(fork.status.ok());

    const GenerateResult want = SentOnPlainSession(stub, prompt, d);
    const GenerateResult got = WithDefaults(stub, created.id);
    REQUIRE(got.status.ok());
    CHECK(got.tokens == want.tokens);
    CHECK(got.logprobs == want.logprobs);
    const GenerateResult forked = WithDefaults(stub, fork.info.session_id());
    REQUIRE(forked.status.ok());
    CHECK(forked.tokens == want.tokens);
    // The field matters here: without it the text differs.
    CHECK(SentOnPlainSession(stub, prompt, Plain(d)).tokens != want.tokens);
  }

  // A Generate that sets sampling replaces the defaults whole: greedy with
  // nothing else, not the session's +100 bias.
  const Defaults forced = {0.f, 0, 0.f, 0.f, 0.f, {{70, 100.f}}};
  const CreateResult created = CreateSession(stub, CreateWith(forced));
  REQUIRE(created.status.ok());
  REQUIRE(AppendOnce(stub, created.id, prompt).ok());
  const InfoResult fork = ForkSession(stub, created.id);
  REQUIRE(fork.status.ok());
  const GenerateResult biased = WithDefaults(stub, created.id);
  REQUIRE(biased.status.ok());
  CHECK(biased.tokens == std::vector<int32_t>(kTokens, 70));
  const GenerateResult replaced = Sending(stub, fork.info.session_id(), Defaults{});
  REQUIRE(replaced.status.ok());
  CHECK(replaced.tokens == SentOnPlainSession(stub, prompt, Defaults{}).tokens);
  CHECK(replaced.tokens != biased.tokens);
}

TEST_CASE("session defaults: bad min_p, penalties and logit_bias in CreateSession are refused by "
          "name, creating nothing",
          "[server][sampling][session_defaults][errors]") {
  InProcessServer server;
  auto& stub = server.stub();
  std::map<int32_t, float> many;
  for (int32_t t = 0; t <= kMaxLogitBiasEntries; ++t) many[t] = 1.f;
  const std::vector<std::pair<Defaults, std::string>> bad = {
      {{1.f, 0, 1.5f, 0.f, 0.f, {}}, "min_p must be in [0, 1]"},
      {{1.f, 0, -0.1f, 0.f, 0.f, {}}, "min_p must be in [0, 1]"},
      {{1.f, 0, 0.f, 2.5f, 0.f, {}}, "presence_penalty must be in [-2, 2], got 2.5"},
      {{1.f, 0, 0.f, 0.f, -3.f, {}}, "frequency_penalty must be in [-2, 2], got -3"},
      {{1.f, 0, 0.f, 0.f, 0.f, {{5, 101.f}}}, "logit_bias for token 5 must be in [-100, 100]"},
      {{0.f, 0, 0.f, 0.f, 0.f, {{300, 1.f}}},
       "logit_bias names token 300, outside the vocabulary [0, 300)"},
      {{0.f, 0, 0.f, 0.f, 0.f, {{-1, 1.f}}}, "logit_bias names token -1"},
      {{0.f, 0, 0.f, 0.f, 0.f, {{299, 1.f}}},
       "logit_bias names token 299, the landmark (chunk) id"},
      {{0.f, 0, 0.f, 0.f, 0.f, {{298, -1.f}}}, "logit_bias names token 298, the pad id"},
      {{0.f, 0, 0.f, 0.f, 0.f, many}, "logit_bias has 301 entries; at most 300"},
  };
  for (const auto& [d, words] : bad) {
    INFO(words);
    CHECK_STATUS(CreateSession(stub, CreateWith(d)).status, grpc::StatusCode::INVALID_ARGUMENT,
                 words);
  }
  CHECK(server.service().session_manager().List(/*hidden_too=*/true).empty());
  // Every id this model allows (298: the fixture's vocabulary of 300 less
  // the landmark and pad ids; fewer than the 300 entries allowed) is fine.
  std::map<int32_t, float> allowed;
  for (int32_t t = 0; t < 298; ++t) allowed[t] = 1.f;
  CHECK(CreateSession(stub, CreateWith({0.f, 0, 0.f, 0.f, 0.f, allowed})).status.ok());
  CHECK(server.service().session_manager().List().size() == 1);
}

TEST_CASE("session defaults: a restart with --state_dir restores min_p, penalties and logit_bias",
          "[server][sampling][session_defaults][durable]") {
  drt::testing::TempDir dir;
  const std::vector<int32_t> prompt = RandomTokens(150, 3);
  const Defaults d = Cases().back().second;
  std::string id, plain_id;
  GenerateResult want;
  {
    DurableService durable(dir.path(), SmallOptions());
    auto& stub = durable.server.stub();
    const CreateResult created = CreateSession(stub, CreateWith(d));
    REQUIRE(created.status.ok());
    id = created.id;
    REQUIRE(AppendOnce(stub, id, prompt).ok());
    plain_id = NewSession(stub);
    REQUIRE(AppendOnce(stub, plain_id, prompt).ok());
    // A session with the later defaults is a version-3 record; one without
    // them stays version 2, what a server of before reads.
    CHECK(HeaderVersion(*ReadWholeFile(dir.File("sessions/" + id + ".state"))) == 3);
    CHECK(HeaderVersion(*ReadWholeFile(dir.File("sessions/" + plain_id + ".state"))) == 2);
    want = SentOnPlainSession(stub, prompt, d);
    REQUIRE(want.tokens != SentOnPlainSession(stub, prompt, Plain(d)).tokens);
  }
  DurableService restarted(dir.path(), SmallOptions());
  auto& stub = restarted.server.stub();
  const GenerateResult got = WithDefaults(stub, id);
  REQUIRE(got.status.ok());
  CHECK(got.tokens == want.tokens);
  CHECK(got.logprobs == want.logprobs);
  // The plain session's defaults stay off.
  const GenerateResult plain = WithDefaults(stub, plain_id);
  REQUIRE(plain.status.ok());
  CHECK(plain.tokens == SentOnPlainSession(stub, prompt, Defaults{}).tokens);
}

TEST_CASE("session defaults: SaveSession and LoadSession keep min_p, penalties and logit_bias",
          "[server][sampling][session_defaults][session_file]") {
  drt::testing::TempDir files;
  ServiceOptions options = SmallOptions();
  options.session_files_dir = files.path();
  InProcessServer server(options);
  auto& stub = server.stub();
  const std::vector<int32_t> prompt = RandomTokens(120, 5);
  const Defaults d = Cases().back().second;
  const CreateResult created = CreateSession(stub, CreateWith(d));
  REQUIRE(created.status.ok());
  REQUIRE(AppendOnce(stub, created.id, prompt).ok());
  REQUIRE(SaveSession(stub, created.id, "with-defaults").ok());
  CHECK(HeaderVersion(*ReadWholeFile(files.File("with-defaults"))) == 3);
  REQUIRE(DeleteSession(stub, created.id).ok());
  const InfoResult loaded = LoadSession(stub, "with-defaults");
  REQUIRE(loaded.status.ok());
  const GenerateResult want = SentOnPlainSession(stub, prompt, d);
  REQUIRE(want.tokens != SentOnPlainSession(stub, prompt, Plain(d)).tokens);
  const GenerateResult got = WithDefaults(stub, loaded.info.session_id());
  REQUIRE(got.status.ok());
  CHECK(got.tokens == want.tokens);
  CHECK(got.logprobs == want.logprobs);
}

TEST_CASE("session records: version 3 holds the later defaults, version 2 reads with them off",
          "[server][session_defaults][durable]") {
  SessionRecord record;
  record.id = "s1";
  record.settings.sampling.temperature = 0.7f;
  record.settings.sampling.top_k = 40;
  record.settings.sampling.top_p = 0.9f;
  record.settings.sampling.seed = 123456789012345ULL;
  record.settings.max_context_tokens = 5000;
  record.settings.idle_ttl_seconds = 60;
  record.segments = {{"s1", 3}, {"s0", 0}};
  record.state = "engine state bytes";

  // Off: written as version 2, byte for byte what the old encoder wrote.
  const std::string old_bytes = EncodeVersion2Record(record);
  CHECK(EncodeSessionRecord(record) == old_bytes);
  auto old_read = DecodeSessionRecord(old_bytes, "old.state");
  REQUIRE(old_read.ok());
  const SamplingParams& o = old_read->settings.sampling;
  CHECK(o.temperature == 0.7f);
  CHECK(o.top_k == 40);
  CHECK(o.top_p == 0.9f);
  CHECK(o.seed == 123456789012345ULL);
  CHECK(o.min_p == 0.f);
  CHECK(o.presence_penalty == 0.f);
  CHECK(o.frequency_penalty == 0.f);
  CHECK(o.logit_bias.empty());
  CHECK(old_read->settings.max_context_tokens == 5000);
  CHECK(old_read->settings.idle_ttl_seconds == 60);
  REQUIRE(old_read->segments.size() == 2);
  CHECK(old_read->segments[1].log == "s0");
  CHECK(old_read->state == "engine state bytes");

  // Each later field alone makes a version-3 record that reads back whole.
  for (int field = 0; field < 4; ++field) {
    INFO("field " << field);
    SessionRecord r = record;
    SamplingParams& p = r.settings.sampling;
    if (field == 0) p.min_p = 0.25f;
    if (field == 1) p.presence_penalty = -1.5f;
    if (field == 2) p.frequency_penalty = 2.f;
    if (field == 3) p.logit_bias = {{7, -100.f}, {2, 0.5f}, {250, 100.f}};
    const std::string bytes = EncodeSessionRecord(r);
    CHECK(HeaderVersion(bytes) == 3);
    auto back = DecodeSessionRecord(bytes, "new.state");
    REQUIRE(back.ok());
    const SamplingParams& b = back->settings.sampling;
    CHECK(b.min_p == p.min_p);
    CHECK(b.presence_penalty == p.presence_penalty);
    CHECK(b.frequency_penalty == p.frequency_penalty);
    CHECK(b.logit_bias == p.logit_bias);
    CHECK(b.temperature == 0.7f);
    CHECK(b.seed == 123456789012345ULL);
    CHECK(back->settings.max_context_tokens == 5000);
    CHECK(back->state == "engine state bytes");
  }

  // The logit_bias pairs follow the four floats' i64 count in ascending id
  // order: (2, 0.5) first. Swapping two pairs (and fixing the CRC) is
  // refused as damage, by path.
  SessionRecord r = record;
  r.settings.sampling.logit_bias = {{2, 0.5f}, {7, -100.f}};
  std::string bytes = EncodeSessionRecord(r);
  // body: id (8 + 2), 4 + 4 + 4 + 8 sampling, 3 floats, the i64 count.
  const size_t pairs = kSessionRecordHeaderBytes + 10 + 20 + 12 + 8;
  int32_t first_id = 0;
  std::memcpy(&first_id, bytes.data() + pairs, 4);
  REQUIRE(first_id == 2);
  std::string swapped = bytes;
  std::memcpy(swapped.data() + pairs, bytes.data() + pairs + 8, 8);
  std::memcpy(swapped.data() + pairs + 8, bytes.data() + pairs, 8);
  const uint32_t crc = Crc32c(swapped.data() + kSessionRecordHeaderBytes,
                              swapped.size() - kSessionRecordHeaderBytes);
  std::memcpy(swapped.data() + 12, &crc, 4);
  auto refused = DecodeSessionRecord(swapped, "swapped.state");
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(refused.status().message()),
             Contains("swapped.state") && Contains("ascending"));

  // A value CreateSession refuses is damage too.
  SessionRecord out_of_range = record;
  out_of_range.settings.sampling.min_p = 3.f;
  auto bad = DecodeSessionRecord(EncodeSessionRecord(out_of_range), "bad.state");
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(bad.status().message()), Contains("bad.state") && Contains("min_p"));

  // A newer version is refused by name, as before (4 is read since
  // 2026-11-25: appended_since_generate, generate_continuation_test.cc).
  std::string newer = EncodeSessionRecord(r);
  const uint32_t five = 5;
  std::memcpy(newer.data() + 8, &five, 4);
  auto newer_read = DecodeSessionRecord(newer, "newer.state");
  REQUIRE(!newer_read.ok());
  CHECK(newer_read.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(newer_read.status().message()),
             Contains("newer.state has format version 5; this server reads versions 2 to 4"));
}

TEST_CASE("session defaults: a state file of version 2 restores with the later defaults off",
          "[server][sampling][session_defaults][durable]") {
  drt::testing::TempDir dir;
  const std::vector<int32_t> prompt = RandomTokens(150, 9);
  const Defaults d = Cases().back().second;
  std::string id;
  {
    DurableService durable(dir.path(), SmallOptions());
    auto& stub = durable.server.stub();
    const CreateResult created = CreateSession(stub, CreateWith(d));
    REQUIRE(created.status.ok());
    id = created.id;
    REQUIRE(AppendOnce(stub, id, prompt).ok());
  }
  // Rewritten as a server of before this change would have written it:
  // its encoder has no place for min_p, the penalties and logit_bias.
  const std::string path = dir.File("sessions/" + id + ".state");
  auto record = DecodeSessionRecord(*ReadWholeFile(path), path);
  REQUIRE(record.ok());
  REQUIRE(WriteFileAtomically(path, EncodeVersion2Record(*record)).ok());
  REQUIRE(HeaderVersion(*ReadWholeFile(path)) == 2);

  DurableService restarted(dir.path(), SmallOptions());
  auto& stub = restarted.server.stub();
  const GenerateResult got = WithDefaults(stub, id);
  REQUIRE(got.status.ok());
  // temperature and seed kept, the rest off.
  CHECK(got.tokens == SentOnPlainSession(stub, prompt, Plain(d)).tokens);
  CHECK(got.tokens != SentOnPlainSession(stub, prompt, d).tokens);
}


// Review sessdefaults F1: a server of before (record version 2 only) that
// ran on a directory holding a version-3 fork quarantined the fork's state
// file and deleted the logs of its deleted parent, which only the fork
// named. FORMAT now says 3 from the first version-3 record on, so such a
// server refuses the whole directory by name and changes nothing.
TEST_CASE("session defaults: FORMAT says 3 once a version-3 record is written, never less, and an "
          "older server refuses that directory changing nothing",
          "[server][session_defaults][durable][state_store]") {
  drt::testing::TempDir dir;
  const int64_t chunk = FixtureModel::Get().chunk_size();
  const auto format = [&] { return *ReadWholeFile(dir.File("FORMAT")); };
  SessionSettings with_min_p;
  with_min_p.sampling.min_p = 0.05f;
  std::string plain, defaults;
  std::map<std::string, int64_t> tokens;
  {
    DurableServer server(dir.path());
    plain = server.Create();
    server.Append(plain, RandomTokens(3 * chunk + 1, 31));
    // Sessions without the later defaults leave a directory of version 2.
    CHECK(HeaderVersion(*ReadWholeFile(server.store->StatePath(plain))) == 2);
    CHECK(format() == "drt-state-dir 2\n");
    auto created = server.sessions->Create(with_min_p);
    REQUIRE(created.ok());
    defaults = (*created)->id();
    REQUIRE(HeaderVersion(*ReadWholeFile(server.store->StatePath(defaults))) == 3);
    CHECK(format() == "drt-state-dir 3\n");
    server.Append(defaults, RandomTokens(2 * chunk + 3, 32));
    tokens = server.Tokens();
  }

  // An older server: its Open is this one's with FORMAT read up to version 2.
  const auto files = [&] { return testing::DirectorySnapshot(dir.path()); };
  const std::map<std::string, std::string> before = files();
  StateStoreOptions older = DurableOptions(dir.path());
  older.newest_dir_format_for_test = 2;
  auto refused = StateStore::Open(older, FixtureModel::Get().model->config());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.status().message()),
             Contains(dir.File("FORMAT") + " says format version 3; this server reads version 2"));
  CHECK(files() == before);

  // This server restores a FORMAT-3 directory, defaults and all.
  {
    DurableServer server(dir.path());
    CHECK(server.report.quarantined.empty());
    CHECK(server.Tokens() == tokens);
    auto entry = server.sessions->Find(defaults);
    REQUIRE(entry.ok());
    CHECK((*entry)->settings().sampling.min_p == 0.05f);
    // Deleting the only version-3 session does not lower FORMAT.
    REQUIRE(server.sessions->Delete(defaults).ok());
    CHECK(format() == "drt-state-dir 3\n");
  }
  DurableServer server(dir.path());
  CHECK(server.Tokens() == std::map<std::string, int64_t>{{plain, tokens.at(plain)}});
  CHECK(format() == "drt-state-dir 3\n");
  // A newer FORMAT than this server's (4 since 2026-11-25) is refused by
  // name, as before.
  server.sessions.reset();
  server.store.reset();
  std::ofstream(dir.File("FORMAT")) << "drt-state-dir 5\n";
  auto newer = StateStore::Open(DurableOptions(dir.path()), FixtureModel::Get().model->config());
  REQUIRE_FALSE(newer.ok());
  CHECK_THAT(std::string(newer.status().message()),
             Contains(dir.File("FORMAT") + " says format version 5; this server reads versions "
                                           "2 to 4"));
}

// Review sessdefaults F2: a record's logit_bias ids were checked against
// the model only after the session was made (LoadSession: INVALID_ARGUMENT
// without the path) or never (a restart: every Generate without sampling
// then failed, blaming the request).
TEST_CASE("session defaults: a record whose logit_bias names the landmark id is refused as damage "
          "by path, at a restart and by LoadSession",
          "[server][sampling][session_defaults][durable][session_file]") {
  const std::vector<int32_t> prompt = RandomTokens(150, 13);
  const int32_t landmark = static_cast<int32_t>(FixtureModel::Get().model->config().chunk_id);
  const Defaults d = {0.f, 0, 0.f, 0.f, 0.f, {{5, 1.f}}};
  // `bytes` with its leading session record's logit_bias made {landmark: 1}
  // (re-encoded: the CRC is valid), the rest (a SaveSession file's chunk
  // records) as it was.
  const auto with_landmark_bias = [&](const std::string& bytes, const std::string& path) {
    const size_t record_bytes =
        kSessionRecordHeaderBytes + SessionRecordBodyBytes(bytes.substr(0, kSessionRecordHeaderBytes));
    auto record = DecodeSessionRecord(bytes.substr(0, record_bytes), path);
    REQUIRE(record.ok());
    REQUIRE(record->settings.sampling.logit_bias == std::map<int32_t, float>{{5, 1.f}});
    record->settings.sampling.logit_bias = {{landmark, 1.f}};
    REQUIRE(WriteFileAtomically(path, EncodeSessionRecord(*record) + bytes.substr(record_bytes)).ok());
  };

  SECTION("a state file at a restart is quarantined alone") {
    drt::testing::TempDir dir;
    std::string bad, good;
    {
      DurableService durable(dir.path(), SmallOptions());
      auto& stub = durable.server.stub();
      const CreateResult created = CreateSession(stub, CreateWith(d));
      REQUIRE(created.status.ok());
      bad = created.id;
      REQUIRE(AppendOnce(stub, bad, prompt).ok());
      good = NewSession(stub);
      REQUIRE(AppendOnce(stub, good, prompt).ok());
    }
    const std::string path = dir.File("sessions/" + bad + ".state");
    with_landmark_bias(*ReadWholeFile(path), path);
    DurableServer server(dir.path());
    REQUIRE(server.report.quarantined.size() == 1);
    const std::string& line = server.report.quarantined[0];
    INFO(line);
    CHECK_THAT(line, Contains(path + " is corrupt: logit_bias names token " +
                              std::to_string(landmark) + ", the landmark (chunk) id"));
    CHECK_THAT(line, Contains(dir.path() + "/quarantine/"));
    CHECK(server.Tokens() ==
          std::map<std::string, int64_t>{{good, static_cast<int64_t>(prompt.size())}});
    CHECK_FALSE(std::filesystem::exists(path));
  }
  SECTION("a SaveSession file is DATA_LOSS naming the path, creating nothing") {
    drt::testing::TempDir files;
    ServiceOptions options = SmallOptions();
    options.session_files_dir = files.path();
    InProcessServer server(options);
    auto& stub = server.stub();
    const CreateResult created = CreateSession(stub, CreateWith(d));
    REQUIRE(created.status.ok());
    REQUIRE(AppendOnce(stub, created.id, prompt).ok());
    REQUIRE(SaveSession(stub, created.id, "landmark-bias").ok());
    REQUIRE(DeleteSession(stub, created.id).ok());
    const std::string path = files.File("landmark-bias");
    with_landmark_bias(*ReadWholeFile(path), path);
    CHECK_STATUS(LoadSession(stub, "landmark-bias").status, grpc::StatusCode::DATA_LOSS,
                 path + " is corrupt: logit_bias names token " + std::to_string(landmark) +
                     ", the landmark (chunk) id");
    CHECK(server.service().session_manager().List(/*hidden_too=*/true).empty());
  }
}

}  // namespace drt::server
