#include "bench/niah/text_tasks.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "bench/niah/passkey_haystack.h"

namespace drt::niah {
namespace {

constexpr int kKeyDigits = 5;

// Wordings of kPasskeyVaried. weights_tools/text_tasks.py trains on other
// wordings (PASSKEY_WORDINGS there) and on passkey_data.py's; these three are
// never seen in training.
struct Wording {
  const char* needle;
  const char* question;
};
constexpr Wording kHeldOutWordings[] = {
    {"The hidden number is {key}. Do not forget it. ", "What is the hidden number? The hidden number is"},
    {"Here is the key you will need later: the key is {key}. ", "What is the key? The key is"},
    {"The lucky number is {key}. ", "What is the lucky number? The lucky number is"},
};

constexpr const char* kColours[] = {"red", "blue", "green", "yellow", "black", "white", "orange", "purple"};
constexpr const char* kThings[] = {"door", "box", "car", "house", "book", "chair", "gate", "boat"};

std::string Fill(const char* pattern, const std::string& key) {
  return absl::StrReplaceAll(pattern, {{"{key}", key}});
}

std::vector<std::string> DistinctKeys(uint64_t& state, int n) {
  std::vector<std::string> keys;
  while (static_cast<int>(keys.size()) < n) {
    std::string key = RandomKey(state, kKeyDigits);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(std::move(key));
  }
  return keys;
}

std::string VarName(uint64_t& state) {
  std::string name;
  for (int i = 0; i < 5; ++i) name.push_back(static_cast<char>('A' + RandomBelow(state, 26)));
  return name;
}

}  // namespace

uint64_t RandomBelow(uint64_t& state, uint64_t n) {
  state = state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (state >> 33) % n;
}

absl::StatusOr<TextTask> ParseTextTask(std::string_view name) {
  for (TextTask t : {TextTask::kPasskey, TextTask::kPasskeyVaried, TextTask::kKeyed, TextTask::kTwoHop}) {
    if (TextTaskName(t) == name) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown task '%s' (passkey, passkey_varied, keyed, two_hop)", name));
}

std::string_view TextTaskName(TextTask task) {
  switch (task) {
    case TextTask::kPasskey: return "passkey";
    case TextTask::kPasskeyVaried: return "passkey_varied";
    case TextTask::kKeyed: return "keyed";
    case TextTask::kTwoHop: return "two_hop";
  }
  return "?";
}

absl::StatusOr<std::string> LoadFillerText(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(path, ec)) {
    files.push_back(path);
  } else {
    return absl::NotFoundError(absl::StrFormat("filler text '%s' is neither a file nor a directory", path));
  }
  std::string text;
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrFormat("cannot read filler text '%s'", file.string()));
    std::ostringstream bytes;
    bytes << in.rdbuf();
    if (!text.empty()) text.push_back('\n');
    text += bytes.str();
  }
  if (text.size() < 4096) {
    return absl::InvalidArgumentError(
        absl::StrFormat("filler text '%s' has %d bytes; at least 4096 needed", path, text.size()));
  }
  return text;
}

double TextRepeats(int64_t length, int64_t text_bytes) {
  return text_bytes > 0 ? static_cast<double>(length) / static_cast<double>(text_bytes) : 0.0;
}

std::string TextFiller::Bytes(int64_t begin, int64_t end) const {
  std::string out;
  const int64_t n = static_cast<int64_t>(text_->size());
  out.reserve(static_cast<size_t>(std::max<int64_t>(0, end - begin)));
  int64_t pos = (start_ + begin) % n;
  int64_t left = end - begin;
  while (left > 0) {
    const int64_t take = std::min(left, n - pos);
    out.append(*text_, static_cast<size_t>(pos), static_cast<size_t>(take));
    left -= take;
    pos = 0;
  }
  return out;
}

int64_t TextFiller::WordBoundary(int64_t offset) const {
  if (offset <= 0) return 0;
  const int64_t n = static_cast<int64_t>(text_->size());
  for (int64_t back = 0; back < 64 && offset - back > 0; ++back) {
    const char c = (*text_)[static_cast<size_t>((start_ + offset - back - 1) % n)];
    if (c == ' ' || c == '\n') return offset - back;
  }
  return offset;
}

int64_t FillerBytes(const TextTrial& trial, int64_t length) {
  int64_t used = static_cast<int64_t>(trial.question.size());
  for (const Insert& insert : trial.inserts) used += static_cast<int64_t>(insert.text.size());
  return length - used;
}

absl::StatusOr<TextTrial> MakeTextTrial(TextTask task, const TextFiller& filler, int64_t length,
                                        double depth, uint64_t& state) {
  if (depth < 0 || depth > 1) return absl::InvalidArgumentError(absl::StrFormat("depth %f not in [0, 1]", depth));
  TextTrial trial;
  // Texts first, positions once the filler budget is known.
  std::vector<std::string> texts;  // texts[0] holds the answer
  std::vector<int> order_after;    // -1, or the index of the insert this one must follow
  switch (task) {
    case TextTask::kPasskey: {
      const std::string key = RandomKey(state, kKeyDigits);
      texts = {Fill(HaystackFormat{}.needle.c_str(), key)};
      trial.question = "\n" + HaystackFormat{}.question;
      trial.answer = key;
      order_after = {-1};
      break;
    }
    case TextTask::kPasskeyVaried: {
      const std::string key = RandomKey(state, kKeyDigits);
      const Wording& w = kHeldOutWordings[RandomBelow(state, std::size(kHeldOutWordings))];
      texts = {Fill(w.needle, key)};
      trial.question = std::string("\n") + w.question;
      trial.answer = key;
      order_after = {-1};
      break;
    }
    case TextTask::kKeyed: {
      const std::vector<std::string> keys = DistinctKeys(state, 3);
      std::set<std::pair<size_t, size_t>> used;
      std::vector<std::string> names;
      while (names.size() < 3) {
        const size_t c = RandomBelow(state, std::size(kColours)), t = RandomBelow(state, std::size(kThings));
        if (!used.insert({c, t}).second) continue;
        names.push_back(absl::StrFormat("%s %s", kColours[c], kThings[t]));
      }
      for (int i = 0; i < 3; ++i) {
        texts.push_back(absl::StrFormat("The pass key of the %s is %s. ", names[i], keys[i]));
        order_after.push_back(-1);
      }
      trial.question =
          absl::StrFormat("\nWhat is the pass key of the %s? The pass key of the %s is", names[0], names[0]);
      trial.answer = keys[0];
      break;
    }
    case TextTask::kTwoHop: {
      const std::vector<std::string> keys = DistinctKeys(state, 2);
      std::vector<std::string> vars;
      while (vars.size() < 4) {
        std::string v = VarName(state);
        if (std::find(vars.begin(), vars.end(), v) == vars.end()) vars.push_back(std::move(v));
      }
      // Target chain vars[0] = key0, vars[1] = vars[0]; distractor chain vars[2] = key1, vars[3] = vars[2].
      texts = {absl::StrFormat("VAR %s = %s. ", vars[0], keys[0]),
               absl::StrFormat("VAR %s = VAR %s. ", vars[1], vars[0]),
               absl::StrFormat("VAR %s = %s. ", vars[2], keys[1]),
               absl::StrFormat("VAR %s = VAR %s. ", vars[3], vars[2])};
      order_after = {-1, 0, -1, 2};
      trial.question = absl::StrFormat("\nWhat is the value of VAR %s? The value of VAR %s is", vars[1], vars[1]);
      trial.answer = keys[0];
      break;
    }
  }
  int64_t budget = length - static_cast<int64_t>(trial.question.size());
  for (const std::string& t : texts) budget -= static_cast<int64_t>(t.size());
  if (budget < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d bytes is too short for the %s task: this trial's needles and question take %d bytes",
        length, TextTaskName(task), length - budget));
  }
  std::vector<int64_t> at(texts.size());
  at[0] = filler.WordBoundary(static_cast<int64_t>(depth * static_cast<double>(budget)));
  for (size_t i = 1; i < texts.size(); ++i) {
    const int64_t lo = order_after[i] >= 0 ? at[order_after[i]] : 0;
    at[i] = filler.WordBoundary(lo + static_cast<int64_t>(RandomBelow(state, static_cast<uint64_t>(budget - lo + 1))));
    if (order_after[i] >= 0) at[i] = std::max(at[i], at[order_after[i]]);
  }
  // Sort by offset; ties keep the generation order (a chain's second line after its first).
  std::vector<size_t> idx(texts.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return at[a] < at[b]; });
  for (size_t i : idx) trial.inserts.push_back({at[i], texts[i]});
  trial.target_at = at[0];
  return trial;
}

std::string AssemblePrompt(const TextFiller& filler, const TextTrial& trial, int64_t length) {
  const int64_t total = FillerBytes(trial, length);
  std::string out;
  int64_t cursor = 0;
  for (const Insert& insert : trial.inserts) {
    out += filler.Bytes(cursor, insert.at);
    out += insert.text;
    cursor = insert.at;
  }
  out += filler.Bytes(cursor, total);
  out += trial.question;
  return out;
}

}  // namespace drt::niah
