#include "server/decode_step_budget.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

namespace drt::server {
namespace {

// The middle value; the mean of the two middle ones for an even count.
double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

}  // namespace

DecodeStepBudget::DecodeStepBudget(DecodeStepBudgetOptions options) : options_(options) {}

std::optional<int64_t> DecodeStepBudget::DecodeKey(int64_t decode_tokens) const {
  // The largest batch size measured, not larger than this one, whose time is
  // fresh: a smaller batch is not slower, so its time keeps the allowance
  // conservative. Keys are batch sizes seen, so few (at most the sessions).
  std::optional<int64_t> largest;  // the largest not larger, fresh or not
  for (auto it = std::make_reverse_iterator(decode_.upper_bound(decode_tokens));
       it != decode_.rend(); ++it) {
    if (steps_ - it->second.measured_at < kDecodeEstimateRefreshSteps) return it->first;
    if (!largest.has_value()) largest = it->first;
  }
  // None measured at or below it: this step measures it. All stale: one
  // step measures again, at most once per kDecodeEstimateRefreshSteps steps
  // whatever the batch sizes; until then the stale time serves. (Each size
  // aging on its own would probe once per size every so many steps: with 16
  // sizes varying step by step, a third of the decode steps ran without
  // prefill; review of the scheduler, finding 2.)
  if (!largest.has_value() || !last_measured_.has_value() ||
      steps_ - *last_measured_ >= kDecodeEstimateRefreshSteps) {
    return std::nullopt;
  }
  // A stale time older than kDecodeEstimateMaxAgeSteps is measured again
  // whatever the global rate: the rate's probes measure whatever size their
  // step has, so a size that never has the step when one is due (64 and
  // 100 alternating, 100 taking every probe) would serve its old time for
  // as long as it runs. One taken while the machine was loaded overstates
  // the decode time, and a mixed step sized from it runs past the limit
  // without ever running faster than it to lower it (review of schedfix,
  // S2).
  if (steps_ - decode_.at(*largest).measured_at >= kDecodeEstimateMaxAgeSteps) {
    return std::nullopt;
  }
  return largest;
}

std::optional<double> DecodeStepBudget::DecodeSeconds(int64_t decode_tokens) const {
  const std::optional<int64_t> key = DecodeKey(decode_tokens);
  if (!key.has_value()) return std::nullopt;
  const std::deque<double>& seconds = decode_.at(*key).seconds;
  return *std::min_element(seconds.begin(), seconds.end());
}

std::optional<double> DecodeStepBudget::PrefillSecondsPerToken(PrefillRate rate) const {
  const std::deque<PrefillSample>& samples = Samples(rate);
  if (samples.empty()) return std::nullopt;
  std::vector<double> values;
  for (const PrefillSample& s : samples) values.push_back(s.seconds_per_token);
  return Median(std::move(values));
}

int64_t DecodeStepBudget::GrowthBound(PrefillRate rate) const {
  // Not beyond twice what a step within the limit carried (plus one: the
  // first sample is taken with one token).
  int64_t measured = 0;
  for (const PrefillSample& s : Samples(rate)) {
    if (s.within_limit) measured = std::max(measured, s.tokens);
  }
  return 2 * measured + 1;
}

std::optional<int64_t> DecodeStepBudget::TokensWithinLimit(int64_t decode_tokens,
                                                           PrefillRate rate) const {
  const std::optional<double> decode = DecodeSeconds(decode_tokens);
  if (!decode.has_value()) return std::nullopt;
  int64_t tokens = GrowthBound(rate);
  const std::optional<double> per_token = PrefillSecondsPerToken(rate);
  if (per_token.has_value() && *per_token > 0) {
    const double fitting = (options_.slowdown_limit - 1) * *decode / *per_token;
    if (fitting < static_cast<double>(tokens)) tokens = static_cast<int64_t>(std::floor(fitting));
  }
  // At least one: prefill moves even when one token costs more than the
  // limit allows.
  return std::max<int64_t>(1, tokens);
}

int64_t DecodeStepBudget::PrefillTokens(int64_t decode_tokens, PrefillRate rate) const {
  const int64_t cap = options_.max_prefill_tokens == kNoPrefillTokenCap
                          ? kUnbounded
                          : options_.max_prefill_tokens;
  if (options_.slowdown_limit == 0 || cap == 0) return cap;
  // None: a decode-only step measures the decode time.
  return std::min(cap, TokensWithinLimit(decode_tokens, rate).value_or(0));
}

int64_t DecodeStepBudget::GapPrefillTokens(int64_t generating_sessions, PrefillRate rate) const {
  if (options_.slowdown_limit == 0) return kUnbounded;
  return TokensWithinLimit(generating_sessions, rate).value_or(1);
}

bool DecodeStepBudget::Fits(int64_t decode_tokens, int64_t full, int64_t lower_only) const {
  if (options_.slowdown_limit == 0) return true;
  if (full + lower_only == 0) return true;
  const std::optional<double> decode = DecodeSeconds(decode_tokens);
  if (!decode.has_value()) return false;
  if (full > GrowthBound(PrefillRate::kFull) ||
      lower_only > GrowthBound(PrefillRate::kLowerOnly)) {
    return false;
  }
  const double predicted =
      *decode +
      static_cast<double>(full) * PrefillSecondsPerToken(PrefillRate::kFull).value_or(0) +
      static_cast<double>(lower_only) *
          PrefillSecondsPerToken(PrefillRate::kLowerOnly).value_or(0);
  return predicted <= options_.slowdown_limit * *decode;
}

void DecodeStepBudget::PushPrefill(PrefillRate rate, PrefillSample sample) {
  std::deque<PrefillSample>& samples = rate == PrefillRate::kFull ? full_ : lower_only_;
  samples.push_back(sample);
  if (samples.size() > kDecodeBudgetSamples) samples.pop_front();
}

void DecodeStepBudget::Observe(int64_t decode_tokens, int64_t full, int64_t lower_only,
                               double seconds) {
  const int64_t prefill_tokens = full + lower_only;
  if (decode_tokens > 0 && prefill_tokens == 0) {
    DecodeSamples& samples = decode_[decode_tokens];
    Push(samples.seconds, seconds);
    samples.measured_at = steps_;
    last_measured_ = steps_;
  } else if (decode_tokens > 0 && prefill_tokens > 0) {
    if (const std::optional<int64_t> key = DecodeKey(decode_tokens); key.has_value()) {
      double decode = *DecodeSeconds(decode_tokens);
      if (seconds < decode) {
        // The decode part took at most this long: the estimate was taken
        // while the machine was slower. Without this, every prefill token
        // would look free until the next decode-only step.
        Push(decode_.at(*key).seconds, seconds);
        decode = seconds;
      }
      const double excess = seconds - decode;
      const bool within_limit = seconds <= options_.slowdown_limit * decode;
      const double f = static_cast<double>(full), l = static_cast<double>(lower_only);
      if (lower_only == 0) {
        PushPrefill(PrefillRate::kFull, {excess / f, full, within_limit});
      } else if (full == 0) {
        PushPrefill(PrefillRate::kLowerOnly, {excess / l, lower_only, within_limit});
      } else {
        // Both kinds: split the excess (see the header).
        const std::optional<double> full_rate = PrefillSecondsPerToken(PrefillRate::kFull);
        const std::optional<double> lower_rate =
            PrefillSecondsPerToken(PrefillRate::kLowerOnly);
        if (full_rate.has_value() && lower_rate.has_value() &&
            f * *full_rate + l * *lower_rate > 0) {
          const double scale = excess / (f * *full_rate + l * *lower_rate);
          PushPrefill(PrefillRate::kFull, {*full_rate * scale, full, within_limit});
          PushPrefill(PrefillRate::kLowerOnly, {*lower_rate * scale, lower_only, within_limit});
        } else if (lower_rate.has_value()) {
          PushPrefill(PrefillRate::kFull,
                      {std::max(0.0, excess - l * *lower_rate) / f, full, within_limit});
        } else if (full_rate.has_value()) {
          PushPrefill(PrefillRate::kLowerOnly,
                      {std::max(0.0, excess - f * *full_rate) / l, lower_only, within_limit});
        } else {
          PushPrefill(PrefillRate::kLowerOnly, {excess / (f + l), lower_only, within_limit});
        }
      }
    }
  }
  ++steps_;
}

void DecodeStepBudget::Push(std::deque<double>& samples, double seconds) {
  samples.push_back(seconds);
  if (samples.size() > kDecodeBudgetSamples) samples.pop_front();
}

}  // namespace drt::server
