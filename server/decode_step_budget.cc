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

std::optional<double> DecodeStepBudget::DecodeSeconds(int64_t decode_tokens) const {
  // The largest batch size measured that is not larger than this one.
  auto it = decode_.upper_bound(decode_tokens);
  if (it == decode_.begin()) return std::nullopt;
  --it;
  if (steps_ - it->second.measured_at >= kDecodeEstimateRefreshSteps) return std::nullopt;
  return Median({it->second.seconds.begin(), it->second.seconds.end()});
}

std::optional<double> DecodeStepBudget::PrefillSecondsPerToken() const {
  if (prefill_.empty()) return std::nullopt;
  std::vector<double> values;
  for (const PrefillSample& s : prefill_) values.push_back(s.seconds_per_token);
  return Median(std::move(values));
}

int64_t DecodeStepBudget::PrefillTokens(int64_t decode_tokens) const {
  const int64_t cap = options_.max_prefill_tokens == kNoPrefillTokenCap
                          ? kUnbounded
                          : options_.max_prefill_tokens;
  if (options_.slowdown_limit == 0 || cap == 0) return cap;

  const std::optional<double> decode = DecodeSeconds(decode_tokens);
  if (!decode.has_value()) return 0;  // a decode-only step measures it

  // Not beyond twice what was measured (plus one: the first sample is taken
  // with one token).
  int64_t measured = 0;
  for (const PrefillSample& s : prefill_) measured = std::max(measured, s.tokens);
  int64_t tokens = 2 * measured + 1;
  const std::optional<double> per_token = PrefillSecondsPerToken();
  if (per_token.has_value() && *per_token > 0) {
    const double fitting = (options_.slowdown_limit - 1) * *decode / *per_token;
    if (fitting < static_cast<double>(tokens)) tokens = static_cast<int64_t>(std::floor(fitting));
  }
  // At least one: prefill moves even when one token costs more than the
  // limit allows.
  return std::min(cap, std::max<int64_t>(1, tokens));
}

void DecodeStepBudget::Observe(int64_t decode_tokens, int64_t prefill_tokens, double seconds) {
  if (decode_tokens > 0 && prefill_tokens == 0) {
    DecodeSamples& samples = decode_[decode_tokens];
    samples.seconds.push_back(seconds);
    if (samples.seconds.size() > kDecodeBudgetSamples) samples.seconds.pop_front();
    samples.measured_at = steps_;
  } else if (decode_tokens > 0 && prefill_tokens > 0) {
    if (const std::optional<double> decode = DecodeSeconds(decode_tokens); decode.has_value()) {
      // Noise can make a step faster than the decode-only median: no
      // negative costs.
      prefill_.push_back({std::max(0.0, seconds - *decode) / static_cast<double>(prefill_tokens),
                          prefill_tokens});
      if (prefill_.size() > kDecodeBudgetSamples) prefill_.pop_front();
    }
  }
  ++steps_;
}

}  // namespace drt::server
