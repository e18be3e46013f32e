// Utf8Streamer (declared in tokenizer.h).
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace drt {

std::string Utf8Streamer::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string complete;
  complete.reserve(pending_.size());
  size_t pos = 0;
  while (pos < pending_.size()) {
    const Utf8Char c = ReadUtf8Char(std::string_view(pending_).substr(pos));
    if (c.kind == Utf8Char::Kind::kTruncated) break;  // wait for more bytes
    if (c.kind == Utf8Char::Kind::kValid) {
      complete.append(pending_, pos, c.length);
    } else {
      complete.append(kReplacementCharacter);
    }
    pos += c.length;
  }
  pending_.erase(0, pos);
  return complete;
}

std::string Utf8Streamer::Flush() {
  // Only a truncated (otherwise well-formed) character can be pending.
  std::string rest = pending_.empty() ? "" : std::string(kReplacementCharacter);
  pending_.clear();
  return rest;
}

}  // namespace drt
