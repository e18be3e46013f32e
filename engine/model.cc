#include "engine/model.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/bpe_tokenizer_for_text.h"

namespace drt {

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir) {
  auto loaded = LoadModelDir(dir);
  if (!loaded.ok()) return loaded.status();
  auto model = std::make_unique<Model>();
  model->loaded = *std::move(loaded);
  const ModelConfig& config = model->loaded.config;
  if (model->loaded.files.tokenizer_path) {
    // Text never gives the pad or landmark id (only the engine inserts
    // them, and it refuses them as input): their spellings are plain text.
    auto tokenizer = LoadBpeTokenizerForText(
        *model->loaded.files.tokenizer_path,
        {static_cast<int32_t>(config.pad_id), static_cast<int32_t>(config.chunk_id)});
    if (!tokenizer.ok()) return tokenizer.status();
    if ((*tokenizer)->vocab_size() > config.vocab_size) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: tokenizer has %d ids but the model's vocab_size is %d",
          *model->loaded.files.tokenizer_path, (*tokenizer)->vocab_size(), config.vocab_size));
    }
    model->tokenizer = *std::move(tokenizer);
  } else {
    if (config.vocab_size < 256) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s has no tokenizer.json and vocab_size %d is too small for the byte tokenizer",
          dir, config.vocab_size));
    }
    model->tokenizer = MakeByteTokenizer();
  }
  auto generation = LoadGenerationDefaults(dir);
  if (!generation.ok()) return generation.status();
  model->generation = *generation;
  return model;
}

}  // namespace drt
