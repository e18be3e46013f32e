// Random streams of the retrieval evaluators (drt-niah, drt-niah-text), one
// per cell: a cell's haystacks and keys come from (seed, task, length, depth)
// alone, and trial t's from (the cell's seed, t). So a cell re-run alone, or
// in a grid extended by more lengths, depths or tasks, gets the same trials,
// and two commands' cells can be compared cell by cell (review-tools
// 2026-11-25 #4: one stream ran through the whole command, so a cell's keys
// depended on which cells ran before it). lm-evaluation-harness and RULER
// seed per sample the same way.
#pragma once

#include <cstdint>
#include <string_view>

namespace drt::niah {

// SplitMix64's output for state `x` (Steele, Lea and Flood 2014): a
// bijective 64-bit mixer.
uint64_t Mix64(uint64_t x);

// The seed of one (task, length, depth) cell of a run with --seed `seed`.
// `depth` counts by value (0.5 and 0.50 are one cell).
uint64_t CellSeed(uint64_t seed, std::string_view task, int64_t length, double depth);

// The seed of trial `trial` of the cell whose seed is `cell_seed`.
uint64_t TrialSeed(uint64_t cell_seed, int64_t trial);

// The name the JSON results give this scheme ("key_stream"), so that files
// of the old whole-command stream (no such field) are told apart.
inline constexpr std::string_view kKeyStream = "per_cell";

}  // namespace drt::niah
