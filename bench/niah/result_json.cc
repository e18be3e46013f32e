#include "bench/niah/result_json.h"

#include "bench/niah/cell_seed.h"
#include "bench/niah/passkey_haystack.h"
#include "bench/perplexity/output_file.h"

namespace drt::niah {

nlohmann::json RunJson(const RunSettings& s, bool complete) {
  // nlohmann::json escapes the model path (it was written unescaped).
  return {{"model", s.model},
          {"pad_to_chunk_boundary", s.pad_to_chunk_boundary},
          {"seed", s.seed},
          {"key_stream", kKeyStream},
          {"scoring", kScoringRule},
          {"device", s.device},
          {"precision", s.precision},
          {"threads", s.threads},
          {"max_new_tokens", s.max_new_tokens},
          {"complete", complete},
          {"cells", nlohmann::json::array()}};
}

nlohmann::json TrialRecordsJson(const std::vector<TrialRecord>& records) {
  nlohmann::json out = nlohmann::json::array();
  for (const TrialRecord& r : records) {
    out.push_back({{"key", r.key},
                   {"answer", r.answer},
                   {"answered", FirstNumber(r.answer)},
                   {"correct", r.correct},
                   {"needle_offset", r.needle_offset}});
  }
  return out;
}

absl::Status WriteRunJson(const std::string& path, const nlohmann::json& out) {
  return drt::ppl::WriteFileReplacing(
      "--json", path, out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace drt::niah
