#include "bench/batch/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace drt::bench {

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(below);
  return values[below] + frac * (values[above] - values[below]);
}

std::vector<double> TokenGapsMs(const std::vector<PieceArrival>& arrivals) {
  std::vector<double> gaps;
  bool seen_first = false;
  double previous = 0;
  for (const PieceArrival& a : arrivals) {
    if (a.tokens <= 0) continue;
    if (seen_first) {
      const double each = 1000.0 * (a.seconds - previous) / static_cast<double>(a.tokens);
      gaps.insert(gaps.end(), static_cast<size_t>(a.tokens), each);
    } else if (a.tokens > 1) {
      // The first piece's extra tokens came with the first token: zero gaps.
      gaps.insert(gaps.end(), static_cast<size_t>(a.tokens - 1), 0.0);
    }
    seen_first = true;
    previous = a.seconds;
  }
  return gaps;
}

}  // namespace drt::bench
