// Lower-only forwards (StepPlan::lower_only; engine/model_rules.h,
// UpperLayerReach): rows far from the end of an append skip the upper
// layers, retrievals and logits. The state a session keeps afterwards (every
// window, the open chunk, the chunk memory, the selections in force, the last
// logits) and every logit it generates from there must be those of a session
// that ran every row through the whole forward; a reach that is too small
// must show up as a different state.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/batch_step.h"
#include "engine/model.h"
#include "engine/model_rules.h"
#include "engine/session.h"
#include "engine/session_state.h"
#include "engine/step_plan.h"
#include "tests/test_util/random_model.h"
#include "tests/test_util/build_paths.h"

namespace drt {
namespace {

std::unique_ptr<Backend> CpuBackend(const ModelConfig& config, const ModelWeights& weights,
                                    bool lower_only, int64_t step_positions,
                                    int64_t reach = 0) {
  CpuBackendOptions options;
  options.lower_only_forwards = lower_only;
  options.max_step_positions = step_positions;
  options.upper_layer_reach = reach;
  return MakeCpuBackend(config, weights, options);
}

std::unique_ptr<Session> NewSession(Backend& backend) {
  auto session = Session::Create(backend);
  REQUIRE(session.ok());
  return *std::move(session);
}

// The largest |a - b| / max|b| over one float array (0 when equal).
double Difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  if (a.empty()) return 0;
  return testing::RelativeDifference(a.data(), b.data(), static_cast<int64_t>(a.size()));
}

// The worst relative difference between everything the two sessions keep:
// windows of every layer, open chunk, every closed chunk, selections in
// force, last logits. Different window sizes or selected chunks count as a
// difference of 1; token counts and positions must match.
double WorstStateDifference(const Session& a, const Session& b) {
  REQUIRE(a.num_tokens() == b.num_tokens());
  REQUIRE(a.num_chunks() == b.num_chunks());
  auto sa = a.ExportState();
  auto sb = b.ExportState();
  REQUIRE(sa.ok());
  REQUIRE(sb.ok());
  REQUIRE(sa->backend.position == sb->backend.position);
  double worst = Difference(sa->last_logits, sb->last_logits);
  REQUIRE(sa->backend.windows.size() == sb->backend.windows.size());
  for (size_t l = 0; l < sa->backend.windows.size(); ++l) {
    if (sa->backend.windows[l].rows != sb->backend.windows[l].rows) return 1.0;
    worst = std::max(worst, Difference(sa->backend.windows[l].keys, sb->backend.windows[l].keys));
    worst = std::max(worst,
                     Difference(sa->backend.windows[l].values, sb->backend.windows[l].values));
  }
  worst = std::max(worst, Difference(sa->backend.open_chunk, sb->backend.open_chunk));
  REQUIRE(sa->backend.selection.size() == sb->backend.selection.size());
  for (size_t g = 0; g < sa->backend.selection.size(); ++g) {
    if (sa->backend.selection[g].chunks != sb->backend.selection[g].chunks) return 1.0;
    worst = std::max(worst, Difference(sa->backend.selection[g].weights,
                                       sb->backend.selection[g].weights));
  }
  for (int64_t c = 0; c < a.num_chunks(); ++c) {
    ChunkData ca, cb;
    REQUIRE(a.backend_session().ReadChunk(c, ca).ok());
    REQUIRE(b.backend_session().ReadChunk(c, cb).ok());
    worst = std::max({worst, Difference(ca.landmark, cb.landmark), Difference(ca.rows, cb.rows)});
  }
  return worst;
}

// The greedy next token of a session (never the engine's own ids).
int32_t Greedy(const Session& s) {
  const ModelConfig& c = s.config();
  int32_t best = -1;
  for (int32_t t = 0; t < static_cast<int32_t>(c.vocab_size); ++t) {
    if (t == c.pad_id || t == c.chunk_id) continue;
    if (best < 0 || s.last_logits()[t] > s.last_logits()[best]) best = t;
  }
  return best;
}

void Append(Session& s, const std::vector<int32_t>& tokens, const std::vector<int64_t>& pieces) {
  int64_t done = 0;
  for (int64_t piece : pieces) {
    std::vector<int32_t> part(tokens.begin() + done, tokens.begin() + done + piece);
    REQUIRE(s.Append(part).ok());
    done += piece;
  }
  REQUIRE(done == static_cast<int64_t>(tokens.size()));
}

// Appends `tokens` in `pieces` to a session on each backend, requires the
// same state, then generates `generate` tokens greedily on both and
// requires the same logits at every one. A forward is lower-only when it
// ends more than the reach before the end of its append: some do exactly
// when a piece holds more than a step and a reach of positions.
void RequireSameWithAndWithoutCut(Backend& cut, Backend& whole, const std::vector<int32_t>& tokens,
                                  const std::vector<int64_t>& pieces, int generate) {
  std::unique_ptr<Session> a = NewSession(cut);
  std::unique_ptr<Session> b = NewSession(whole);
  Append(*a, tokens, pieces);
  Append(*b, tokens, pieces);
  const int64_t longest = *std::max_element(pieces.begin(), pieces.end());
  const bool some_cut =
      longest > cut.max_step_positions() + cut.upper_layer_reach();
  const bool no_cut = longest < cut.upper_layer_reach();
  REQUIRE((some_cut || no_cut));  // the layouts are chosen to be one or the other
  CHECK((a->backend_session().stats().upper_rows_skipped > 0) == some_cut);
  CHECK(b->backend_session().stats().upper_rows_skipped == 0);
  // Bit-exact: a skipped row changes no float of what is kept, and the GEMMs
  // of the rows that do run see the same inputs in the same K order.
  REQUIRE(WorstStateDifference(*a, *b) == 0.0);
  for (int i = 0; i < generate; ++i) {
    const int32_t next = Greedy(*b);
    REQUIRE(Greedy(*a) == next);
    REQUIRE(a->Append({&next, 1}).ok());
    REQUIRE(b->Append({&next, 1}).ok());
    REQUIRE(Difference(std::vector<float>(a->last_logits().begin(), a->last_logits().end()),
                       std::vector<float>(b->last_logits().begin(), b->last_logits().end())) ==
            0.0);
  }
  REQUIRE(WorstStateDifference(*a, *b) == 0.0);
}

// Piece layouts of a prompt of n tokens: whole, uneven, and many pieces
// shorter than the reach `short_piece`.
std::vector<std::vector<int64_t>> PieceLayouts(int64_t n, int64_t short_piece) {
  std::vector<std::vector<int64_t>> layouts = {{n}, {1000, 37, n - 1037}};
  std::vector<int64_t> shorts;
  int64_t left = n;
  for (int64_t i = 0; left > 0; ++i) {
    const int64_t p = std::min(left, i % 3 == 0 ? 1 : short_piece - i % 5);
    shorts.push_back(p);
    left -= p;
  }
  layouts.push_back(shorts);
  return layouts;
}

TEST_CASE("lower-only forwards leave the same state and logits (random model)", "[upper_cut]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 41);
  const int64_t reach = UpperLayerReach(config);
  // A step of 8 chunks: the append runs through many forwards.
  auto cut = CpuBackend(config, weights, true, 8 * config.chunk_positions());
  auto whole = CpuBackend(config, weights, false, 8 * config.chunk_positions());
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 3000, 42);
  for (const auto& pieces : PieceLayouts(3000, reach - 10)) {
    INFO("pieces: " << pieces.size());
    RequireSameWithAndWithoutCut(*cut, *whole, tokens, pieces, 20);
  }
}

TEST_CASE("lower-only forwards leave the same state and logits (bundled model)", "[upper_cut]") {
  auto model = LoadModel(std::string(drt::testing::SourceDir()) + "/models/drt-passkey-byte");
  REQUIRE(model.ok());
  const ModelConfig& config = (*model)->config();
  auto cut = CpuBackend(config, (*model)->weights(), true, 1024);
  auto whole = CpuBackend(config, (*model)->weights(), false, 1024);
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 4000, 43);
  for (const auto& pieces : PieceLayouts(4000, 300)) {
    INFO("pieces: " << pieces.size());
    RequireSameWithAndWithoutCut(*cut, *whole, tokens, pieces, 20);
  }
}

TEST_CASE("a session counts the retrievals its forwards made: none in lower-only forwards",
          "[upper_cut]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 48);
  auto cut = CpuBackend(config, weights, true, 8 * config.chunk_positions());
  auto whole = CpuBackend(config, weights, false, 8 * config.chunk_positions());
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 3000, 49);
  std::unique_ptr<Session> a = NewSession(*cut);
  std::unique_ptr<Session> b = NewSession(*whole);
  REQUIRE(a->Append(tokens).ok());
  REQUIRE(b->Append(tokens).ok());
  const int64_t S = config.chunk_positions();
  // Every landmark of the whole forward made one retrieval per group.
  CHECK(b->retrievals() == b->num_chunks() * config.num_groups());
  // The lower-only forwards ran the append's first positions (one append
  // from position 0): the landmarks among them, at positions S-1, 2S-1, ...,
  // made none.
  const int64_t skipped = a->backend_session().stats().upper_rows_skipped;
  REQUIRE(skipped > 0);
  CHECK(a->retrievals() == (a->num_chunks() - skipped / S) * config.num_groups());
  // Token by token (as generation runs), a forward retrieves only at the
  // landmark it passes: one chunk's worth of tokens closes one chunk.
  const int64_t retrievals_before = b->retrievals();
  const int64_t chunks_before = b->num_chunks();
  const std::vector<int32_t> more = testing::RandomTokens(config, config.enc_chunk_size, 50);
  for (int32_t t : more) REQUIRE(b->Append(std::vector<int32_t>{t}).ok());
  REQUIRE(b->num_chunks() == chunks_before + 1);
  CHECK(b->retrievals() - retrievals_before == config.num_groups());
}

TEST_CASE("a reach smaller than the model's changes the state", "[upper_cut]") {
  // Shows that the comparison above can fail: with the upper layers cut
  // closer to the end than their receptive field, windows, selections or
  // logits differ. The tight bound derived next to UpperLayerReach is
  // U * max(W, S) + S (48 here; the model's reach is 58); a reach of one
  // window (what a single upper layer would need) is short of it for this
  // two-layer model. Measured with steps of one chunk, 4 seeds x 3 prompt
  // lengths (700, 703, 705 tokens): the largest reach at which the state
  // still differs is 35-40, and it is equal for every larger one up to 80,
  // so the derived bound holds with room.
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 44);
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 2000, 45);
  // Steps of one chunk: the forwards that run whole are then the fewest
  // that cover the reach.
  const int64_t step = config.chunk_positions();
  auto whole = CpuBackend(config, weights, false, step);
  std::unique_ptr<Session> b = NewSession(*whole);
  REQUIRE(b->Append(tokens).ok());
  for (int64_t reach : {int64_t{1}, config.slide_window + 1}) {
    INFO("reach " << reach);
    auto cut = CpuBackend(config, weights, true, step, reach);
    std::unique_ptr<Session> a = NewSession(*cut);
    REQUIRE(a->Append(tokens).ok());
    REQUIRE(a->backend_session().stats().upper_rows_skipped > 0);
    CHECK(WorstStateDifference(*a, *b) > 0.0);
  }
}

TEST_CASE("an append stopped after pieces that skipped upper layers completes the state",
          "[upper_cut]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 46);
  auto cut = CpuBackend(config, weights, true, 8 * config.chunk_positions());
  auto whole = CpuBackend(config, weights, false, 8 * config.chunk_positions());
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 2000, 47);
  std::unique_ptr<Session> a = NewSession(*cut);
  int pieces = 0;
  AppendOptions stop_after_two;
  stop_after_two.should_stop = [&] { return ++pieces >= 2; };
  auto appended = a->Append(tokens, stop_after_two);
  REQUIRE(appended.ok());
  CHECK(appended->stopped_early);
  // Two pieces of the step size, then one of at least the reach.
  const int64_t accepted = appended->tokens_accepted;
  CHECK(DecoderPositionsFor(config, accepted) >=
        2 * cut->max_step_positions() - config.chunk_positions() + UpperLayerReach(config));
  CHECK(accepted < 2000);
  CHECK(a->backend_session().stats().upper_rows_skipped > 0);
  std::unique_ptr<Session> b = NewSession(*whole);
  REQUIRE(b->Append({tokens.data(), static_cast<size_t>(accepted)}).ok());
  REQUIRE(WorstStateDifference(*a, *b) == 0.0);
}

TEST_CASE("RunStep cuts a long entry beside short ones and keeps every state", "[upper_cut]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 48);
  auto cut = CpuBackend(config, weights, true, 8 * config.chunk_positions());
  auto whole = CpuBackend(config, weights, false, 8 * config.chunk_positions());
  const std::vector<int32_t> prompt = testing::RandomTokens(config, 100, 49);
  const std::vector<int32_t> long_entry = testing::RandomTokens(config, 1500, 50);
  const std::vector<int32_t> one = {5};
  std::vector<std::unique_ptr<Session>> sessions;  // per backend: long, decode, observed
  std::vector<int64_t> skipped_before;
  for (Backend* backend : {cut.get(), whole.get()}) {
    for (int i = 0; i < 3; ++i) {
      sessions.push_back(NewSession(*backend));
      REQUIRE(sessions.back()->Append(prompt).ok());
      skipped_before.push_back(sessions.back()->backend_session().stats().upper_rows_skipped);
    }
    int64_t seen = 0;
    sessions.back()->backend_session().set_retrieval_observer(
        [&seen](int64_t, int64_t, const Retrieval&) { ++seen; });
    const size_t first = sessions.size() - 3;
    std::vector<StepEntry> entries(3);
    entries[0].session = sessions[first].get();
    entries[0].tokens = long_entry;
    entries[1].session = sessions[first + 1].get();
    entries[1].tokens = one;
    entries[2].session = sessions[first + 2].get();
    entries[2].tokens = long_entry;  // observed: every landmark's retrieval runs
    for (const absl::Status& s : RunStep(*backend, entries)) REQUIRE(s.ok());
    CHECK(seen > 0);
    sessions[first + 2]->backend_session().set_retrieval_observer(nullptr);
  }
  auto skipped_in_step = [&](int i) {
    return sessions[i]->backend_session().stats().upper_rows_skipped - skipped_before[i];
  };
  CHECK(skipped_in_step(0) > 0);
  CHECK(skipped_in_step(1) == 0);
  CHECK(skipped_in_step(2) == 0);
  CHECK(skipped_in_step(3) == 0);
  for (int i = 0; i < 3; ++i) {
    INFO("entry " << i);
    REQUIRE(WorstStateDifference(*sessions[i], *sessions[3 + i]) == 0.0);
  }
}

TEST_CASE("no lower-only forward for all logits, and none where switched off", "[upper_cut]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 51);
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 500, 52);
  auto cut = CpuBackend(config, weights, true, 8 * config.chunk_positions());
  std::unique_ptr<Session> scored = NewSession(*cut);
  AppendOptions all;
  all.all_logits = true;
  auto appended = scored->Append(tokens, all);
  REQUIRE(appended.ok());
  CHECK(appended->logits.size() == tokens.size() * config.vocab_size);
  CHECK(scored->backend_session().stats().upper_rows_skipped == 0);
  // A fork starts its counters at zero.
  std::unique_ptr<Session> a = NewSession(*cut);
  REQUIRE(a->Append(tokens).ok());
  REQUIRE(a->backend_session().stats().upper_rows_skipped > 0);
  auto fork = a->Fork();
  REQUIRE(fork.ok());
  CHECK((*fork)->backend_session().stats().upper_rows_skipped == 0);
}

TEST_CASE("lower-only plans are refused by name where they do not run", "[upper_cut]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 53);
  auto whole = CpuBackend(config, weights, false, 1024);
  std::unique_ptr<Session> s = NewSession(*whole);
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 20, 54);
  SliceRequest request;
  request.tokens = tokens;
  auto plan = PlanStep(config, {request}, /*lower_only=*/true);
  REQUIRE(plan.ok());
  CHECK(plan->logit_rows.empty());
  BackendSession* sessions[] = {&s->backend_session()};
  absl::Status status = whole->Step(*plan, sessions, {});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()), Catch::Matchers::Contains("lower-only"));
  CHECK(s->backend_session().position() == 0);

  // A lower-only plan that asks for logits (built by hand) is refused too,
  // on a backend that runs lower-only forwards.
  auto cut = CpuBackend(config, weights, true, 1024);
  std::unique_ptr<Session> t = NewSession(*cut);
  auto with_logits = PlanStep(config, {request});
  REQUIRE(with_logits.ok());
  with_logits->lower_only = true;
  std::vector<float> logits(with_logits->logit_rows.size() * config.vocab_size);
  BackendSession* cut_sessions[] = {&t->backend_session()};
  status = cut->Step(*with_logits, cut_sessions, absl::MakeSpan(logits));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()), Catch::Matchers::Contains("no logits"));
  CHECK(t->backend_session().position() == 0);

  request.all_logits = true;
  auto refused = PlanStep(config, {request}, /*lower_only=*/true);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.status().message()), Catch::Matchers::Contains("all logits"));

  StepEntry entry;
  entry.session = s.get();
  entry.tokens = tokens;
  entry.tokens_following = -1;
  const absl::Status negative = RunStep(*whole, {entry})[0];
  CHECK(negative.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(negative.message()), Catch::Matchers::Contains("tokens_following"));
  CHECK(s->num_tokens() == 0);
}

}  // namespace
}  // namespace drt

namespace drt {
namespace {

// Finding F3 of the engine review: a stop ran a closing piece of the reach
// after every non-final piece, though only a piece that skipped upper rows
// needs it (and a piece that only went without logits needs one token).
// Each case stops after the first piece (64 positions: 56 tokens) and must
// end in the state of an append of the accepted tokens without a stop.
TEST_CASE("an append stopped after one piece runs only the closing piece it owes",
          "[upper_cut]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 51);
  const int64_t step = 8 * config.chunk_positions();
  auto cut = CpuBackend(config, weights, true, step);
  auto whole = CpuBackend(config, weights, false, step);
  const int64_t reach = cut->upper_layer_reach();
  REQUIRE(reach == UpperLayerReach(config));
  const int64_t first_piece = TokensFitting(config, 0, 1 << 20, step);
  REQUIRE(first_piece == 56);
  struct Case {
    const char* what;
    Backend* backend;
    int64_t total;              // tokens appended
    int64_t want_accepted_min;  // tokens_accepted, inclusive bounds
    int64_t want_accepted_max;
    bool skips;  // the first piece skipped upper rows
  };
  // The closing piece of the reach fits its tokens into reach + 1 positions
  // and fills at least reach of them (one more token would bring its
  // landmark past the budget at most).
  const std::vector<Case> cases = {
      {"lower-only forwards off: nothing owed", whole.get(), 2000, first_piece, first_piece, false},
      {"the first piece skipped upper rows: the reach owed", cut.get(), 2000,
       RealTokensFor(config, DecoderPositionsFor(config, first_piece) + reach),
       RealTokensFor(config, DecoderPositionsFor(config, first_piece) + reach + 1), true},
      {"the first piece lay within the reach of the end: one token owed for its logits",
       cut.get(), first_piece + 10, first_piece + 1, first_piece + 1, false},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const std::vector<int32_t> tokens = testing::RandomTokens(config, c.total, 52);
    std::unique_ptr<Session> a = NewSession(*c.backend);
    AppendOptions stop_after_one;
    stop_after_one.should_stop = [] { return true; };
    auto appended = a->Append(tokens, stop_after_one);
    REQUIRE(appended.ok());
    CHECK(appended->stopped_early);
    CHECK(appended->tokens_accepted >= c.want_accepted_min);
    CHECK(appended->tokens_accepted <= c.want_accepted_max);
    CHECK((a->backend_session().stats().upper_rows_skipped > 0) == c.skips);
    std::unique_ptr<Session> b = NewSession(*whole);
    REQUIRE(b->Append({tokens.data(), static_cast<size_t>(appended->tokens_accepted)}).ok());
    CHECK(WorstStateDifference(*a, *b) == 0.0);
  }
}

// The other branch of F3 (review-enginefix R3): a later piece that runs the
// upper layers over more positions than the reach clears what an earlier
// skipping piece owed. 56 + 56 + 40 tokens, stopped after the second piece:
// the first skips (the end lies more than the reach past it), the second
// does not (the end lies within the reach of position 128) and covers 64 >
// reach positions, so only its logits are owed: one token, 113 accepted.
// Without the clearing the stop runs a closing piece of the reach, which
// takes all 40 remaining tokens (152).
TEST_CASE("a later full piece clears the reach an earlier skipping piece owed", "[upper_cut]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 51);
  const int64_t step = 8 * config.chunk_positions();
  auto cut = CpuBackend(config, weights, true, step);
  auto whole = CpuBackend(config, weights, false, step);
  REQUIRE(cut->upper_layer_reach() < step);
  REQUIRE(TokensFitting(config, 0, 1 << 20, step) == 56);
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 56 + 56 + 40, 53);
  std::unique_ptr<Session> a = NewSession(*cut);
  int pieces = 0;
  AppendOptions stop_after_two;
  stop_after_two.should_stop = [&] { return ++pieces >= 2; };
  auto appended = a->Append(tokens, stop_after_two);
  REQUIRE(appended.ok());
  CHECK(appended->stopped_early);
  CHECK(appended->tokens_accepted == 113);
  CHECK(a->backend_session().stats().upper_rows_skipped > 0);  // the first piece skipped
  std::unique_ptr<Session> b = NewSession(*whole);
  REQUIRE(b->Append({tokens.data(), static_cast<size_t>(appended->tokens_accepted)}).ok());
  CHECK(WorstStateDifference(*a, *b) == 0.0);
}

}  // namespace
}  // namespace drt
