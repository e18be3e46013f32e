// Text <-> token ids. Implementations: GPT-2 byte-level BPE read from a
// Hugging Face tokenizer.json, and a plain byte-level tokenizer (id = byte).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace drt {

// A tokenizer.json's end-of-text token: the first of these spellings it
// knows (LoadBpeTokenizer). The OpenAI API's /tokenizer_info names the one
// that encodes to the model's eos id.
inline constexpr std::array<std::string_view, 3> kEosSpellings = {"<|endoftext|>", "</s>",
                                                                  "<|end_of_text|>"};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes UTF-8 text. Special tokens written literally in the text (e.g.
  // "<|endoftext|>") map to their ids, as the Hugging Face tokenizer does.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const = 0;
  // Decodes ids to raw bytes; the result may end inside a UTF-8 character when
  // the ids split one (see Utf8Streamer). Unknown ids are an error.
  virtual absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const = 0;
  // Number of ids the tokenizer can produce.
  virtual int32_t vocab_size() const = 0;
  // The end-of-text id, or -1.
  virtual int32_t eos_id() const = 0;
  // True when text encodes to one id per byte, id = byte value (the byte
  // tokenizer, or a tokenizer.json with the 256 bytes as ids 0..255, no
  // merges and no added token that text can spell): clients can then count
  // tokens as bytes.
  virtual bool one_id_per_byte() const = 0;
  // For text arriving in pieces (StreamingEncoder): the length n of the
  // longest prefix known to be final, i.e. Encode(text[0, n)) followed by the
  // ids of text[n, end) plus whatever comes next equals Encode of the whole;
  // 0 when no such prefix is known yet (docs/tokenizer.md, "Streamed text").
  virtual size_t StreamCut(std::string_view text) const = 0;
};

// Incremental decoding that never emits half a UTF-8 character: bytes of an
// incomplete trailing character are held back until the next piece completes
// them. Invalid sequences are passed through as U+FFFD.
class Utf8Streamer {
 public:
  // Appends decoded bytes; returns the text that is complete so far.
  std::string Push(std::string_view bytes);
  // Returns whatever is held back (as U+FFFD if incomplete) and resets.
  std::string Flush();

 private:
  std::string pending_;
};

// Reads a Hugging Face tokenizer.json of model type BPE with a ByteLevel
// pre-tokenizer (GPT-2 style).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& path);
// Byte-level tokenizer: ids 0..255 are bytes; eos_id may be -1.
std::unique_ptr<Tokenizer> MakeByteTokenizer(int32_t eos_id = -1);

}  // namespace drt
