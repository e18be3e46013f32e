// LoadBpeTokenizer: GPT-2 style byte-level BPE from a Hugging Face
// tokenizer.json, encoding exactly as the `tokenizers` library does.
#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/added_token_splitter.h"
#include "engine/tokenizer/bpe_tokenizer_for_text.h"
#include "engine/tokenizer/bpe_merges.h"
#include "engine/tokenizer/byte_level_alphabet.h"
#include "engine/tokenizer/gpt2_pretokenizer.h"
#include "engine/tokenizer/stream_cut.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_json.h"
#include "engine/tokenizer/word_cache.h"

namespace drt {
namespace {

// Hugging Face caches only words shorter than this (in characters; bytes
// here), so long words skip the cache there too.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kWordCacheCapacity = 1 << 17;


struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using SpellingToId = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Everything a BpeTokenizer looks up, resolved from the tokenizer.json.
struct BpeTables {
  std::string path;  // for error messages
  SpellingToId vocab;
  BpeMerges merges;
  std::array<int32_t, 256> byte_ids;     // the one-byte token of each byte
  std::vector<std::string> id_to_bytes;  // what each id decodes to
  std::vector<bool> id_known;            // ids may have gaps
  bool add_prefix_space = false;
  bool ignore_merges = false;
  bool one_id_per_byte = false;
  int32_t eos_id = -1;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(BpeTables tables, AddedTokenSplitter added_tokens)
      : tables_(std::move(tables)),
        added_tokens_(std::move(added_tokens)),
        cache_(kWordCacheCapacity) {}

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3);
    for (const TextSegment& segment : added_tokens_.Split(text)) {
      if (segment.added_id >= 0) {
        ids.push_back(segment.added_id);
        continue;
      }
      std::string prefixed;
      std::string_view plain = segment.text;
      if (tables_.add_prefix_space && plain.front() != ' ') {
        prefixed.reserve(plain.size() + 1);
        prefixed.append(" ").append(plain);
        plain = prefixed;
      }
      pretokenizer_.Split(plain, [&](std::string_view word) { EncodeWord(word, &ids); });
    }
    return ids;
  }

  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    std::string bytes;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size() || !tables_.id_known[id]) {
        return absl::InvalidArgumentError(
            absl::StrFormat("token id %d is not in the vocabulary of %s (vocab size %d)", id,
                            tables_.path, vocab_size()));
      }
      bytes += tables_.id_to_bytes[id];
    }
    return bytes;
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(tables_.id_to_bytes.size()); }
  int32_t eos_id() const override { return tables_.eos_id; }
  bool one_id_per_byte() const override { return tables_.one_id_per_byte; }
  size_t StreamCut(std::string_view text) const override {
    return FindStreamCut(text, added_tokens_, tables_.add_prefix_space);
  }

 private:
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
    if (tables_.ignore_merges) {
      if (const auto it = tables_.vocab.find(ByteLevelEncode(word)); it != tables_.vocab.end()) {
        ids->push_back(it->second);
        return;
      }
    }
    const bool cacheable = word.size() < kMaxCachedWordBytes;
    if (cacheable && cache_.AppendIfCached(word, ids)) return;
    std::vector<int32_t> symbols;
    symbols.reserve(word.size());
    for (unsigned char b : word) symbols.push_back(tables_.byte_ids[b]);
    tables_.merges.MergeWord(&symbols);
    ids->insert(ids->end(), symbols.begin(), symbols.end());
    if (cacheable) cache_.Insert(word, std::move(symbols));
  }

  const BpeTables tables_;
  const AddedTokenSplitter added_tokens_;
  const Gpt2PreTokenizer pretokenizer_{};
  mutable WordCache cache_;
};

absl::Status UnknownInMerge(const std::string& path, size_t index, const std::string& spelling) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer file ", path, ": model.merges[", index,
                                                 "] uses \"", spelling, "\", which is not in model.vocab"));
}

absl::StatusOr<BpeMerges> BuildMerges(const BpeTokenizerSpec& spec, const SpellingToId& vocab,
                                      const std::string& path) {
  BpeMerges merges;
  for (size_t i = 0; i < spec.merges.size(); ++i) {
    const auto& [left, right] = spec.merges[i];
    const auto left_id = vocab.find(left);
    if (left_id == vocab.end()) return UnknownInMerge(path, i, left);
    const auto right_id = vocab.find(right);
    if (right_id == vocab.end()) return UnknownInMerge(path, i, right);
    const std::string merged = left + right;
    const auto merged_id = vocab.find(merged);
    if (merged_id == vocab.end()) return UnknownInMerge(path, i, merged);
    merges.Add(left_id->second, right_id->second, merged_id->second);
  }
  return merges;
}

absl::StatusOr<std::array<int32_t, 256>> FindByteIds(const SpellingToId& vocab,
                                                     const std::string& path) {
  std::array<int32_t, 256> byte_ids;
  for (int b = 0; b < 256; ++b) {
    const std::string spelling = ByteLevelEncode(std::string(1, static_cast<char>(b)));
    const auto it = vocab.find(spelling);
    if (it == vocab.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tokenizer file %s: model.vocab lacks \"%s\", the token for byte 0x%02X, so it is not "
          "a byte-level vocabulary",
          path, spelling, b));
    }
    byte_ids[b] = it->second;
  }
  return byte_ids;
}

// Ids index a table, so a stray huge id in the file must not size it.
constexpr int32_t kMaxTokenId = 1 << 24;

int32_t FindEosId(const BpeTokenizerSpec& spec, const SpellingToId& vocab) {
  for (std::string_view spelling : kEosSpellings) {
    for (const AddedTokenSpec& token : spec.added_tokens) {
      if (token.content == spelling) return token.id;
    }
    if (const auto it = vocab.find(spelling); it != vocab.end()) return it->second;
  }
  return -1;
}

absl::StatusOr<BpeTables> BuildTables(const BpeTokenizerSpec& spec, const std::string& path) {
  BpeTables tables;
  tables.path = path;
  tables.add_prefix_space = spec.add_prefix_space;
  tables.ignore_merges = spec.ignore_merges;

  tables.vocab.reserve(spec.vocab.size());
  int32_t max_id = -1;
  for (const auto& [spelling, id] : spec.vocab) {
    tables.vocab.emplace(spelling, id);
    max_id = std::max(max_id, id);
  }
  for (const AddedTokenSpec& token : spec.added_tokens) max_id = std::max(max_id, token.id);
  if (max_id > kMaxTokenId) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tokenizer file %s: token id %d is implausibly large (limit %d)", path, max_id, kMaxTokenId));
  }

  absl::StatusOr<std::array<int32_t, 256>> byte_ids = FindByteIds(tables.vocab, path);
  if (!byte_ids.ok()) return byte_ids.status();
  tables.byte_ids = *byte_ids;
  absl::StatusOr<BpeMerges> merges = BuildMerges(spec, tables.vocab, path);
  if (!merges.ok()) return merges.status();
  tables.merges = *std::move(merges);

  // Every token, added ones included, decodes as Hugging Face's ByteLevel
  // decoder does: through the byte-level alphabet when it is spelled in it,
  // else as its text. Special tokens such as "<|endoftext|>" (printable
  // ASCII, which the alphabet maps to itself) thus decode to their content.
  tables.id_to_bytes.resize(max_id + 1);
  tables.id_known.resize(max_id + 1, false);
  const auto set_bytes = [&](int32_t id, const std::string& spelling) {
    std::optional<std::string> bytes = ByteLevelDecode(spelling);
    tables.id_to_bytes[id] = bytes.has_value() ? *std::move(bytes) : spelling;
    tables.id_known[id] = true;
  };
  for (const auto& [spelling, id] : spec.vocab) set_bytes(id, spelling);
  for (const AddedTokenSpec& token : spec.added_tokens) set_bytes(token.id, token.content);

  tables.eos_id = FindEosId(spec, tables.vocab);
  tables.one_id_per_byte = spec.merges.empty() && !tables.add_prefix_space;
  for (int b = 0; b < 256; ++b) tables.one_id_per_byte &= tables.byte_ids[b] == b;
  return tables;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& path) {
  return LoadBpeTokenizerForText(path, /*not_in_text=*/{});  // every added token split out
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizerForText(
    const std::string& path, const std::vector<int32_t>& not_in_text) {
  absl::StatusOr<BpeTokenizerSpec> spec = ReadTokenizerJson(path);
  if (!spec.ok()) return spec.status();
  // Every added token decodes (BuildTables), but only these are split out of text.
  absl::StatusOr<BpeTables> tables = BuildTables(*spec, path);
  if (!tables.ok()) return tables.status();
  std::vector<AddedTokenSpec> matched;
  for (const AddedTokenSpec& token : spec->added_tokens) {
    if (std::find(not_in_text.begin(), not_in_text.end(), token.id) == not_in_text.end()) {
      matched.push_back(token);
    }
  }
  // Only the tokens split out of text matter (review-apifix F1): with any,
  // its spelling is one id, and a client counting tokens as bytes would be
  // wrong (GetModelInfo.tokenizer would claim "bytes" falsely).
  tables->one_id_per_byte &= matched.empty();
  return std::make_unique<BpeTokenizer>(*std::move(tables), AddedTokenSplitter(matched));
}

}  // namespace drt
