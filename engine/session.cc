#include "engine/session.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/batch_step.h"
#include "engine/step_plan.h"

namespace drt {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kEndOfText: return "end_of_text";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Session>> Session::Create(Backend& backend) {
  auto backend_session = backend.NewSession();
  if (!backend_session.ok()) return backend_session.status();
  return std::unique_ptr<Session>(new Session(backend, *std::move(backend_session)));
}

Session::Session(Backend& backend, std::unique_ptr<BackendSession> backend_session)
    : backend_(backend), config_(backend.config()), backend_session_(std::move(backend_session)) {}

bool Session::StateWhole() const {
  return logits_tokens_ == num_tokens_ &&
         (skipped_upper_end_ == 0 ||
          skipped_upper_end_ + backend_.upper_layer_reach() <= backend_session_->position());
}

absl::Status Session::CheckStateWhole() const {
  if (logits_tokens_ != num_tokens_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the session's last logits are those of its token %d, but it holds %d tokens: an Append "
        "failed after a piece with tokens following, which computed no logits for its last "
        "token; append more tokens (in one Append) to complete it",
        logits_tokens_, num_tokens_));
  }
  const int64_t position = backend_session_->position();
  const int64_t reach = backend_.upper_layer_reach();
  if (skipped_upper_end_ > 0 && skipped_upper_end_ + reach > position) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the session's rows up to decoder position %d skipped the upper layers and lie within "
        "the upper-layer reach (%d positions) of its end at %d: an Append failed after a piece "
        "with tokens following, so its last logits and upper-layer state are not the ones a "
        "full computation gives; append tokens filling at least %d more positions (in one "
        "Append) to complete it",
        skipped_upper_end_, reach, position, skipped_upper_end_ + reach - position));
  }
  return absl::OkStatus();
}

absl::Status Session::ValidateTokens(absl::Span<const int32_t> tokens, bool allow_pad) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t id = tokens[i];
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token %d (index %d) is outside the vocabulary [0, %d)", id, i, config_.vocab_size));
    }
    if (id == config_.pad_id && allow_pad) continue;
    if (id == config_.chunk_id) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token %d (index %d) is the landmark id, which only the engine inserts", id, i));
    }
    if (id == config_.pad_id) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token %d (index %d) is the pad id, which only the engine inserts", id, i));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AppendResult> Session::Append(absl::Span<const int32_t> tokens,
                                             const AppendOptions& options) {
  if (absl::Status s = ValidateTokens(tokens, options.allow_pad); !s.ok()) return s;
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t vocab = config_.vocab_size;
  // A scored append takes each piece's logits (which also keeps its rows on
  // every layer, StepEntry::all_logits) and scores them before the next.
  std::optional<TokenScorer> scorer;
  if (options.score) {
    auto created = TokenScorer::Create(
        options.score_top_logprobs, last_logits(),
        {static_cast<int32_t>(config_.chunk_id), static_cast<int32_t>(config_.pad_id)});
    if (!created.ok()) return created.status();
    scorer.emplace(*std::move(created));
  }
  AppendResult result;
  if (options.all_logits) result.logits.reserve(total * vocab);
  std::vector<float> piece_logits;
  std::vector<TokenScore> piece_scores;
  int64_t done = 0;
  // Each piece tells RunStep how many tokens follow it, so that rows far
  // from the end of the whole append may skip the upper layers, and the
  // piece may get no logits (StepEntry::tokens_following). A stop between
  // pieces then owes (engine/model_rules.h, UpperLayerReach):
  // - where rows skipped the upper layers and no piece since has run them
  //   over the whole reach: one more piece of up to upper_layer_reach() + 1
  //   positions with none following, which makes the state whole;
  // - else where the last piece got no logits (RunStepSkipsLastLogits): one
  //   token, whose logits become the session's;
  // - else nothing (a backend that skips nothing, or lower_only_forwards off).
  bool upper_state_owed = false;
  bool logits_owed = false;
  while (done < total) {
    int64_t piece;
    bool stopping = false;
    if (done > 0 && options.should_stop && options.should_stop()) {
      result.stopped_early = true;
      if (!upper_state_owed && !logits_owed) break;
      piece = upper_state_owed ? TokensFitting(config_, num_tokens_, total - done,
                                               backend_.upper_layer_reach() + 1)
                               : 1;
      stopping = true;
    } else {
      // One step of at most the backend's step size: a single-entry RunStep,
      // the path every batched step takes.
      piece = TokensFitting(config_, num_tokens_, total - done, backend_.max_step_positions());
    }
    StepEntry entry;
    entry.session = this;
    entry.tokens = tokens.subspan(done, piece);
    entry.allow_pad = options.allow_pad;
    piece_logits.clear();
    entry.all_logits = scorer.has_value()     ? &piece_logits
                       : options.all_logits ? &result.logits
                                            : nullptr;
    entry.tokens_following = stopping ? 0 : total - done - piece;
    const int64_t skipped_before = backend_session_->stats().upper_rows_skipped;
    const int64_t position_before = backend_session_->position();
    if (absl::Status s = RunStep(backend_, {entry})[0]; !s.ok()) return s;
    if (backend_session_->stats().upper_rows_skipped > skipped_before) {
      upper_state_owed = true;
    } else if (backend_session_->position() - position_before > backend_.upper_layer_reach()) {
      upper_state_owed = false;  // every row of the reach ran the upper layers
    }
    logits_owed = RunStepSkipsLastLogits(backend_, entry);
    if (scorer.has_value()) {
      piece_scores.clear();
      absl::Status scored = scorer->Score(entry.tokens, piece_logits, vocab,
                                          options.on_scores ? &piece_scores : &result.scores);
      if (!scored.ok()) return scored;
      if (options.on_scores) options.on_scores(piece_scores);
      result.scored_tokens = scorer->scored_tokens();
      result.logprob_sum = scorer->logprob_sum();
      if (options.all_logits) {
        result.logits.insert(result.logits.end(), piece_logits.begin(), piece_logits.end());
      }
    }
    done += piece;
    result.tokens_accepted = done;
    if (options.on_progress) {
      options.on_progress({done, total, backend_session_->num_chunks()});
    }
    if (stopping) break;
  }
  if (done == total) result.stopped_early = false;
  return result;
}

absl::Status Session::PadToChunkBoundary() {
  const int64_t open = num_tokens_ % config_.enc_chunk_size;
  if (open == 0) return absl::OkStatus();
  std::vector<int32_t> pads(config_.enc_chunk_size - open, static_cast<int32_t>(config_.pad_id));
  AppendOptions options;
  options.allow_pad = true;
  return Append(pads, options).status();
}

absl::StatusOr<GenerateResult> Session::Generate(const GenerateOptions& options) {
  if (absl::Status s = ValidateSamplingParams(options.sampling); !s.ok()) return s;
  if (absl::Status s = ValidateLogitBiasIds(options.sampling, config_.vocab_size,
                                            config_.chunk_id, config_.pad_id);
      !s.ok()) {
    return s;
  }
  if (options.max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens must be >= 0, got %d", options.max_tokens));
  }
  if (num_tokens_ == 0) {
    return absl::FailedPreconditionError("the session holds no tokens yet: append a prompt first");
  }
  if (absl::Status s = CheckStateWhole(); !s.ok()) return s;
  if (options.pad_to_chunk_boundary) {
    if (absl::Status s = PadToChunkBoundary(); !s.ok()) return s;
  }
  GenerateResult result;
  Sampler sampler(options.sampling);
  while (static_cast<int32_t>(result.tokens.size()) < options.max_tokens) {
    if (options.should_stop && options.should_stop()) {
      result.finish_reason = FinishReason::kCancelled;
      return result;
    }
    auto step = GenerateStep(sampler);
    if (!step.ok()) return step.status();
    const int32_t token = step->token;
    result.tokens.push_back(token);
    if (options.on_token && !options.on_token(token, step->logprob)) {
      result.finish_reason = FinishReason::kCancelled;
      return result;
    }
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), token) !=
        options.stop_ids.end()) {
      result.finish_reason = FinishReason::kEndOfText;
      return result;
    }
  }
  result.finish_reason = FinishReason::kLength;
  return result;
}

absl::StatusOr<Session::GeneratedToken> Session::SampleNext(Sampler& sampler) const {
  if (num_tokens_ == 0) {
    return absl::FailedPreconditionError("the session holds no tokens yet: append a prompt first");
  }
  if (absl::Status s = CheckStateWhole(); !s.ok()) return s;
  // Logits are checked here, not after each forward: a NaN or +inf (which
  // finite weights, checked at load, make only by overflow) fails the step
  // that would sample from it, naming the logit (docs/engine.md, "Sampling").
  // The model may score the engine's own ids; never emit them. They are
  // masked before the one draw, so the token comes from the masked
  // distribution under top_k / top_p too (drawing first and drawing again
  // after a masked id did not: the first draw's candidates included them).
  std::vector<float> masked = last_logits_;
  masked[config_.chunk_id] = -std::numeric_limits<float>::infinity();
  masked[config_.pad_id] = -std::numeric_limits<float>::infinity();
  auto token = sampler.Sample(masked);
  absl::StatusOr<float> logprob =
      token.ok() ? Sampler::LogProb(last_logits_, *token) : absl::StatusOr<float>(token.status());
  if (!logprob.ok()) {
    return absl::InternalError(
        absl::StrFormat("the model's logits after %d tokens cannot be sampled: %s", num_tokens_,
                        logprob.status().message()));
  }
  return GeneratedToken{*token, *logprob};
}

absl::StatusOr<Session::GeneratedToken> Session::GenerateStep(Sampler& sampler) {
  auto next = SampleNext(sampler);
  if (!next.ok()) return next.status();
  // Generated tokens join the context, so a later Append continues after them.
  const int32_t ids[] = {next->token};
  if (auto appended = Append(ids); !appended.ok()) return appended.status();
  return *next;
}

absl::StatusOr<std::unique_ptr<Session>> Session::Fork() const {
  auto forked = backend_session_->Fork();
  if (!forked.ok()) return forked.status();
  auto session = std::unique_ptr<Session>(new Session(backend_, *std::move(forked)));
  session->num_tokens_ = num_tokens_;
  session->last_logits_ = last_logits_;
  session->logits_tokens_ = logits_tokens_;
  session->skipped_upper_end_ = skipped_upper_end_;
  return session;
}

}  // namespace drt
