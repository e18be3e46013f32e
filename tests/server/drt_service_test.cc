// The drt.v1.Drt service in-process, over a real loopback channel, on the
// two_groups fixture model: results equal the engine's own whatever the
// piece sizes, text and token ids agree, progress, concurrency, fork,
// cancellation, Complete, info calls, health and reflection.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/tokenizer/tokenizer.h"

#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

// What the server streams as text for `tokens`: their bytes through a
// Utf8Streamer (never half a character; invalid sequences as U+FFFD).
std::string ExpectedText(const std::vector<int32_t>& tokens) {
  Utf8Streamer streamer;
  std::string text;
  for (int32_t t : tokens) {
    if (t >= 0 && t < 256) text += streamer.Push(std::string(1, static_cast<char>(t)));
  }
  return text + streamer.Flush();
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<int32_t> Prefix(const std::vector<int32_t>& v, size_t n) {
  return std::vector<int32_t>(v.begin(), v.begin() + n);
}

TEST_CASE("Append in many pieces then Generate equals the engine's greedy output", "[server]") {
  InProcessServer server;
  // 40 tokens: no closed chunk; 5000: 79 chunks and more than one server step.
  const size_t n = GENERATE(as<size_t>{}, 40, 5000);
  const auto prompt = RandomTokens(n, 100 + n);
  const std::string id = NewSession(server.stub());

  const auto pieces = RandomPieces(n, n / 8 + 1, 7 + n);
  REQUIRE(pieces.size() >= 8);
  AppendResult appended = AppendTokens(server.stub(), id, prompt, pieces);
  INFO("Append: " << appended.status.error_message());
  REQUIRE(appended.status.ok());
  REQUIRE(appended.summary.has_value());
  CHECK(appended.summary->tokens_ingested() == static_cast<int64_t>(n));
  CHECK(appended.summary->session_tokens() == static_cast<int64_t>(n));
  CHECK(appended.summary->session_chunks() ==
        static_cast<int64_t>(n) / FixtureModel::Get().chunk_size());

  const std::vector<int32_t> expected = EngineGreedy(prompt, 16);
  GenerateResult generated = GenerateGreedy(server.stub(), id, 16);
  INFO("Generate: " << generated.status.error_message());
  REQUIRE(generated.status.ok());
  CHECK(generated.tokens == expected);
  CHECK(generated.text == ExpectedText(expected));
  REQUIRE(generated.done.has_value());
  CHECK(generated.done->finish_reason() == drt::v1::FINISH_REASON_LENGTH);
  CHECK(generated.done->session_id() == id);
  CHECK(generated.done->timings().generated_tokens() == 16);
  CHECK(generated.done->timings().time_to_first_token_seconds() > 0);
  CHECK(generated.done->timings().time_per_output_token_seconds() > 0);

  // Generated tokens join the context: a second Generate continues the
  // engine's own sequence.
  InfoResult info = GetSession(server.stub(), id);
  REQUIRE(info.status.ok());
  CHECK(info.info.tokens() == static_cast<int64_t>(n) + 16);
  CHECK_FALSE(info.info.busy());
  GenerateResult more = GenerateGreedy(server.stub(), id, 8);
  REQUIRE(more.status.ok());
  const std::vector<int32_t> expected24 = EngineGreedy(prompt, 24);
  CHECK(more.tokens == std::vector<int32_t>(expected24.begin() + 16, expected24.end()));
}

TEST_CASE("Generate streams ids the byte tokenizer has no text for", "[server]") {
  // The fixture's vocabulary (300) is larger than the byte tokenizer's (256):
  // the model may pick ids 256..297, which must be streamed (with empty text),
  // not end the call with an error.
  std::vector<int32_t> prompt, expected;
  for (uint64_t seed = 0; seed < 200 && expected.empty(); ++seed) {
    prompt = RandomTokens(50 + seed * 7, seed);
    auto greedy = EngineGreedy(prompt, 16);
    for (int32_t t : greedy) {
      if (t >= 256) expected = greedy;
    }
  }
  REQUIRE_FALSE(expected.empty());

  InProcessServer server;
  const std::string id = NewSession(server.stub());
  REQUIRE(AppendTokens(server.stub(), id, prompt, EvenPieces(prompt.size(), 30)).status.ok());
  drt::v1::GenerateRequest request = GreedyRequest(id, 16);
  request.set_return_logprobs(true);
  GenerateResult generated = Generate(server.stub(), request);
  INFO("Generate: " << generated.status.error_message());
  REQUIRE(generated.status.ok());
  CHECK(generated.tokens == expected);
  CHECK(generated.text == ExpectedText(expected));
  REQUIRE(generated.logprobs.size() == expected.size());
  for (float lp : generated.logprobs) CHECK(lp <= 0.f);
  CHECK(GetSession(server.stub(), id).info.tokens() == static_cast<int64_t>(prompt.size()) + 16);
}

// About 3000 bytes of ASCII and 2-, 3- and 4-byte UTF-8 characters.
std::string MultilingualText() {
  std::string text;
  const char* parts[] = {"The caf\u00e9 on the fa\u00e7ade ",
                         "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 ",
                         "\xf0\x9f\x8e\x89 emoji \xf0\x9f\x98\x80\n",
                         "\u00fcber na\u00efve \u2014 r\u00e9sum\u00e9 "};
  for (int i = 0; text.size() < 3000; ++i) text += parts[i % 4];
  return text;
}

bool IsContinuationByte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Byte offsets where `text` is cut into pieces of pseudo-random sizes, moved
// forward to the next character boundary.
std::vector<size_t> CutPoints(const std::string& text, uint64_t seed) {
  std::vector<size_t> cuts = {0};
  std::mt19937_64 rng(seed);
  while (cuts.back() < text.size()) {
    size_t next = std::min(text.size(), cuts.back() + 1 + rng() % 97);
    while (next < text.size() && IsContinuationByte(text[next])) ++next;
    cuts.push_back(next);
  }
  return cuts;
}

// Appends `text` cut at `cuts` to a new session, message i as text when
// i % text_every == 0 and as token ids (its bytes) otherwise.
std::string AppendCutText(drt::v1::Drt::Stub& stub, const std::string& text,
                          const std::vector<size_t>& cuts, size_t text_every) {
  const std::string id = NewSession(stub);
  grpc::ClientContext context;
  SetDeadline(context, 60);
  auto stream = stub.Append(&context);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    drt::v1::AppendRequest request;
    if (i == 0) request.set_session_id(id);
    const std::string piece = text.substr(cuts[i], cuts[i + 1] - cuts[i]);
    if (i % text_every == 0) {
      request.set_text(piece);
    } else {
      for (unsigned char b : piece) request.mutable_tokens()->add_ids(b);
    }
    if (!stream->Write(request)) break;
  }
  stream->WritesDone();
  drt::v1::AppendResponse response;
  int64_t ingested = -1;
  while (stream->Read(&response)) {
    if (response.has_summary()) ingested = response.summary().tokens_ingested();
  }
  grpc::Status status = stream->Finish();
  INFO("Append: " << status.error_message());
  REQUIRE(status.ok());
  CHECK(ingested == static_cast<int64_t>(text.size()));
  return id;
}

std::vector<int32_t> BytesAsIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char b : text) ids.push_back(b);
  return ids;
}

// Text pieces are whole UTF-8 characters (a proto3 string must be valid
// UTF-8) but may cut anywhere else, inside words too.
TEST_CASE("text and token-id input agree", "[server]") {
  InProcessServer server;
  const std::string text = MultilingualText();
  const std::vector<int32_t> ids = BytesAsIds(text);
  const std::vector<size_t> cuts = CutPoints(text, 5);
  size_t inside_words = 0;
  for (size_t cut : cuts) {
    REQUIRE_FALSE((cut < text.size() && IsContinuationByte(text[cut])));
    inside_words += cut > 0 && cut < text.size() && text[cut - 1] != ' ' && text[cut] != ' ';
  }
  REQUIRE(inside_words >= 10);

  const std::string by_ids = NewSession(server.stub());
  REQUIRE(AppendTokens(server.stub(), by_ids, ids, RandomPieces(ids.size(), 200, 3)).status.ok());
  const std::string by_text = AppendCutText(server.stub(), text, cuts, 1);
  const std::string mixed = AppendCutText(server.stub(), text, cuts, 2);

  for (const std::string& id : {by_ids, by_text, mixed}) {
    InfoResult info = GetSession(server.stub(), id);
    REQUIRE(info.status.ok());
    CHECK(info.info.tokens() == static_cast<int64_t>(ids.size()));
    CHECK(info.info.chunks() == static_cast<int64_t>(ids.size()) / 63);
  }
  const std::vector<int32_t> expected = EngineGreedy(ids, 16);
  for (const std::string& id : {by_ids, by_text, mixed}) {
    GenerateResult g = GenerateGreedy(server.stub(), id, 16);
    REQUIRE(g.status.ok());
    CHECK(g.tokens == expected);
    CHECK(g.text == ExpectedText(expected));
  }
}

TEST_CASE("text_bytes pieces may cut UTF-8 characters", "[server]") {
  InProcessServer server;
  const std::string text = MultilingualText();
  const std::vector<int32_t> ids = BytesAsIds(text);
  // Every 7 bytes, wherever that falls: many cuts inside characters.
  std::vector<std::string> pieces;
  size_t inside_characters = 0;
  for (size_t i = 0; i < text.size(); i += 7) {
    pieces.push_back(text.substr(i, 7));
    inside_characters += i > 0 && IsContinuationByte(text[i]);
  }
  REQUIRE(inside_characters >= 5);
  const std::string id = NewSession(server.stub());
  AppendResult appended = AppendTexts(server.stub(), id, pieces, /*as_bytes=*/true);
  REQUIRE(appended.status.ok());
  CHECK(GetSession(server.stub(), id).info.tokens() == static_cast<int64_t>(ids.size()));
  GenerateResult g = GenerateGreedy(server.stub(), id, 16);
  REQUIRE(g.status.ok());
  CHECK(g.tokens == EngineGreedy(ids, 16));
}

TEST_CASE("Append progress is monotone and ends at the total", "[server]") {
  InProcessServer server;
  const std::string id = NewSession(server.stub());
  // Enough tokens for several progress messages (one per 0.1 s at most).
  const auto first = RandomTokens(1000, 1);
  const auto tokens = RandomTokens(40000, 2);

  REQUIRE(AppendTokens(server.stub(), id, first, EvenPieces(first.size(), 100)).status.ok());
  AppendResult r = AppendTokens(server.stub(), id, tokens, EvenPieces(tokens.size(), 500));
  REQUIRE(r.status.ok());
  REQUIRE(r.progress.size() >= 3);
  for (size_t i = 1; i < r.progress.size(); ++i) {
    INFO("progress message " << i);
    CHECK(r.progress[i].tokens_ingested() >= r.progress[i - 1].tokens_ingested());
    CHECK(r.progress[i].chunks_ingested() >= r.progress[i - 1].chunks_ingested());
    CHECK(r.progress[i].session_tokens() >= r.progress[i - 1].session_tokens());
    CHECK(r.progress[i].elapsed_seconds() >= r.progress[i - 1].elapsed_seconds());
  }
  for (const auto& p : r.progress) {
    // tokens_ingested counts this Append; session_tokens the whole session.
    CHECK(p.session_tokens() == p.tokens_ingested() + 1000);
    CHECK(p.tokens_ingested() <= 40000);
  }
  CHECK(r.progress.front().tokens_ingested() < 40000);
  CHECK(r.progress.back().tokens_ingested() == 40000);
  CHECK(r.progress.back().session_tokens() == 41000);
  CHECK(r.progress.back().chunks_ingested() == 41000 / 63);
  REQUIRE(r.summary.has_value());
  CHECK(r.summary->tokens_ingested() == 40000);
  CHECK(r.summary->session_tokens() == 41000);
  CHECK(r.summary->session_chunks() == 41000 / 63);
  CHECK(r.summary->elapsed_seconds() >= r.progress.back().elapsed_seconds());
  CHECK(r.summary->tokens_per_second() > 0);

  // One large message also reports progress while it is ingested (between
  // engine steps), not only once it is done.
  const auto large = RandomTokens(30000, 3);
  AppendResult one = AppendTokens(server.stub(), id, large, {large.size()});
  REQUIRE(one.status.ok());
  REQUIRE(one.progress.size() >= 2);
  CHECK(one.progress.front().tokens_ingested() > 0);
  CHECK(one.progress.front().tokens_ingested() < 30000);
  for (size_t i = 1; i < one.progress.size(); ++i) {
    CHECK(one.progress[i].tokens_ingested() >= one.progress[i - 1].tokens_ingested());
  }
  CHECK(one.progress.back().tokens_ingested() == 30000);
  REQUIRE(one.summary.has_value());
  CHECK(one.summary->tokens_ingested() == 30000);
  CHECK(one.summary->session_tokens() == 71000);
}

TEST_CASE("10 concurrent sessions give exactly what each gives alone", "[server]") {
  InProcessServer server;
  constexpr int kSessions = 10;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kSessions; ++i) prompts.push_back(RandomTokens(200 + 173 * i, 1000 + i));

  auto run = [&](int i) {
    const std::string id = NewSession(server.stub());
    AppendResult a =
        AppendTokens(server.stub(), id, prompts[i], RandomPieces(prompts[i].size(), 150, i));
    if (!a.status.ok()) throw std::runtime_error("Append: " + a.status.error_message());
    GenerateResult g = GenerateGreedy(server.stub(), id, 16);
    if (!g.status.ok()) throw std::runtime_error("Generate: " + g.status.error_message());
    return g.tokens;
  };

  std::vector<std::vector<int32_t>> alone(kSessions), together(kSessions);
  for (int i = 0; i < kSessions; ++i) alone[i] = run(i);
  std::vector<std::string> errors(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      try {
        together[i] = run(i);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) {
    INFO("session " << i);
    CHECK(errors[i].empty());
    CHECK(together[i] == alone[i]);
    CHECK(alone[i] == EngineGreedy(prompts[i], 16));
  }
}

TEST_CASE("a fork continues exactly like its parent", "[server]") {
  InProcessServer server;
  const auto p = RandomTokens(700, 11);  // 11 closed chunks + 7 open tokens
  const auto q = RandomTokens(300, 12);
  const std::string parent = NewSession(server.stub());
  REQUIRE(AppendTokens(server.stub(), parent, p, RandomPieces(p.size(), 90, 1)).status.ok());

  InfoResult f1 = ForkSession(server.stub(), parent);
  InfoResult f2 = ForkSession(server.stub(), parent);
  REQUIRE(f1.status.ok());
  REQUIRE(f2.status.ok());
  CHECK(f1.info.session_id() != parent);
  CHECK(f1.info.session_id() != f2.info.session_id());
  CHECK(f1.info.tokens() == 700);
  CHECK(f1.info.chunks() == 11);
  CHECK(f1.info.shared_bytes() > 0);
  CHECK_FALSE(f1.info.busy());

  // From the same state, the fork and the parent generate the same.
  const auto expected_p = EngineGreedy(p, 16);
  GenerateResult g1 = GenerateGreedy(server.stub(), f1.info.session_id(), 16);
  REQUIRE(g1.status.ok());
  CHECK(g1.tokens == expected_p);
  CHECK(GetSession(server.stub(), parent).info.tokens() == 700);  // untouched by f1's tokens

  // The fork's appends do not reach the parent.
  REQUIRE(AppendTokens(server.stub(), f2.info.session_id(), q, RandomPieces(q.size(), 40, 2))
              .status.ok());
  CHECK(GetSession(server.stub(), f2.info.session_id()).info.tokens() == 1000);
  InfoResult parent_info = GetSession(server.stub(), parent);
  CHECK(parent_info.info.tokens() == 700);
  CHECK(parent_info.info.chunks() == 11);
  GenerateResult gp = GenerateGreedy(server.stub(), parent, 16);
  REQUIRE(gp.status.ok());
  CHECK(gp.tokens == g1.tokens);

  const auto expected_pq = EngineGreedy(Concat(p, q), 24);
  GenerateResult g2 = GenerateGreedy(server.stub(), f2.info.session_id(), 16);
  REQUIRE(g2.status.ok());
  CHECK(g2.tokens == Prefix(expected_pq, 16));

  // The fork keeps working once its parent is gone (shared chunks stay).
  REQUIRE(DeleteSession(server.stub(), parent).ok());
  GenerateResult g3 = GenerateGreedy(server.stub(), f2.info.session_id(), 8);
  REQUIRE(g3.status.ok());
  CHECK(g3.tokens == std::vector<int32_t>(expected_pq.begin() + 16, expected_pq.end()));
}

TEST_CASE("a cancelled Append leaves a consistent, usable session", "[server]") {
  InProcessServer server;
  const bool use_deadline = GENERATE(false, true);
  INFO((use_deadline ? "deadline" : "TryCancel"));
  constexpr size_t kTotal = 200'000;
  const auto tokens = RandomTokens(kTotal, 21);
  const std::string id = NewSession(server.stub());

  grpc::ClientContext context;
  if (use_deadline) {
    SetDeadline(context, 1.0);
  } else {
    SetDeadline(context, 120);
  }
  auto stream = server.stub().Append(&context);
  std::atomic<int64_t> seen{0};
  std::thread reader([&] {
    drt::v1::AppendResponse response;
    while (stream->Read(&response)) {
      if (response.has_progress()) seen = response.progress().tokens_ingested();
      if (!use_deadline && seen.load() > 0) context.TryCancel();
    }
  });
  size_t sent = 0;
  for (size_t piece : EvenPieces(kTotal, 5000)) {
    if (!stream->Write(TokensMessage(id, tokens.data() + sent, piece))) break;
    sent += piece;
  }
  stream->WritesDone();
  reader.join();
  grpc::Status status = stream->Finish();
  CHECK(status.error_code() ==
        (use_deadline ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::CANCELLED));

  // The server may still be finishing a step when the client has given up.
  drt::v1::SessionInfo info = WaitIdle(server.stub(), id);
  const int64_t kept = info.tokens();
  INFO("kept " << kept << " of " << kTotal << " (progress saw " << seen.load() << ")");
  if (!use_deadline) CHECK(kept > 0);  // cancelled after some progress
  CHECK(kept < static_cast<int64_t>(kTotal));
  CHECK(kept >= seen.load());
  CHECK(info.chunks() == kept / 63);
  // A read-back is stable: nothing is still being applied.
  CHECK(GetSession(server.stub(), id).info.tokens() == kept);

  // Consistent: the session equals a fresh one given the first `kept` tokens.
  const auto prefix = Prefix(tokens, kept);
  const auto more = RandomTokens(100, 22);
  const auto expected = EngineGreedy(Concat(prefix, more), 8);
  const std::string fresh = NewSession(server.stub());
  if (!prefix.empty()) {
    REQUIRE(AppendTokens(server.stub(), fresh, prefix, EvenPieces(prefix.size(), 65536)).status.ok());
  }

  // Usable: a following Append and Generate work and continue from there.
  REQUIRE(AppendTokens(server.stub(), id, more, EvenPieces(more.size(), 30)).status.ok());
  REQUIRE(AppendTokens(server.stub(), fresh, more, EvenPieces(more.size(), 30)).status.ok());
  GenerateResult g = GenerateGreedy(server.stub(), id, 8);
  GenerateResult gf = GenerateGreedy(server.stub(), fresh, 8);
  REQUIRE(g.status.ok());
  REQUIRE(gf.status.ok());
  CHECK(g.tokens == expected);
  CHECK(gf.tokens == expected);
}

TEST_CASE("a cancelled Generate stops between tokens and keeps the tokens streamed", "[server]") {
  InProcessServer server;
  const auto prompt = RandomTokens(300, 31);
  const std::string id = NewSession(server.stub());
  REQUIRE(AppendTokens(server.stub(), id, prompt, {prompt.size()}).status.ok());

  grpc::ClientContext context;
  SetDeadline(context, 60);
  drt::v1::GenerateRequest request = GreedyRequest(id, 1 << 20);
  request.set_ignore_eos(true);
  auto reader = server.stub().Generate(&context, request);
  drt::v1::GenerateResponse response;
  int received = 0;
  while (reader->Read(&response)) {
    received += response.piece().token_ids_size();
    if (received >= 20) context.TryCancel();
  }
  CHECK(reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
  drt::v1::SessionInfo info = WaitIdle(server.stub(), id);
  // Every token generated joined the context, streamed or not; generation
  // stopped soon after the cancel.
  CHECK(info.tokens() >= 300 + received);
  CHECK(info.tokens() < 300 + (1 << 20));
  const int64_t generated = info.tokens() - 300;
  // The session stays usable and consistent with the engine's greedy run.
  const auto expected = EngineGreedy(prompt, static_cast<int32_t>(generated) + 4);
  GenerateResult g = GenerateGreedy(server.stub(), id, 4);
  REQUIRE(g.status.ok());
  CHECK(g.tokens == std::vector<int32_t>(expected.end() - 4, expected.end()));
}

TEST_CASE("Complete streams a prompt and the answer in one call", "[server]") {
  InProcessServer server;
  const auto prompt = RandomTokens(800, 41);
  grpc::ClientContext context;
  SetDeadline(context, 60);
  auto stream = server.stub().Complete(&context);
  drt::v1::CompleteRequest first;
  first.mutable_generate()->set_max_tokens(12);
  REQUIRE(stream->Write(first));
  size_t done = 0;
  for (size_t piece : RandomPieces(prompt.size(), 100, 5)) {
    drt::v1::CompleteRequest request;
    request.mutable_tokens()->mutable_ids()->Add(prompt.begin() + done,
                                                 prompt.begin() + done + piece);
    REQUIRE(stream->Write(request));
    done += piece;
  }
  stream->WritesDone();
  std::vector<int32_t> tokens;
  std::optional<drt::v1::GenerateDone> finished;
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
    for (int32_t t : response.piece().token_ids()) tokens.push_back(t);
    if (response.has_done()) finished = response.done();
  }
  grpc::Status status = stream->Finish();
  INFO(status.error_message());
  REQUIRE(status.ok());
  CHECK(tokens == EngineGreedy(prompt, 12));
  REQUIRE(finished.has_value());
  CHECK(finished->finish_reason() == drt::v1::FINISH_REASON_LENGTH);
  CHECK(finished->timings().prompt_tokens() == 800);
  CHECK(finished->timings().generated_tokens() == 12);
  CHECK(finished->timings().prefill_seconds() > 0);

  // The temporary session is gone.
  grpc::ClientContext list_context;
  drt::v1::ListSessionsResponse list;
  REQUIRE(server.stub().ListSessions(&list_context, {}, &list).ok());
  CHECK(list.sessions_size() == 0);
}

TEST_CASE("GetModelInfo, ListSessions and DeleteSession", "[server]") {
  InProcessServer server;
  {
    grpc::ClientContext context;
    drt::v1::ModelInfo info;
    REQUIRE(server.stub().GetModelInfo(&context, {}, &info).ok());
    CHECK(info.name() == "two_groups");
    CHECK(info.device() == "cpu");
    CHECK(info.precision() == "fp32");
    CHECK(info.vocab_size() == 300);
    CHECK(info.pad_id() == 298);
    CHECK(info.chunk_id() == 299);
    CHECK(info.enc_chunk_size() == 63);
    CHECK(info.tokenizer() == "bytes");
    CHECK(info.max_context_tokens() == SmallOptions().max_context_tokens);
  }
  drt::v1::CreateSessionRequest create;
  create.set_max_context_tokens(5000);
  create.set_idle_ttl_seconds(77);
  const std::string a = CreateSession(server.stub(), create).id;
  const std::string b = NewSession(server.stub());
  REQUIRE_FALSE(a.empty());
  REQUIRE_FALSE(b.empty());
  REQUIRE(AppendTokens(server.stub(), a, RandomTokens(130, 1), {130}).status.ok());
  {
    InfoResult info = GetSession(server.stub(), a);
    REQUIRE(info.status.ok());
    CHECK(info.info.session_id() == a);
    CHECK(info.info.tokens() == 130);
    CHECK(info.info.chunks() == 2);
    CHECK(info.info.host_bytes() > 0);
    CHECK(info.info.max_context_tokens() == 5000);
    CHECK(info.info.idle_ttl_seconds() == 77);
    CHECK(info.info.idle_seconds() >= 0);
    CHECK(GetSession(server.stub(), b).info.max_context_tokens() ==
          SmallOptions().max_context_tokens);
  }
  auto list_ids = [&] {
    grpc::ClientContext context;
    drt::v1::ListSessionsResponse list;
    REQUIRE(server.stub().ListSessions(&context, {}, &list).ok());
    std::vector<std::string> ids;
    for (const auto& s : list.sessions()) ids.push_back(s.session_id());
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  std::vector<std::string> both = {a, b};
  std::sort(both.begin(), both.end());
  CHECK(list_ids() == both);
  REQUIRE(DeleteSession(server.stub(), a).ok());
  CHECK(list_ids() == std::vector<std::string>{b});
  CHECK(GetSession(server.stub(), a).status.error_code() == grpc::StatusCode::NOT_FOUND);
}

TEST_CASE("health and reflection answer", "[server]") {
  InProcessServer server;
  HealthResult overall = CheckHealth(*server.channel(), "");
  INFO(overall.status.error_message());
  REQUIRE(overall.status.ok());
  CHECK(overall.serving_status == 1);  // SERVING
  HealthResult drt = CheckHealth(*server.channel(), "drt.v1.Drt");
  REQUIRE(drt.status.ok());
  CHECK(drt.serving_status == 1);
  CHECK(CheckHealth(*server.channel(), "no.such.Service").status.error_code() ==
        grpc::StatusCode::NOT_FOUND);

  grpc::Status status;
  std::vector<std::string> services = ReflectionListServices(*server.channel(), &status);
  INFO(status.error_message());
  REQUIRE(status.ok());
  CHECK_THAT(services, Catch::Matchers::VectorContains(std::string("drt.v1.Drt")));
  CHECK_THAT(services, Catch::Matchers::VectorContains(std::string("grpc.health.v1.Health")));

  // grpcurl's next question: the file that defines drt.v1.Drt.
  std::string descriptor = ReflectionFileContainingSymbol(*server.channel(), "drt.v1.Drt", &status);
  REQUIRE(status.ok());
  CHECK_THAT(descriptor, Contains("drt/v1/drt.proto"));
  CHECK_THAT(descriptor, Contains("AppendRequest"));
}

}  // namespace
}  // namespace drt::server
