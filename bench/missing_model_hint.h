// What drt-bench and drt-step-bench add to a model-load error when --model
// names no directory: their default was build/models/drt-random-gpt2, which
// a build does not make, so a plain `drt-bench` failed with only "does not
// exist" (review-tools 2026-11-25 #9). Says where relative paths start and
// how to make the random model.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

namespace drt::bench {

inline std::string MissingModelHint(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return "";
  return "\n  (--model is relative to the working directory; the checkout's bundled models are "
         "models/drt-text-byte, the default, and models/drt-passkey-byte. A random model with the "
         "GPT-2 vocabulary, from the repository root: /usr/bin/python3 "
         "weights_tools/make_random_model.py --out build/models/drt-random-gpt2 --tokenizer "
         "tests/fixtures/gpt2-tokenizer/tokenizer.json, or MODEL=random bash scripts/run_main.sh)";
}

}  // namespace drt::bench
