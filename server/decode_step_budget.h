// How many prefill tokens an engine step that carries generated tokens may
// take, so that a generating session's time per output token stays bounded
// while other sessions prefill (issue 11: p99 time per output token under
// prefill load <= 2x idle), and prefill still moves meanwhile.
//
// The policy: a step carrying n generated tokens takes only as many prefill
// tokens p as keep its predicted time
//     decode_seconds(n) + p * prefill_seconds_per_token
// within slowdown_limit * decode_seconds(n), i.e.
//     p = floor((slowdown_limit - 1) * decode_seconds(n) / prefill_seconds_per_token),
// and at least one token, so that prefill is never starved by a session that
// generates without pause. While sessions generate, prefill therefore gets
// about (slowdown_limit - 1) / slowdown_limit of the engine's step time (half
// at the default 2.0).
//
// Both times are estimated from the steps the scheduler ran (Observe):
//   - decode_seconds(n): the fastest of the recent decode-only steps of
//     exactly n generated tokens: the time of that step on an unloaded
//     machine, which is what "idle" means in the target; stalls do not raise
//     it. A step with prefill that ran faster lowers it (it was measured
//     while the machine was slower). A batch size never measured uses the
//     largest smaller one measured (a smaller batch is not slower, so the
//     allowance is conservative); none, or one kDecodeEstimateRefreshSteps
//     steps old, gives 0 prefill tokens: that step runs decode-only and
//     measures it (a probe).
//   - prefill_seconds_per_token: the median over the recent steps that
//     carried both of (seconds - decode_seconds(n)) / p, so one stalled step
//     does not move it. It is measured at the piece sizes decode steps
//     actually take, so the fixed cost of adding any prefill to a decode
//     step is in it. Prefill-only steps (large pieces, cheaper per token)
//     are not used.
// The allowance grows at most to 2p + 1 for the largest p that a recent step
// carried within the limit: a cost measured on small pieces is not
// extrapolated to much larger ones at once, and a step that broke the limit
// is not grown from.
//
// Only the scheduler's engine thread uses an instance; no locking.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <optional>

namespace drt::server {

// A step carrying generated tokens may take this much longer than the same
// step without prefill: the target (p99 under load <= 2x idle). The
// client's time per token also holds the server's turn-around (write,
// sample, resubmit), which prefill does not lengthen; a loaded machine can
// (docs/batching.md, "Decode time per token under prefill load").
constexpr double kDefaultDecodeSlowdownLimit = 2.0;
// No fixed cap on the prefill tokens of a decode step (the time limit bounds
// them).
constexpr int64_t kNoPrefillTokenCap = -1;
// Samples kept per estimate.
constexpr int kDecodeBudgetSamples = 7;
// A decode-only time serves the steps after it until this many steps have
// been observed since it was measured; then a step measures it again (the
// sessions' contexts grow, the machine's load changes). While sessions
// generate without pause, that is one decode-only step per this many.
constexpr int64_t kDecodeEstimateRefreshSteps = 32;

struct DecodeStepBudgetOptions {
  // >= 1; 0 turns the time limit off (then only max_prefill_tokens bounds a
  // decode step's prefill).
  double slowdown_limit = kDefaultDecodeSlowdownLimit;
  // A fixed cap on top of the time limit (--decode_step_prefill_tokens);
  // kNoPrefillTokenCap: none. 0: decode steps carry no prefill (prefill then
  // moves only while no generated token is waiting).
  int64_t max_prefill_tokens = kNoPrefillTokenCap;
};

class DecodeStepBudget {
 public:
  // What PrefillTokens returns when nothing bounds the step's prefill (no
  // time limit, no cap): the scheduler's budget then bounds it.
  static constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

  explicit DecodeStepBudget(DecodeStepBudgetOptions options);

  // Prefill tokens the next step, carrying `decode_tokens` (>= 1) generated
  // tokens, may take.
  int64_t PrefillTokens(int64_t decode_tokens) const;

  // Prefill tokens of a step formed while `generating_sessions` (>= 1)
  // sessions generate but none of their tokens is waiting (a handler was
  // late to send its next one, server/scheduler.h): what a decode step of
  // that many tokens would take (1 until it is measured; the fixed cap does
  // not apply, the step carries no generated token). A token that arrives
  // while this step runs waits about (slowdown_limit - 1) x a decode step
  // for it, instead of a whole prefill step.
  int64_t GapPrefillTokens(int64_t generating_sessions) const;

  // A step ran: `decode_tokens` generated and `prefill_tokens` prompt tokens
  // in `seconds`.
  void Observe(int64_t decode_tokens, int64_t prefill_tokens, double seconds);

  // The current estimates (for tests and the docs' arithmetic): the
  // decode-only time PrefillTokens uses for `decode_tokens` (nullopt: none
  // fresh), and the time per prefill token of a decode step.
  std::optional<double> DecodeSeconds(int64_t decode_tokens) const;
  std::optional<double> PrefillSecondsPerToken() const;

 private:
  struct DecodeSamples {
    std::deque<double> seconds;  // newest last
    int64_t measured_at = 0;     // steps_ observed when the newest was taken
  };
  struct PrefillSample {
    double seconds_per_token;
    int64_t tokens;
    bool within_limit;  // the step took at most slowdown_limit x decode_seconds
  };
  // The time limit's arithmetic for a step of `decode_tokens` generated
  // tokens (at least 1); nullopt: no decode time measured.
  std::optional<int64_t> TokensWithinLimit(int64_t decode_tokens) const;
  // The key of decode_ whose samples estimate `decode_tokens`; nullopt: none
  // fresh.
  std::optional<int64_t> FreshDecodeKey(int64_t decode_tokens) const;
  static void Push(std::deque<double>& samples, double seconds);

  const DecodeStepBudgetOptions options_;
  int64_t steps_ = 0;  // steps observed
  std::map<int64_t, DecodeSamples> decode_;  // by decode tokens of the step
  std::deque<PrefillSample> prefill_;        // newest last
};

}  // namespace drt::server
