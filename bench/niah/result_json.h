// The JSON drt-niah and drt-niah-text write (--json): the run's settings,
// one object per cell (each tool adds its own cell fields) and every trial,
// for paired comparisons across runs. Written after every cell.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace drt::niah {

// One trial as the JSON records it.
struct TrialRecord {
  std::string key;     // the answer the question asks for (the pass key)
  std::string answer;  // the generated text (the tokenizer's decoding)
  bool correct = false;
  int64_t needle_offset = 0;  // filler (tokens or bytes, the tool's unit) before the needle
};

// What a run was made with, beside its cells.
struct RunSettings {
  std::string model;
  bool pad_to_chunk_boundary = false;
  uint64_t seed = 0;
  std::string device;
  std::string precision;
  int64_t threads = 0;  // the --threads flag (0: the CPUs this process may use)
  int64_t max_new_tokens = 0;
};

// The settings' fields, the key stream and scoring rule, `complete` (false
// while cells are still to run) and an empty "cells" array.
nlohmann::json RunJson(const RunSettings& settings, bool complete);

// The trials' records: key, answer, the first number in it, correct,
// needle_offset.
nlohmann::json TrialRecordsJson(const std::vector<TrialRecord>& records);

// Writes `out` to `path` replacing it in one step (WriteFileReplacing); a
// generated answer's bytes that are not UTF-8 become U+FFFD (dump would
// throw).
absl::Status WriteRunJson(const std::string& path, const nlohmann::json& out);

}  // namespace drt::niah
