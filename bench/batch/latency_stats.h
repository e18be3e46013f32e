// Order statistics for the benchmarks (bench/ and tools/, one copy:
// review-final2 L7): the median and percentiles of their samples, and for
// drt-batch-bench the per-token gaps of a streamed Generate, from the arrival
// times of its pieces.
#pragma once

#include <cstdint>
#include <vector>

namespace drt::bench {

// The q-th quantile (q in [0, 1]) of `values`, interpolated linearly between
// the two closest ranks (numpy's default, "linear"): rank q * (n - 1) of the
// sorted values. NaN for an empty vector.
double Percentile(std::vector<double> values, double q);

// The middle value; for an even count the mean of the two middle values.
// NaN for an empty vector.
inline double Median(std::vector<double> values) { return Percentile(std::move(values), 0.5); }

// One streamed GeneratedPiece as the client saw it.
struct PieceArrival {
  double seconds = 0;  // since the Generate call was made
  int64_t tokens = 0;  // token ids in the piece
};

// The time per output token, in milliseconds, of every token after the
// first: the time to the first token is not a gap (it is reported apart). A
// piece that brings k tokens a time t after the previous token-bearing piece
// counts as k gaps of t / k each, so that a server that sends several tokens
// in one message is measured per token, as one that sends them one by one.
// Pieces without tokens (text held back for a UTF-8 character) are skipped.
std::vector<double> TokenGapsMs(const std::vector<PieceArrival>& arrivals);

}  // namespace drt::bench
