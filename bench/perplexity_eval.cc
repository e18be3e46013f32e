// drt-ppl: perplexity by token position over long documents (llama.cpp's
// llama-perplexity for DRT; the DRT paper's PG19 view). The document is
// appended piece by piece (bench/perplexity/document_scorer.h); token i is
// scored with the logits the model gave after tokens 0..i-1, the first token
// is unscored. Per bucket of positions (powers of two by default): tokens,
// mean NLL in nats, perplexity, bits per byte; overall; tokens/s; the
// retrievals the session made. --context N scores it in windows of N tokens
// (bench/perplexity/context_windows.h), the truncated-context baseline.
// Several documents (repeated --text, or a folder) are each scored in fresh
// sessions and reported each and pooled: pooled buckets sum every
// document's tokens at those positions, so their means are token-weighted.
//
// Bits per byte: a byte tokenizer's token is one byte; for a BPE tokenizer
// each token counts the bytes of its decoded text (Tokenizer::Decode of the
// id alone), which sum to the document's bytes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "bench/load_average.h"
#include "bench/niah/eval_options.h"
#include "bench/niah/passkey_haystack.h"
#include "bench/perplexity/context_windows.h"
#include "bench/perplexity/document_list.h"
#include "bench/perplexity/document_scorer.h"
#include "bench/perplexity/output_file.h"
#include "bench/perplexity/position_buckets.h"
#include "bench/perplexity/token_bytes.h"
#include "cli/command_line.h"
#include "engine/model.h"
#include "engine/session.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "models/drt-text-byte", "model directory");
ABSL_FLAG(std::string, text, "",
          "the document: a file of UTF-8 text (or any bytes, for a byte tokenizer), "
          "tokenised by the model's tokenizer. A folder: every regular file in it (sorted by "
          "name, subfolders skipped), each a document. Repeat the flag for several files or "
          "folders; several documents are reported each and pooled (token-weighted)");
ABSL_FLAG(bool, filler, false,
          "score the passkey tools' training filler (\"The grass is green. ...\", repeated) "
          "instead of --text; needs --max_document_tokens");
// Optional flags (std::nullopt: not given), so that "given" does not depend
// on the value (review-toolsbranch 5: --max_tokens=0 went unnoticed).
ABSL_FLAG(std::optional<int64_t>, max_document_tokens, std::nullopt,
          "score only the first N tokens of the document (unset or 0: the whole --text; at most "
          "4G, as drt-niah's lengths)");
// The flag's old name: the clients' --max_tokens means tokens to generate
// (review-tools 2026-11-25 #9), so it was renamed; kept for old scripts.
ABSL_FLAG(std::optional<int64_t>, max_tokens, std::nullopt,
          "deprecated: the old name of --max_document_tokens");
ABSL_FLAG(int64_t, piece, 4096,
          "tokens per Append (each a scored Append: the engine holds one step's logits at a "
          "time, whatever the piece)");
ABSL_FLAG(int64_t, context, 0,
          "score with the context cut to N tokens, as llama-perplexity's -c: the document in "
          "consecutive windows of N tokens, each in a fresh session, each window's first token "
          "unscored (0: the whole document in one session; at least 2 otherwise). Buckets stay "
          "by position in the document: the baseline for what context past N adds");
ABSL_FLAG(std::string, buckets, "",
          "bucket starts after 0, e.g. 1K,4K,16K (K = 1024, M = 1048576); default: powers of "
          "two from 1K, [0,1K), [1K,2K), [2K,4K), ... up to the document's length");
ABSL_FLAG(int32_t, threads, 0,
          "CPU threads (0: the CPUs this process may use; engine/cpu/cpu_threads.h)");
ABSL_FLAG(std::string, device, "cpu",
          "cpu, cuda or auto (auto: cuda when this build has the CUDA backend and GPU "
          "--cuda_device is visible, else cpu)");
ABSL_FLAG(int32_t, cuda_device, 0, "GPU index for --device=cuda");
ABSL_FLAG(std::string, cuda_precision, "bf16", "CUDA number format: bf16 or fp32");
ABSL_FLAG(std::string, json, "", "write the results here as JSON");

namespace {

using Clock = std::chrono::steady_clock;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
  return 1;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("--text: cannot read '%s'", path));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// JSON has no NaN: an empty bucket's figures are null.
nlohmann::json Number(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

nlohmann::json BucketJson(const drt::ppl::Bucket& b) {
  const drt::ppl::BucketSummary s = drt::ppl::Summarize(b);
  return {{"begin", b.begin},          {"end", b.end},
          {"tokens", b.tokens},        {"bytes", b.bytes},
          {"nll_sum", b.nll_sum},      {"mean_nll", Number(s.mean_nll)},
          {"perplexity", Number(s.perplexity)}, {"bits_per_byte", Number(s.bits_per_byte)}};
}

void PrintRow(const std::string& label, const drt::ppl::Bucket& b) {
  const drt::ppl::BucketSummary s = drt::ppl::Summarize(b);
  std::printf("%-22s %10ld %10.4f %11.3f %10.4f\n", label.c_str(), static_cast<long>(b.tokens),
              s.mean_nll, s.perplexity, s.bits_per_byte);
}

// One document to score: its name (the file, or "filler"), its tokens and
// the bytes each token id stands for.
struct Document {
  std::string input;
  std::vector<int32_t> tokens;
  std::vector<int32_t> token_bytes;
  int64_t bytes = 0;
};

// What scoring one document gave.
struct DocumentResult {
  drt::ppl::PositionBuckets buckets;
  drt::ppl::WindowsScored scored;
  double seconds = 0;
};

void PrintTable(const drt::ppl::PositionBuckets& buckets) {
  std::printf("%-22s %10s %10s %11s %10s\n", "positions", "tokens", "mean NLL", "perplexity",
              "bits/byte");
  for (const drt::ppl::Bucket& b : buckets.buckets()) {
    PrintRow(absl::StrFormat("[%d, %d)", b.begin, b.end), b);
  }
  PrintRow("all", buckets.Overall());
}

nlohmann::json BucketsJson(const drt::ppl::PositionBuckets& buckets) {
  nlohmann::json out = nlohmann::json::array();
  for (const drt::ppl::Bucket& b : buckets.buckets()) out.push_back(BucketJson(b));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  drt::cli::ParseCommandLine(
      {"drt-ppl",
       "Perplexity by token position over one document, or several (each and pooled).\n"
       "Example: drt-ppl --model models/drt-text-byte --text "
       "tests/fixtures/heldout-text/debian_handbook_excerpt.txt --threads 2\n"
       "The same with the context cut to the training length (the baseline): add --context 4032",
       {"bench/perplexity_eval.cc"}},
      argc, argv);

  // Flags first, before the model loads: a bad one is refused at once.
  // absl keeps the last --text only; every one given is read from argv (a
  // --text from a --flagfile is the one absl kept).
  std::vector<std::string> text_paths = drt::ppl::RepeatedFlagValues(argc, argv, "text");
  if (text_paths.empty() && !absl::GetFlag(FLAGS_text).empty()) {
    text_paths.push_back(absl::GetFlag(FLAGS_text));
  }
  if (!text_paths.empty() && text_paths.back() != absl::GetFlag(FLAGS_text)) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "--text: the command line's last --text ('%s') is not the one parsed ('%s'); give every "
        "--text on the command line",
        text_paths.back(), absl::GetFlag(FLAGS_text))));
  }
  for (const std::string& path : text_paths) {
    if (path.empty()) return Fail(absl::InvalidArgumentError("--text: an empty path"));
  }
  const bool use_filler = absl::GetFlag(FLAGS_filler);
  const std::optional<int64_t> document_tokens = absl::GetFlag(FLAGS_max_document_tokens);
  int64_t max_tokens = document_tokens.value_or(0);
  if (const std::optional<int64_t> old_name = absl::GetFlag(FLAGS_max_tokens); old_name.has_value()) {
    if (document_tokens.has_value()) {
      return Fail(absl::InvalidArgumentError(
          "--max_tokens is the deprecated name of --max_document_tokens: give one of them"));
    }
    std::fprintf(stderr,
                 "warning: --max_tokens is deprecated (the clients' --max_tokens is tokens to "
                 "generate); use --max_document_tokens\n");
    max_tokens = *old_name;
  }
  const int64_t piece = absl::GetFlag(FLAGS_piece);
  if (text_paths.empty() == !use_filler) {
    return Fail(absl::InvalidArgumentError(
        "give the documents: --text FILE or FOLDER (repeated for several), or --filler (with "
        "--max_document_tokens)"));
  }
  if (max_tokens < 0) {
    return Fail(absl::InvalidArgumentError(
        absl::StrFormat("--max_document_tokens must be 0 (all) or more, got %d", max_tokens)));
  }
  // The cap the other tools' lengths have (ParseLengths): a larger N would
  // only fail later in an allocation (review-ppl P3 ran into bad_alloc).
  if (max_tokens > drt::niah::kMaxLength) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "--max_document_tokens must be at most %d, got %d", drt::niah::kMaxLength, max_tokens)));
  }
  if (use_filler && max_tokens == 0) {
    return Fail(absl::InvalidArgumentError("--filler needs --max_document_tokens (the filler has no end)"));
  }
  if (use_filler && max_tokens < 2) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "--filler --max_document_tokens must be at least 2 (the first token is not scored), got %d",
        max_tokens)));
  }
  if (absl::Status s = drt::niah::CheckThreads(absl::GetFlag(FLAGS_threads)); !s.ok()) return Fail(s);
  if (piece < 1) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat("--piece must be at least 1, got %d", piece)));
  }
  const int64_t context = absl::GetFlag(FLAGS_context);
  if (absl::Status s = drt::ppl::CheckContext(context); !s.ok()) return Fail(s);
  std::vector<int64_t> starts;
  const bool default_buckets = absl::GetFlag(FLAGS_buckets).empty();
  if (!default_buckets) {
    auto parsed = drt::ppl::ParseBucketStarts(absl::GetFlag(FLAGS_buckets));
    if (!parsed.ok()) return Fail(parsed.status());
    starts = *std::move(parsed);
  }
  std::vector<std::string> document_paths;
  if (!use_filler) {
    auto listed = drt::ppl::ListDocuments("--text", text_paths);
    if (!listed.ok()) return Fail(listed.status());
    document_paths = *std::move(listed);
  }
  // An unwritable --json is found now, not after a run of minutes; the check
  // leaves the file as it is (it is replaced only after a run that succeeded).
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::vector<std::pair<std::string_view, std::string>> inputs = {
        {"--model", absl::GetFlag(FLAGS_model)}};
    for (const std::string& text_path : text_paths) inputs.push_back({"--text", text_path});
    for (const std::string& document : document_paths) inputs.push_back({"--text", document});
    if (absl::Status s = drt::ppl::CheckOutputFile("--json", path, inputs); !s.ok()) return Fail(s);
  }
  std::vector<std::string> texts;
  for (const std::string& document : document_paths) {
    auto read = ReadFile(document);
    if (!read.ok()) return Fail(read.status());
    texts.push_back(*std::move(read));
  }

  auto model = drt::LoadModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return Fail(model.status());
  const drt::Tokenizer& tokenizer = *(*model)->tokenizer;
  // Every document is tokenised (and checked) before any is scored.
  std::vector<Document> documents;
  if (use_filler) {
    // Only the filler is used: Create's bound (room for the passkey question
    // and a needle) is a haystack rule, so it gets the largest length.
    auto haystacks = drt::niah::PasskeyHaystacks::Create(tokenizer, {}, drt::niah::kMaxLength);
    if (!haystacks.ok()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrFormat("--filler: %s", haystacks.status().message())));
    }
    documents.push_back({"filler", haystacks->Filler(0, max_tokens)});
  }
  for (size_t i = 0; i < document_paths.size(); ++i) {
    auto encoded = tokenizer.Encode(texts[i]);
    if (!encoded.ok()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrFormat("--text '%s': %s", document_paths[i], encoded.status().message())));
    }
    Document document{document_paths[i], *std::move(encoded)};
    if (max_tokens > 0 && static_cast<int64_t>(document.tokens.size()) > max_tokens) {
      document.tokens.resize(max_tokens);
    }
    documents.push_back(std::move(document));
    texts[i].clear();
    texts[i].shrink_to_fit();
  }
  int64_t longest = 0, total_tokens = 0, total_bytes = 0;
  for (Document& document : documents) {
    if (document.tokens.size() < 2) {
      return Fail(absl::InvalidArgumentError(absl::StrFormat(
          "the document%s has %d tokens; at least 2 are needed (the first is not scored)",
          use_filler ? "" : absl::StrFormat(" '%s'", document.input), document.tokens.size())));
    }
    // Bytes per token id, decoded once per id seen (bits per byte).
    auto counted = drt::ppl::CountTokenBytes(tokenizer, document.tokens, (*model)->config().vocab_size);
    if (!counted.ok()) return Fail(counted.status());
    document.token_bytes = std::move(counted->per_id);
    document.bytes = counted->total;
    const int64_t length = static_cast<int64_t>(document.tokens.size());
    longest = std::max(longest, length);
    total_tokens += length;
    total_bytes += document.bytes;
  }

  const std::string device = absl::GetFlag(FLAGS_device);
  const std::string cuda_precision = absl::GetFlag(FLAGS_cuda_precision);
  auto made = drt::niah::MakeEvalBackend(
      **model, {device, absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_cuda_device), cuda_precision});
  if (!made.ok()) return Fail(made.status());
  std::unique_ptr<drt::Backend> backend = *std::move(made);

  // Pooled buckets: positions in each document, up to the longest one.
  drt::ppl::PositionBuckets pooled(default_buckets ? drt::ppl::PowerOfTwoStarts(longest) : starts,
                                   longest);
  std::vector<DocumentResult> results;
  const auto start = Clock::now();
  auto last_report = start;
  int64_t windows = 0, retrievals = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    const Document& document = documents[d];
    const int64_t length = static_cast<int64_t>(document.tokens.size());
    drt::ppl::PositionBuckets buckets(default_buckets ? drt::ppl::PowerOfTwoStarts(length) : starts,
                                      length);
    drt::ppl::ScoreCallbacks callbacks;
    callbacks.on_scored = [&](int64_t position, double nll) {
      const int32_t bytes = document.token_bytes[document.tokens[position]];
      buckets.Add(position, nll, bytes);
      pooled.Add(position, nll, bytes);
    };
    callbacks.on_piece = [&](int64_t done) {
      const auto now = Clock::now();
      if (now - last_report < std::chrono::seconds(10) && done < length) return;
      last_report = now;
      const std::string which =
          documents.size() > 1 ? absl::StrFormat("document %d of %d: ", d + 1, documents.size()) : "";
      std::fprintf(stderr, "%s%ld / %ld tokens, %.0f s\n", which.c_str(), static_cast<long>(done),
                   static_cast<long>(length), std::chrono::duration<double>(now - start).count());
    };
    const auto document_start = Clock::now();
    auto scored = drt::ppl::ScoreInWindows(*backend, document.tokens, context, piece, callbacks);
    if (!scored.ok()) {
      if (documents.size() == 1) return Fail(scored.status());
      return Fail(absl::Status(scored.status().code(),
                               absl::StrFormat("'%s': %s", document.input, scored.status().message())));
    }
    windows += scored->windows;
    retrievals += scored->retrievals;
    results.push_back({std::move(buckets), *scored,
                       std::chrono::duration<double>(Clock::now() - document_start).count()});
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double tokens_per_second = static_cast<double>(total_tokens) / seconds;
  const std::string load = drt::bench::LoadAverageText();
  const char* bytes_basis = tokenizer.one_id_per_byte()
                                ? "one byte per token (byte tokenizer)"
                                : "the bytes of each token's decoded text";

  if (documents.size() == 1) {
    PrintTable(results[0].buckets);
  } else {
    for (size_t d = 0; d < documents.size(); ++d) {
      std::printf("document %zu of %zu: %s (%ld tokens, %ld bytes)\n", d + 1, documents.size(),
                  documents[d].input.c_str(), static_cast<long>(documents[d].tokens.size()),
                  static_cast<long>(documents[d].bytes));
      PrintTable(results[d].buckets);
      std::printf("\n");
    }
    std::printf("pooled over %zu documents (token-weighted: each bucket sums every document's "
                "tokens at those positions)\n",
                documents.size());
    PrintTable(pooled);
  }
  std::printf("%ld tokens (%ld bytes) in %.1f s: %.0f tokens/s, %ld retrievals, piece %ld, "
              "device %s, load %s\n",
              static_cast<long>(total_tokens), static_cast<long>(total_bytes), seconds,
              tokens_per_second, static_cast<long>(retrievals), static_cast<long>(piece),
              backend->name().c_str(), load.c_str());
  if (context > 0) {
    std::printf("context %ld tokens: %ld windows, each in a fresh session, its first token "
                "unscored\n",
                static_cast<long>(context), static_cast<long>(windows));
  }
  std::printf("NLL in nats; bits per byte count %s\n", bytes_basis);

  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    // The top level is the pooled result (for one document, that
    // document's); "documents" has each one.
    nlohmann::json out = {{"model", absl::GetFlag(FLAGS_model)},
                          {"input", documents.size() == 1 ? nlohmann::json(documents[0].input)
                                                          : nlohmann::json(nullptr)},
                          {"documents", nlohmann::json::array()},
                          {"tokens", total_tokens},
                          {"bytes", total_bytes},
                          {"bytes_basis", bytes_basis},
                          {"piece", piece},
                          {"context", context},
                          {"windows", windows},
                          {"device", backend->name()},
                          {"threads", absl::GetFlag(FLAGS_threads)},
                          {"seconds", seconds},
                          {"tokens_per_second", tokens_per_second},
                          {"retrievals", retrievals},
                          {"load_average", load},
                          {"overall", BucketJson(pooled.Overall())},
                          {"buckets", BucketsJson(pooled)}};
    for (size_t d = 0; d < documents.size(); ++d) {
      out["documents"].push_back({{"input", documents[d].input},
                                  {"tokens", static_cast<int64_t>(documents[d].tokens.size())},
                                  {"bytes", documents[d].bytes},
                                  {"windows", results[d].scored.windows},
                                  {"retrievals", results[d].scored.retrievals},
                                  {"seconds", results[d].seconds},
                                  {"overall", BucketJson(results[d].buckets.Overall())},
                                  {"buckets", BucketsJson(results[d].buckets)}});
    }
    if (absl::Status s = drt::ppl::WriteFileReplacing("--json", path, out.dump(2) + "\n"); !s.ok()) {
      return Fail(s);
    }
  }
  return 0;
}
