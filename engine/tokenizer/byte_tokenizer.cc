// MakeByteTokenizer: ids 0..255 are the bytes themselves.
#include "absl/strings/str_format.h"
#include "engine/tokenizer/added_token_splitter.h"
#include "engine/tokenizer/stream_cut.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int32_t eos_id) : eos_id_(eos_id) {}

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char b : text) ids.push_back(b);
    return ids;
  }

  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    std::string bytes;
    bytes.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) {
        bytes.push_back(static_cast<char>(id));
      } else if (id != eos_id_) {  // end-of-text decodes to nothing
        return absl::InvalidArgumentError(
            absl::StrFormat("byte tokenizer: token id %d is not a byte (0..255)", id));
      }
    }
    return bytes;
  }

  int32_t vocab_size() const override { return eos_id_ >= 256 ? eos_id_ + 1 : 256; }
  int32_t eos_id() const override { return eos_id_; }
  bool one_id_per_byte() const override { return true; }
  // Ids are bytes, so any cut would do; cutting where the BPE tokenizer does
  // keeps the two streaming alike (a partial UTF-8 character waits).
  size_t StreamCut(std::string_view text) const override {
    return FindStreamCut(text, no_added_tokens_, /*add_prefix_space=*/false);
  }

 private:
  const int32_t eos_id_;
  const AddedTokenSplitter no_added_tokens_{{}};
};

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer(int32_t eos_id) {
  return std::make_unique<ByteTokenizer>(eos_id);
}

}  // namespace drt
