// GPT-2's pre-tokenizer: splits text into the pieces that BPE then merges
// within, using the regex of Hugging Face's ByteLevel pre-tokenizer.
#pragma once

#include <memory>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct pcre2_real_code_8;

namespace drt {

class Gpt2PreTokenizer {
 public:
  static absl::StatusOr<Gpt2PreTokenizer> Create();

  // Calls `on_piece` with consecutive pieces that together cover `text`.
  // Bytes that are not valid UTF-8 (which Hugging Face never sees, since its
  // input is a Rust String) come out as pieces of their own.
  absl::Status Split(std::string_view text,
                     absl::FunctionRef<void(std::string_view)> on_piece) const;

 private:
  struct CodeDeleter {
    void operator()(pcre2_real_code_8* code) const;
  };
  explicit Gpt2PreTokenizer(pcre2_real_code_8* code) : code_(code) {}

  std::unique_ptr<pcre2_real_code_8, CodeDeleter> code_;
};

}  // namespace drt
