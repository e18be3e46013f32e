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
//     while the machine was slower). A step of n uses the largest batch
//     size measured at or below n whose time is fresh (measured within the
//     last kDecodeEstimateRefreshSteps steps): a smaller batch is not
//     slower, so the allowance stays conservative. None measured at or
//     below n gives 0 prefill tokens: that step runs decode-only and
//     measures n (a probe). All of them stale gives a probe too, but at
//     most one per kDecodeEstimateRefreshSteps steps whatever the batch
//     sizes (a global rate); until one is due the largest stale one serves,
//     but not once it is kDecodeEstimateMaxAgeSteps old: then the step
//     probes, rate or not, so no size serves whose newest measurement is older
//     than that. (The time served is still the fastest of its recent
//     samples, so a lower, older one can outlive the probe: an underestimate,
//     which only narrows the allowance, as stalls do not raise it.) (A rate per
//     batch size made a third of the decode steps probes when 16 sizes
//     alternated; the global rate alone let a size whose steps never came
//     when a probe was due serve one time for good.)
//   - prefill_seconds_per_token, learned separately for the two kinds of
//     prefill token (PrefillRate): a full one runs every layer, a
//     lower-only one (its rows lie more than the upper-layer reach before
//     the end of its item, engine/batch_step.h) only the lower layers, about
//     a quarter to a third of the cost on the CPU (docs/batching.md,
//     "Lower-only slices in mixed steps"). Each is the median over the
//     recent steps that carried decode and that kind of
//     (seconds - decode_seconds(n)) / p, so one stalled step does not move
//     it. A step that carried both kinds splits its excess time between
//     them in the ratio of the current estimates (only one known: the other
//     gets the rest; neither: the lower-only rate gets the blend, which is
//     not below it, and the full rate stays unknown). One blended rate would
//     settle at the cheap rate through the long lower-only stretch of a
//     message and then let its last reach of full tokens run several times
//     past the limit (review of the mixed lower-only change, finding 1).
//     It is measured at the piece sizes decode steps actually take, so the
//     fixed cost of adding any prefill to a decode step is in it.
//     Prefill-only steps (large pieces, cheaper per token) are not used.
// The scheduler predicts a step from both: it asks for the allowance of
// lower-only tokens, and keeps that step only if its pieces are all
// predicted lower-only (Fits); otherwise it takes the full tokens'
// allowance.
// The allowance of each kind grows at most to 2p + 1 for the largest p of
// that kind that a recent step carried within the limit: a cost measured on
// small pieces is not extrapolated to much larger ones at once, and a step
// that broke the limit is not grown from.
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
// A decode-only time is fresh until this many steps have been observed since
// it was measured; then a step measures again (the sessions' contexts grow,
// the machine's load changes), at most one per this many steps whatever the
// batch sizes. While sessions generate without pause, that is one
// decode-only step per this many.
constexpr int64_t kDecodeEstimateRefreshSteps = 32;
// A stale decode-only time serves (until the global rate's next measurement
// is due) only while it is younger than this many steps: older, the step
// measures its size, rate or not. So every size that serves was last measured
// within this many steps, whatever the order of the batch sizes (its time,
// the fastest of its recent samples, may be an older, lower one: an
// underestimate, the safe side); each size
// adds at most one measurement per this many steps beyond the rate, and
// only while no fresh time of a smaller size serves it.
constexpr int64_t kDecodeEstimateMaxAgeSteps = 8 * kDecodeEstimateRefreshSteps;

// The two kinds of prefill token a decode step carries (see above).
enum class PrefillRate { kFull, kLowerOnly };

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

  // Prefill tokens of kind `rate` the next step, carrying `decode_tokens`
  // (>= 1) generated tokens, may take.
  int64_t PrefillTokens(int64_t decode_tokens, PrefillRate rate = PrefillRate::kFull) const;

  // Prefill tokens of a step formed while `generating_sessions` (>= 1)
  // sessions generate but none of their tokens is waiting (a handler was
  // late to send its next one, server/scheduler.h): what a decode step of
  // that many tokens would take (1 until it is measured; the fixed cap does
  // not apply, the step carries no generated token). A token that arrives
  // while this step runs waits for it about slowdown_limit x a decode step
  // (its prefill is the (slowdown_limit - 1) x share, and the forward's
  // fixed cost, most of a decode step on the CPU, comes on top), instead of
  // a whole prefill step; then it runs in the next step.
  int64_t GapPrefillTokens(int64_t generating_sessions,
                           PrefillRate rate = PrefillRate::kFull) const;

  // Whether a step of `decode_tokens` generated tokens (for a gap step: the
  // generating sessions) with `full` and `lower_only` prefill tokens is
  // predicted within the limit: neither kind beyond its growth bound, and
  // decode_seconds + full x full rate + lower_only x lower-only rate within
  // slowdown_limit x decode_seconds (a rate not yet measured counts 0; the
  // growth bound then holds it to one token). True without a time limit.
  bool Fits(int64_t decode_tokens, int64_t full, int64_t lower_only) const;

  // A step ran: `decode_tokens` generated, `full` prompt tokens that ran
  // every layer and `lower_only` ones that ran only the lower layers, in
  // `seconds`.
  void Observe(int64_t decode_tokens, int64_t full, int64_t lower_only, double seconds);
  // The same with every prefill token a full one.
  void Observe(int64_t decode_tokens, int64_t prefill_tokens, double seconds) {
    Observe(decode_tokens, prefill_tokens, 0, seconds);
  }

  // The current estimates (for tests and the docs' arithmetic): the
  // decode-only time PrefillTokens uses for `decode_tokens` (nullopt: the
  // step measures it, a probe), and the time per prefill token of kind `rate` in a decode step.
  std::optional<double> DecodeSeconds(int64_t decode_tokens) const;
  std::optional<double> PrefillSecondsPerToken(PrefillRate rate = PrefillRate::kFull) const;

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
  std::optional<int64_t> TokensWithinLimit(int64_t decode_tokens, PrefillRate rate) const;
  // 2p + 1 for the largest p of kind `rate` a recent step carried within
  // the limit.
  int64_t GrowthBound(PrefillRate rate) const;
  const std::deque<PrefillSample>& Samples(PrefillRate rate) const {
    return rate == PrefillRate::kFull ? full_ : lower_only_;
  }
  void PushPrefill(PrefillRate rate, PrefillSample sample);
  // The key of decode_ whose samples estimate `decode_tokens`; nullopt: the
  // step measures it (a probe; see the top of the file).
  std::optional<int64_t> DecodeKey(int64_t decode_tokens) const;
  static void Push(std::deque<double>& samples, double seconds);

  const DecodeStepBudgetOptions options_;
  int64_t steps_ = 0;  // steps observed
  std::map<int64_t, DecodeSamples> decode_;  // by decode tokens of the step
  std::optional<int64_t> last_measured_;     // steps_ at the last decode-only step
  std::deque<PrefillSample> full_;           // newest last
  std::deque<PrefillSample> lower_only_;     // newest last
};

}  // namespace drt::server
