#include "bench/perplexity/token_bytes.h"

namespace drt::ppl {

absl::StatusOr<TokenBytes> CountTokenBytes(const Tokenizer& tokenizer,
                                           const std::vector<int32_t>& tokens, int32_t vocab_size) {
  TokenBytes out;
  out.per_id.assign(static_cast<size_t>(vocab_size > 0 ? vocab_size : 0), -1);
  for (int32_t id : tokens) {
    if (id < 0 || id >= static_cast<int32_t>(out.per_id.size())) continue;
    if (out.per_id[id] < 0) {
      auto decoded = tokenizer.Decode({id});
      if (!decoded.ok()) return decoded.status();
      out.per_id[id] = static_cast<int32_t>(decoded->size());
    }
    out.total += out.per_id[id];
  }
  return out;
}

}  // namespace drt::ppl
