#include "server/decode_step_budget.h"

#include <algorithm>
#include <cmath>
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

std::optional<int64_t> DecodeStepBudget::FreshDecodeKey(int64_t decode_tokens) const {
  // The largest batch size measured that is not larger than this one.
  auto it = decode_.upper_bound(decode_tokens);
  if (it == decode_.begin()) return std::nullopt;
  --it;
  if (steps_ - it->second.measured_at >= kDecodeEstimateRefreshSteps) return std::nullopt;
  return it->first;
}

std::optional<double> DecodeStepBudget::DecodeSeconds(int64_t decode_tokens) const {
  const std::optional<int64_t> key = FreshDecodeKey(decode_tokens);
  if (!key.has_value()) return std::nullopt;
  const std::deque<double>& seconds = decode_.at(*key).seconds;
  return *std::min_element(seconds.begin(), seconds.end());
}

std::optional<double> DecodeStepBudget::PrefillSecondsPerToken() const {
  if (prefill_.empty()) return std::nullopt;
  std::vector<double> values;
  for (const PrefillSample& s : prefill_) values.push_back(s.seconds_per_token);
  return Median(std::move(values));
}

std::optional<int64_t> DecodeStepBudget::TokensWithinLimit(int64_t decode_tokens) const {
  const std::optional<double> decode = DecodeSeconds(decode_tokens);
  if (!decode.has_value()) return std::nullopt;
  // Not beyond twice what a step within the limit carried (plus one: the
  // first sample is taken with one token).
  int64_t measured = 0;
  for (const PrefillSample& s : prefill_) {
    if (s.within_limit) measured = std::max(measured, s.tokens);
  }
  int64_t tokens = 2 * measured + 1;
  const std::optional<double> per_token = PrefillSecondsPerToken();
  if (per_token.has_value() && *per_token > 0) {
    const double fitting = (options_.slowdown_limit - 1) * *decode / *per_token;
    if (fitting < static_cast<double>(tokens)) tokens = static_cast<int64_t>(std::floor(fitting));
  }
  // At least one: prefill moves even when one token costs more than the
  // limit allows.
  return std::max<int64_t>(1, tokens);
}

int64_t DecodeStepBudget::PrefillTokens(int64_t decode_tokens) const {
  const int64_t cap = options_.max_prefill_tokens == kNoPrefillTokenCap
                          ? kUnbounded
                          : options_.max_prefill_tokens;
  if (options_.slowdown_limit == 0 || cap == 0) return cap;
  // None: a decode-only step measures the decode time.
  return std::min(cap, TokensWithinLimit(decode_tokens).value_or(0));
}

int64_t DecodeStepBudget::GapPrefillTokens(int64_t generating_sessions) const {
  if (options_.slowdown_limit == 0) return kUnbounded;
  return TokensWithinLimit(generating_sessions).value_or(1);
}

void DecodeStepBudget::Observe(int64_t decode_tokens, int64_t prefill_tokens, double seconds) {
  if (decode_tokens > 0 && prefill_tokens == 0) {
    DecodeSamples& samples = decode_[decode_tokens];
    Push(samples.seconds, seconds);
    samples.measured_at = steps_;
  } else if (decode_tokens > 0 && prefill_tokens > 0) {
    if (const std::optional<int64_t> key = FreshDecodeKey(decode_tokens); key.has_value()) {
      double decode = *DecodeSeconds(decode_tokens);
      if (seconds < decode) {
        // The decode part took at most this long: the estimate was taken
        // while the machine was slower. Without this, every prefill token
        // would look free until the next decode-only step.
        Push(decode_.at(*key).seconds, seconds);
        decode = seconds;
      }
      prefill_.push_back({(seconds - decode) / static_cast<double>(prefill_tokens),
                          prefill_tokens, seconds <= options_.slowdown_limit * decode});
      if (prefill_.size() > kDecodeBudgetSamples) prefill_.pop_front();
    }
  }
  ++steps_;
}

void DecodeStepBudget::Push(std::deque<double>& samples, double seconds) {
  samples.push_back(seconds);
  if (samples.size() > kDecodeBudgetSamples) samples.pop_front();
}

}  // namespace drt::server
