// LoadBpeTokenizer for a model's text input: the added tokens whose ids only
// the engine may insert (a model's pad and landmark ids) are not matched in
// text, so their spelling ("<|pad|>", "<|chunk|>") encodes as the plain text
// it is. A client's text then never turns into ids that the engine refuses
// (docs/tokenizer.md, "Ids text never gives").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt {

// As LoadBpeTokenizer, except that added tokens whose id is in
// `not_in_text` are left out of the added-token split (they still decode to
// their content).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizerForText(
    const std::string& path, const std::vector<int32_t>& not_in_text);

}  // namespace drt
