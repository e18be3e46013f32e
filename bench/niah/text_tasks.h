// Retrieval tasks on filler drawn from real text (drt-niah-text): a passkey
// in the exact format of weights_tools/passkey_data.py or in held-out
// wordings, keyed needles where the question decides which one to fetch, and
// 2-hop variable tracking. Everything is built at the byte level: for the
// byte-level models of models/ one byte is one token.
//
// A haystack of `length` bytes is
//   filler[0, a1) insert1 filler[a1, a2) insert2 ... filler[an, F) "\n" question
// where filler is the text read from a random start offset (wrapping around),
// F = length - inserts - question, and each insert sits right after a space
// or newline so that it never splits a word.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace drt::niah {

enum class TextTask {
  kPasskey,        // passkey_data.py's needle and question, byte for byte
  kPasskeyVaried,  // other needle and question wordings, none of them used in training
  kKeyed,          // three "pass key of the <colour> <thing>" needles; the question names one
  kTwoHop,         // VAR X = N ... VAR Y = VAR X, plus a distractor chain; asks for VAR Y
};

absl::StatusOr<TextTask> ParseTextTask(std::string_view name);
std::string_view TextTaskName(TextTask task);

// The bytes of a text file, or of every regular file of a directory (sorted
// by name, joined by "\n"). Error if nothing readable or under 4 KiB.
absl::StatusOr<std::string> LoadFillerText(const std::string& path);

// How many times a haystack of `length` bytes reads through a filler text
// of `text_bytes` bytes. Above 1 the filler repeats (TextFiller wraps
// around), and the repeated passages give near-identical chunks that compete
// with the needle's chunk in top-k retrieval: such a cell measures length
// and repetition together (drt-niah-text refuses it without --allow_repeat).
double TextRepeats(int64_t length, int64_t text_bytes);

// The filler stream: `text` from byte `start` on, wrapping around.
class TextFiller {
 public:
  TextFiller(const std::string& text, int64_t start) : text_(&text), start_(start) {}
  std::string Bytes(int64_t begin, int64_t end) const;
  // The largest offset <= `offset` right after a space or newline, if one is
  // within 64 bytes; else `offset`.
  int64_t WordBoundary(int64_t offset) const;

 private:
  const std::string* text_;
  int64_t start_;
};

struct Insert {
  int64_t at;  // filler offset (bytes of filler before it)
  std::string text;
};

struct TextTrial {
  std::vector<Insert> inserts;  // sorted by `at`
  std::string question;         // ends where the answer starts
  std::string answer;           // the key the answer must start with
  int64_t target_at = 0;        // `at` of the needle that holds the answer (the one at the depth)
};

// One trial of `task` in a haystack of `length` bytes with the answer's
// needle at `depth` (0 = start, 1 = end of the filler). Keys are 5 digits,
// distinct within a trial. `state` is the random state (advanced).
absl::StatusOr<TextTrial> MakeTextTrial(TextTask task, const TextFiller& filler, int64_t length,
                                        double depth, uint64_t& state);

// Filler bytes of a trial's haystack: length - inserts - question.
int64_t FillerBytes(const TextTrial& trial, int64_t length);

// The whole prompt (for tests and one-shot clients).
std::string AssemblePrompt(const TextFiller& filler, const TextTrial& trial, int64_t length);

// Uniform integer in [0, n), n > 0.
uint64_t RandomBelow(uint64_t& state, uint64_t n);

}  // namespace drt::niah
