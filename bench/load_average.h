// The machine's load average, printed by the benchmarks beside their
// timings: they share the CPU with whatever else runs here.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace drt::bench {

// The 1-, 5- and 15-minute load averages in the first three fields of a
// /proc/loadavg line ("0.52 0.58 0.59 1/467 1234"); NaN for each field that
// is missing or not a number.
std::array<double, 3> ParseLoadAverage(std::string_view line);

// ParseLoadAverage of this machine's /proc/loadavg (all NaN if unreadable).
std::array<double, 3> LoadAverage();

// The three load averages as "0.52 0.58 0.59", or "unknown" when
// /proc/loadavg cannot be read.
std::string LoadAverageText();

}  // namespace drt::bench
