// A conversation with the model: a stream of real tokens of any length. The
// session feeds the backend in steps (engine/batch_step.h; the step plan
// inserts a landmark after every enc_chunk_size tokens), keeps the logits of
// the last real token and generates. Backend-independent (design.md,
// "Session state").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/sampler.h"
#include "engine/session_state.h"
#include "engine/token_scores.h"

namespace drt {

struct AppendProgress {
  int64_t tokens_done = 0;   // of this append
  int64_t tokens_total = 0;  // of this append
  int64_t chunks = 0;        // closed chunks in the session
};

struct AppendOptions {
  // Also return the logits of every token appended (tests, scoring).
  bool all_logits = false;
  // Accept pad_id (the engine's own padding; clients may not send it).
  bool allow_pad = false;
  // Checked between pieces; returning true ends the append early with the
  // tokens processed so far applied. Where earlier pieces skipped upper
  // layers, one more piece of up to Backend::upper_layer_reach() + 1
  // positions runs first, which completes the session's state; else, where
  // the last piece computed no logits (RunStepSkipsLastLogits), one more
  // token; else none.
  std::function<bool()> should_stop;
  // Called after each piece. The session's logits and upper-layer state are
  // its own only once Append returns (StepEntry::tokens_following).
  std::function<void(const AppendProgress&)> on_progress;
  // Score the appended tokens (engine/token_scores.h): token i's
  // log-probability given the tokens before it, from the logits of the
  // position before it (for token 0 the session's last_logits(), so none
  // when the session is empty or not whole). Every row of a scored append
  // runs every layer (no lower-only forwards: the logits of every row are
  // needed), and only one piece's logits are held at a time.
  bool score = false;
  // With score: each token's most likely alternatives, in [0, kMaxTopLogprobs].
  int32_t score_top_logprobs = 0;
  // With score: called after each piece with that piece's scores (before
  // on_progress); unset, the scores gather in AppendResult::scores.
  std::function<void(absl::Span<const TokenScore>)> on_scores;
};

struct AppendResult {
  int64_t tokens_accepted = 0;
  bool stopped_early = false;
  std::vector<float> logits;  // tokens_accepted x vocab when all_logits
  // With AppendOptions::score: the scores of the tokens accepted when no
  // on_scores was given, and, either way, how many were scored (the first
  // may not be) and the sum of their log-probabilities (perplexity =
  // exp(-logprob_sum / scored_tokens)).
  std::vector<TokenScore> scores;
  int64_t scored_tokens = 0;
  double logprob_sum = 0.0;
};

enum class FinishReason { kLength, kEndOfText, kCancelled };
const char* FinishReasonName(FinishReason reason);

struct GenerateOptions {
  int32_t max_tokens = 64;
  SamplingParams sampling;
  // Pad the open chunk with pad_id up to its landmark before the first
  // generated token (drt-model.md, "Why the reference pads").
  bool pad_to_chunk_boundary = false;
  // Generation ends after emitting any of these (end of text).
  std::vector<int32_t> stop_ids;
  std::function<bool()> should_stop;
  // Called for each generated token with its log-probability; return false to
  // cancel.
  std::function<bool(int32_t token, float logprob)> on_token;
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  FinishReason finish_reason = FinishReason::kLength;
};

class Session {
 public:
  // The session runs on `backend`, which must outlive it.
  static absl::StatusOr<std::unique_ptr<Session>> Create(Backend& backend);

  // Appends real tokens: one engine step (RunStep) per piece of at most the
  // backend's step size (Backend::max_step_positions); should_stop and
  // on_progress are consulted between pieces. Rows far from the end of the
  // whole append may skip the upper layers (StepEntry::tokens_following);
  // the state and logits it leaves are the same. Rejects, before changing
  // anything, ids outside the vocabulary, the landmark id, and pad_id unless
  // allowed, and score_top_logprobs outside [0, kMaxTopLogprobs].
  absl::StatusOr<AppendResult> Append(absl::Span<const int32_t> tokens,
                                      const AppendOptions& options = {});
  // The check Append makes first: INVALID_ARGUMENT for ids outside the
  // vocabulary, the landmark id, and pad_id unless allowed.
  absl::Status ValidateTokens(absl::Span<const int32_t> tokens, bool allow_pad = false) const;

  // Appends pad_id until the open chunk closes; no-op on a boundary.
  absl::Status PadToChunkBoundary();
  absl::StatusOr<GenerateResult> Generate(const GenerateOptions& options);

  // One generation step: samples the next token from last_logits() (never
  // the pad or landmark id) and appends it. For callers that schedule steps
  // themselves (the server interleaves sessions token by token).
  struct GeneratedToken {
    int32_t token;
    float logprob;  // log-softmax at temperature 1
  };
  absl::StatusOr<GeneratedToken> GenerateStep(Sampler& sampler);
  // The sampling half of GenerateStep, changing nothing: a scheduler that
  // batches sessions samples each one's next token, then appends them all in
  // one engine step (engine/batch_step.h).
  absl::StatusOr<GeneratedToken> SampleNext(Sampler& sampler) const;

  // Logits of the last real token; empty before any token, and while the
  // state is not whole (CheckStateWhole says why): the logits the session
  // holds then are not its last token's, or were computed beside
  // upper-layer rows that were skipped within the reach of its end.
  absl::Span<const float> last_logits() const {
    if (!StateWhole()) return {};
    return last_logits_;
  }
  // OK when the session's last logits are its last token's and its
  // upper-layer state is the one a full computation gives. Otherwise
  // FAILED_PRECONDITION naming what is short: an Append (or a RunStep
  // entry with tokens_following, engine/batch_step.h) failed after a piece
  // with tokens following, which computed no logits for its last token or
  // skipped upper-layer rows that its later pieces were to make up for.
  // Appending more tokens in one Append (at least the positions named in
  // the message) makes it whole again. Sampling (SampleNext, GenerateStep,
  // Generate) and ExportState refuse a session that is not whole with this
  // error; Fork copies it as it is.
  absl::Status CheckStateWhole() const;
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_chunks() const { return backend_session_->num_chunks(); }
  // Chunk retrievals this session's forwards made since it was created (a
  // fork or a restored session starts at 0): one per landmark and group
  // that went through the upper layers. Lower-only forwards make none
  // (docs/engine.md, "Lower-only forwards").
  int64_t retrievals() const { return retrievals_; }
  const ModelConfig& config() const { return config_; }
  const Backend& backend() const { return backend_; }
  BackendSession& backend_session() { return *backend_session_; }
  const BackendSession& backend_session() const { return *backend_session_; }

  absl::StatusOr<std::unique_ptr<Session>> Fork() const;

  // Durable state (engine/session_state.h; engine/session_restore.cc). The
  // small state (no closed chunks: read those with
  // backend_session().ReadChunk). UNIMPLEMENTED naming the backend when it
  // cannot export.
  absl::StatusOr<SessionState> ExportState() const;
  // A new session on `backend` holding `state` and its closed chunks, read
  // through `read` (or, for the leading whole units of chunks `map` can
  // map, mapped: the disk tier, BackendSession::ImportState); it continues exactly as
  // the exported one would.
  static absl::StatusOr<std::unique_ptr<Session>> Restore(Backend& backend,
                                                          const SessionState& state,
                                                          const ChunkReader& read,
                                                          const ChunkMapper& map = nullptr);

 private:
  // engine/batch_step.cc advances num_tokens_, retrievals_ and last_logits_
  // after a step.
  friend class StepRunner;

  Session(Backend& backend, std::unique_ptr<BackendSession> backend_session);
  bool StateWhole() const;

  Backend& backend_;
  const ModelConfig& config_;
  std::unique_ptr<BackendSession> backend_session_;
  int64_t num_tokens_ = 0;
  int64_t retrievals_ = 0;
  std::vector<float> last_logits_;
  // num_tokens_ when last_logits_ were computed: they are the last token's
  // only while the two are equal.
  int64_t logits_tokens_ = 0;
  // The decoder position just past the last row that skipped the upper
  // layers (0: none). The upper-layer state is whole while every skipped
  // row lies more than Backend::upper_layer_reach() positions before the
  // end (engine/model_rules.h, UpperLayerReach): skipped_upper_end_ +
  // reach <= position (or none skipped).
  int64_t skipped_upper_end_ = 0;
};

}  // namespace drt
