// drt-client: streams a long prompt into a drt-server session, then streams
// an answer back; the C++ twin of client_examples/python/drt_client.py.
//
//   drt-client --server 127.0.0.1:50051                  a 100,000-token haystack
//   drt-client --prompt_file book.txt --question "..."   a text file
//   drt-client --token_ids ids.txt                       whitespace-separated ids
//   drt-client --tokenize --prompt_file book.txt         its token count and ids, no session
//   drt-client --detokenize --token_ids ids.txt          the ids' text, no session
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/command_line.h"
#include "drt/v1/drt.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "host:port of drt-server");
ABSL_FLAG(std::string, token, "",
          "bearer token, sent as 'authorization: Bearer <token>' (default: $DRT_BEARER_TOKEN)");
ABSL_FLAG(std::string, tls_ca, "", "CA certificate PEM file: connect with TLS (default plaintext)");
ABSL_FLAG(double, connect_timeout, 30, "seconds to wait for the server");
ABSL_FLAG(std::string, prompt_file, "", "UTF-8 text file to send as the prompt (default: a haystack)");
ABSL_FLAG(std::string, token_ids, "",
          "file of whitespace-separated token ids to send as the prompt (default: a haystack)");
ABSL_FLAG(bool, tokenize, false,
          "only tokenize --prompt_file (no session): print '<count> tokens (context limit <n>)', "
          "then the ids on one line (what --token_ids reads)");
ABSL_FLAG(bool, count_only, false, "with --tokenize: print the count only, not the ids");
ABSL_FLAG(bool, detokenize, false,
          "only detokenize --token_ids (no session): write the ids' bytes to stdout as they are");
ABSL_FLAG(std::string, question, "", "text appended after --prompt_file or --token_ids");
ABSL_FLAG(int64_t, haystack_tokens, 100000, "haystack length in tokens, approximately");
ABSL_FLAG(double, depth, 0.5, "where the pass key sits in the haystack, 0 (start) to 1 (end)");
ABSL_FLAG(std::string, passkey, "", "the pass key (default: 5 random digits)");
ABSL_FLAG(int64_t, piece_bytes, 64 << 10, "bytes of text per Append message");
ABSL_FLAG(int64_t, piece_tokens, 16 << 10, "token ids per Append message");
ABSL_FLAG(int32_t, prompt_logprobs, -1,
          "score the prompt's tokens (AppendRequest.prompt_logprobs, N top alternatives each, "
          "0..20) and print its perplexity; -1: off");
ABSL_FLAG(bool, print_logprobs, false,
          "with --prompt_logprobs: print each token's logprob (index, id, logprob, alternatives)");
ABSL_FLAG(int32_t, max_tokens, 64, "tokens to generate");
ABSL_FLAG(double, temperature, 0, "0: greedy");
ABSL_FLAG(int32_t, top_k, 0, "0: off");
ABSL_FLAG(double, top_p, 0, "0 or 1: off");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(double, min_p, 0, "drop tokens below this times the best one's probability, 0 to 1; 0: off");
ABSL_FLAG(double, presence_penalty, 0, "lower a token's logit once it was generated, -2 to 2; 0: off");
ABSL_FLAG(double, frequency_penalty, 0,
          "lower a token's logit per time it was generated, -2 to 2; 0: off");
ABSL_FLAG(std::string, logit_bias, "",
          "ID:BIAS[,ID:BIAS...]: add BIAS (-100 to 100) to token ID's logit, e.g. 10:-100,65:2.5");
// --stop is taken out of the command line before absl parses it (TakeStops),
// so that it can be given more than once, as in the Python client; this
// definition gives it its --help line (and takes one from a --flagfile).
ABSL_FLAG(int32_t, top_logprobs, 0,
          "after the answer, print each generated token's log-probability and its N most likely "
          "alternatives (temperature 1), 0 to 20 (0: none)");
ABSL_FLAG(std::string, stop, "",
          "stop sequence, verbatim (commas included); repeatable: --stop . --stop 'a, b' "
          "gives two; one that starts with '-' needs --stop=VALUE");
ABSL_FLAG(std::string, pad_to_chunk_boundary, "model",
          "true: pad the open chunk before generating, so the first token sees chunks retrieved "
          "with the whole prompt in view; false: do not; model: what the model was trained for");
ABSL_FLAG(bool, keep_session, false, "do not delete the session at the end");
ABSL_FLAG(std::string, session_key, "",
          "routing key sent as metadata 'x-drt-session' on every call, so that a gateway "
          "hashing on it (deploy/k8s/gateway) sends all calls of the session to the replica "
          "that holds it; printable ASCII (default: 32 random hex digits)");
ABSL_FLAG(bool, require_passkey, false,
          "exit 1 when the first number in the answer is not the haystack's pass key (the "
          "generated haystack only)");
ABSL_FLAG(double, idle_timeout, 600,
          "seconds an Append or a Generate stream may go without a message from the server "
          "before the client cancels it");
ABSL_FLAG(double, deadline, 0,
          "seconds the whole Append or Generate stream may take, each, before it fails with "
          "DEADLINE_EXCEEDED; 0: no total deadline, only --idle_timeout (GetModelInfo and "
          "CreateSession get 30 s, DeleteSession 10 s)");
ABSL_FLAG(double, retry_seconds, 300,
          "how long the client keeps retrying a call that got UNAVAILABLE (a server restarting, "
          "draining or moving), counted from the call's first failure; for an Append, from its "
          "first cut after the session last took more of the prompt, so each outage between "
          "progress gets the whole bound; plus one attempt, with exponential backoff and jitter; "
          "0: never retry. An Append cut "
          "part-way resumes from the tokens the session holds; client_examples/README.md says "
          "which calls are retried");

namespace {

using Clock = std::chrono::steady_clock;

// The metadata key a session-affine gateway hashes on (docs/deploy.md).
constexpr char kSessionHeader[] = "x-drt-session";

std::string RandomSessionKey() {
  std::random_device random;
  std::string key;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&key, "%08x", random());
  return key;
}

// gRPC metadata values must be printable ASCII.
bool IsValidSessionKey(const std::string& key) {
  for (char c : key) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// Ctrl-C or SIGTERM cancels the running Append or Generate, so that the
// session is still deleted on the way out; at any other moment it exits.
// Cancels a streaming call that goes `seconds` without a message from the
// server. The streams get this instead of a total deadline by default, since
// a total one would also cut a long ingest that is progressing (a 32M-token
// Append takes hours on a CPU); the server sends AppendProgress every 0.1 s
// of work and a piece per token. Declare it after the call's ClientContext,
// so that it stops before the context goes.
class IdleWatchdog {
 public:
  IdleWatchdog(grpc::ClientContext* context, double seconds)
      : context_(context),
        // Capped at 1e9 s (32 years), so that the duration cannot overflow.
        limit_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(std::min(seconds, 1e9)))),
        seconds_(seconds),
        last_(Clock::now()),
        thread_([this] { Watch(); }) {}
  ~IdleWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      finished_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  // A message arrived.
  void Poke() {
    std::lock_guard<std::mutex> lock(mutex_);
    last_ = Clock::now();
  }
  // The call's status, or what the watchdog did to it.
  grpc::Status Explain(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (status.ok() || !fired_) return status;
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrFormat("no message from the server for %g s (--idle_timeout); "
                                        "the call was cancelled",
                                        seconds_));
  }

 private:
  void Watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!finished_) {
      const Clock::time_point due = last_ + limit_;
      if (Clock::now() >= due) {
        fired_ = true;
        context_->TryCancel();
        return;
      }
      wake_.wait_until(lock, due);
    }
  }

  grpc::ClientContext* const context_;
  const Clock::duration limit_;
  const double seconds_;
  std::mutex mutex_;
  std::condition_variable wake_;
  Clock::time_point last_;
  bool finished_ = false;
  bool fired_ = false;
  std::thread thread_;  // last: starts once the rest is set
};

// Ctrl-C and SIGTERM. A signal thread (sigwait, the signals blocked in every
// thread) handles them for the whole run:
// - the first signal during a stream (an Interrupts object is alive) cancels
//   the stream; while a call is being retried (an Outage is alive) it ends
//   the retries at their next wait, or that wait itself (Sleep). Either way
//   interrupted() turns true and the run ends through its normal path, so
//   the session is still deleted (Cleanup);
// - the first signal during a unary call (GetModelInfo, CreateSession,
//   DeleteSession: each makes an Interrupts object too) cancels it, so that a
//   stuck server does not hold the client for the call's 30 s deadline;
//   GetModelInfo and CreateSession then exit 130, DeleteSession reports it;
// - the first signal at any other moment exits at once, as does a second
//   signal: a client must never become unkillable, even while it retries.
class Interrupts {
 public:
  // Call before any other thread starts, so that all of them inherit the mask.
  static void Install() {
    static sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    std::thread([] {
      while (true) {
        int signal = 0;
        if (sigwait(&signals, &signal) != 0) continue;
        std::lock_guard<std::mutex> lock(mutex_);
        if (interrupted_ || (active_ == nullptr && retrying_ == 0)) std::_Exit(128 + signal);
        std::fprintf(stderr, "\ndrt-client: interrupted (again to exit at once)\n");
        interrupted_ = true;
        if (active_ != nullptr) active_->TryCancel();
        wake_.notify_all();
      }
    }).detach();
  }
  // Makes `context` the call that a signal cancels, for this object's life.
  // A call that begins after a signal is cancelled at once, unless
  // `after_signal_too` (the cleanup DeleteSession: a signal during the run
  // still leaves it its one attempt; only a signal during it cancels it).
  explicit Interrupts(grpc::ClientContext* context, bool after_signal_too = false) {
    std::lock_guard<std::mutex> lock(mutex_);
    active_ = context;
    if (interrupted_ && !after_signal_too) context->TryCancel();  // interrupted before it began
  }
  ~Interrupts() {
    std::lock_guard<std::mutex> lock(mutex_);
    active_ = nullptr;
  }
  static bool interrupted() {
    std::lock_guard<std::mutex> lock(mutex_);
    return interrupted_;
  }
  // Sleeps for `seconds` unless a signal comes first; false when interrupted.
  static bool Sleep(double seconds) {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait_for(lock, std::chrono::duration<double>(seconds), [] { return interrupted_; });
    return !interrupted_;
  }
  // A call is being retried (Outage's life): a signal ends the retries
  // instead of the process.
  static void Retrying(bool begin) {
    std::lock_guard<std::mutex> lock(mutex_);
    retrying_ += begin ? 1 : -1;
  }

 private:
  static inline std::mutex mutex_;
  static inline std::condition_variable wake_;
  static inline grpc::ClientContext* active_ = nullptr;
  static inline int retrying_ = 0;
  static inline bool interrupted_ = false;
};

constexpr char kFiller[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr char kQuestion[] = "What is the pass key? The pass key is";
// GPT-2 BPE tokens of " " + kFiller: the separating space joins the next "The".
constexpr int64_t kGpt2TokensPerFiller = 24;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

// (No time between tokens with one generated token: "n/a", not "nan ms".)
std::string Ms(double seconds) {
  return std::isnan(seconds) ? "n/a" : absl::StrFormat("%.1f ms", 1000 * seconds);
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "drt-client: %s\n", message.c_str());
  std::exit(1);
}

// --logit_bias's ID:BIAS pairs (the server checks the ranges: ids in the
// vocabulary, biases in [-100, 100], at most 300), or the pair it cannot read.
absl::StatusOr<std::map<int32_t, float>> ParseLogitBias(const std::string& text) {
  std::map<int32_t, float> out;
  if (text.empty()) return out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::pair<absl::string_view, absl::string_view> pair =
        absl::StrSplit(item, absl::MaxSplits(':', 1));
    const absl::string_view id = absl::StripAsciiWhitespace(pair.first);
    int32_t token = 0;
    float bias = 0;
    if (item.find(':') == absl::string_view::npos || id.empty() ||
        id.find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(id, &token) || !absl::SimpleAtof(pair.second, &bias)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--logit_bias must be ID:BIAS pairs separated by commas (65:-100,10:2.5), got '", item,
          "'"));
    }
    out[token] = bias;
  }
  return out;
}

// Retrying UNAVAILABLE (--retry_seconds). A server restarted on the same
// --state_dir, or its pod moved, keeps every session, so the client rides the
// outage out instead of failing. The default bound (300 s) covers a
// Kubernetes pod move: the old pod's stop (60 s at most), rescheduling and
// attaching its volume, loading the model and restoring the sessions
// (docs/deploy.md, "Durable sessions on Kubernetes"). Backoff: 0.2 s,
// doubling up to 10 s, each delay drawn from its upper half (jitter, so
// clients cut by one restart do not come back in the same instant).
//
// Which calls are retried, and why that is safe (docs/api.md, "Durable
// sessions"): GetModelInfo and GetSession only read; CreateSession may leave
// an empty session behind when only its answer was lost (it expires after
// its idle TTL); DeleteSession's NOT_FOUND on a retry means an earlier
// attempt deleted it. An Append is never re-sent blindly (its tokens would be
// in the context twice): the client asks GetSession how many tokens the
// session holds and resumes from there (Client::AppendResumed). A Generate
// is sent again only when nothing of it reached the client and the session
// holds what it held before (Client::GenerateRetried).
// When --connect_timeout passes with no connection, one call that does not
// wait for one, to learn why (connection refused, unknown host, TLS...).
constexpr int kConnectProbeSeconds = 2;
constexpr double kRetryFirstDelaySeconds = 0.2;
constexpr double kRetryMaxDelaySeconds = 10;

class Retrier {
 public:
  Retrier(double seconds, std::string server) : seconds_(seconds), server_(std::move(server)) {}
  double seconds() const { return seconds_; }
  const std::string& server() const { return server_; }
  // Once the bound has run out, later calls get one attempt.
  bool gave_up() const { return gave_up_; }
  void set_gave_up() { gave_up_ = true; }
  double Jitter() { return std::uniform_real_distribution<double>(0.5, 1.0)(rng_); }

 private:
  const double seconds_;
  const std::string server_;
  bool gave_up_ = false;
  std::mt19937_64 rng_{std::random_device{}()};
};

// The retries of one call (or of one Append with its resumes): the bound
// counts from its first UNAVAILABLE and starts again after progress (an
// Append: the session took more of the prompt since the call cut last began,
// seen in that call's acknowledgements or, when they were lost, in
// GetSession's count). Each stretch without progress, the time the server was
// up included, gets --retry_seconds; the number of stretches is bounded by
// the prompt's length, since each takes more of it.
class Outage {
 public:
  explicit Outage(Retrier& retrier) : retrier_(retrier) { Interrupts::Retrying(true); }
  ~Outage() { Interrupts::Retrying(false); }
  Outage(const Outage&) = delete;
  Outage& operator=(const Outage&) = delete;
  void Reset() {
    start_.reset();
    retries_ = 0;
  }
  // Sleeps before the next attempt, with a log line, and returns true; or
  // returns false with *why set when retries are off (*why = `reason`) or
  // the bound has run out.
  bool Wait(const std::string& what, const std::string& reason, std::string* why) {
    if (Interrupts::interrupted()) {
      *why = absl::StrCat(what, ": ", reason, "; interrupted, not retried");
      return false;
    }
    if (retrier_.seconds() <= 0 || retrier_.gave_up()) {
      *why = absl::StrCat(what, ": ", reason);
      return false;
    }
    const Clock::time_point now = Clock::now();
    if (!start_) start_ = now;
    const double used = std::chrono::duration<double>(now - *start_).count();
    const double left = retrier_.seconds() - used;
    if (left <= 0) {
      retrier_.set_gave_up();
      *why = absl::StrFormat(
          "drt-server at %s did not come back within --retry_seconds %g: %s still failed (%s) "
          "after %d retries in %.1f s",
          retrier_.server(), retrier_.seconds(), what, reason, retries_, used);
      return false;
    }
    double delay = std::min(kRetryMaxDelaySeconds,
                            kRetryFirstDelaySeconds * std::ldexp(1.0, std::min(retries_, 30)));
    delay = std::min(left, delay * retrier_.Jitter());
    ++retries_;
    std::fprintf(stderr,
                 "drt-client: %s: %s; retry %d in %.2f s (%.1f s of --retry_seconds %g used)\n",
                 what.c_str(), reason.c_str(), retries_, delay, used, retrier_.seconds());
    std::fflush(stderr);
    if (!Interrupts::Sleep(delay)) {
      *why = absl::StrCat(what, ": ", reason, "; interrupted while waiting to retry");
      return false;
    }
    return true;
  }

 private:
  Retrier& retrier_;
  std::optional<Clock::time_point> start_;
  int retries_ = 0;
};

// The longest prefix of `s` (at most `limit` bytes) that does not cut a
// UTF-8 character.
size_t Utf8Cut(std::string_view s, size_t limit) {
  if (limit >= s.size()) return s.size();
  size_t end = limit;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return end > 0 ? end : limit;  // no boundary within the limit: not UTF-8 anyway
}

// Where `s` stops being UTF-8: the offset of the first byte that does not
// begin a whole, well-formed character (Unicode's Table 3-7: no overlong
// forms, surrogates or code points past U+10FFFF), with the reason Python's
// decoder gives, so that both clients word the refusal alike; nullopt when
// all of it is UTF-8. The server refuses such text as INVALID_ARGUMENT, but
// only when the message carrying it arrives, naming the message, not the
// file (review-tools #7).
struct Utf8Error {
  size_t offset;
  const char* reason;
};
std::optional<Utf8Error> FirstInvalidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int more;                          // continuation bytes after c
    unsigned char low = 0x80, high = 0xBF;  // the range of the first of them
    if (c >= 0xC2 && c <= 0xDF) {
      more = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      more = 2;
      if (c == 0xE0) low = 0xA0;   // overlong
      if (c == 0xED) high = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      more = 3;
      if (c == 0xF0) low = 0x90;   // overlong
      if (c == 0xF4) high = 0x8F;  // past U+10FFFF
    } else {
      return Utf8Error{i, "invalid start byte"};
    }
    for (int k = 1; k <= more; ++k) {
      if (i + k >= s.size()) return Utf8Error{i, "unexpected end of data"};
      const unsigned char b = s[i + k];
      if (b < (k == 1 ? low : 0x80) || b > (k == 1 ? high : 0xBF)) {
        return Utf8Error{i, "invalid continuation byte"};
      }
    }
    i += more + 1;
  }
  return std::nullopt;
}

// Whether a bare --stop's next argument reads as an option: it starts with
// '-'. It was taken as the stop sequence, and `--stop --max_tokens 5` stopped
// on "--max_tokens" (review-toolsfix3 #9). A stop sequence is text, so
// whether it looks like a number does not matter: -5, -1e5 and '-' alone
// are written --stop=VALUE too, which takes any value. The Python client
// applies the same rule itself, not argparse's, whose idea of a negative
// number changed in Python 3.14 (-1e5 became a value).
bool ReadsAsOption(absl::string_view arg) { return absl::StartsWith(arg, "-"); }

// Takes every --stop VALUE, --stop=VALUE (or with one dash) out of argv, in
// order, before absl parses the rest: absl keeps only a flag's last value,
// and its list flags split on commas, so a stop sequence holding a comma
// could not be given (review-tools #12). Arguments after "--" are left.
std::vector<std::string> TakeStops(int& argc, char** argv) {
  std::vector<std::string> stops;
  int kept = 1;
  bool positional = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") positional = true;
    absl::string_view name = arg;
    if (!positional && (absl::ConsumePrefix(&name, "--") || absl::ConsumePrefix(&name, "-"))) {
      if (name == "stop") {
        if (i + 1 >= argc) Die("--stop needs a value (a stop sequence)");
        if (ReadsAsOption(argv[i + 1])) {
          Die(absl::StrCat("--stop needs a value, got '", argv[i + 1],
                           "', which starts with '-' and reads as an option; to stop on it "
                           "write --stop=",
                           argv[i + 1]));
        }
        stops.emplace_back(argv[++i]);
        continue;
      }
      if (absl::ConsumePrefix(&name, "stop=")) {
        stops.emplace_back(name);
        continue;
      }
    }
    argv[kept++] = argv[i];
  }
  argc = kept;
  argv[argc] = nullptr;
  return stops;
}

// What Append sends: token ids first, then text.
struct Prompt {
  std::vector<int32_t> ids;
  std::string text;
  int64_t expected_tokens = 0;  // 0: unknown
  std::string passkey;          // haystack only
  std::string description;
};

// What one Append call sends: token ids, then text. A resumed Append sends
// the prompt without the tokens the session already holds.
struct PromptPart {
  std::vector<int32_t> ids;
  std::string_view text;
};

PromptPart WholePrompt(const Prompt& prompt) { return {prompt.ids, prompt.text}; }

// The prompt without its first `skip` tokens, or nullopt with *why when that
// cannot be cut off client-side. Token ids count one each; text counts one
// token per UTF-8 byte with the byte tokenizer (ModelInfo.tokenizer "bytes":
// id = byte value) and cannot be counted with a BPE tokenizer (its token
// boundaries are the server's). A cut inside a UTF-8 character sends the
// character's remaining bytes as ids (their byte values), the rest as text.
std::optional<PromptPart> PromptAfter(const Prompt& prompt, int64_t skip, bool bytes_tokenizer,
                                      std::string* why) {
  const int64_t ids = static_cast<int64_t>(prompt.ids.size());
  if (skip <= ids) return PromptPart{{prompt.ids.begin() + skip, prompt.ids.end()}, prompt.text};
  skip -= ids;
  if (!bytes_tokenizer) {
    *why = "the session holds part of the prompt's text, and with a BPE tokenizer this client "
           "cannot tell which text those tokens cover";
    return std::nullopt;
  }
  if (skip > static_cast<int64_t>(prompt.text.size())) {
    *why = absl::StrFormat("the session holds %s tokens more than this prompt has",
                           Commas(skip - static_cast<int64_t>(prompt.text.size())));
    return std::nullopt;
  }
  // A tokenizer.json with added tokens and no merges is "bytes" too, and a
  // special token written literally ("<|...|>") is one token, not one per
  // byte (engine/tokenizer/tokenizer.h). The bundled models refuse theirs as
  // input; a third-party one may not, so text holding "<|" is not counted.
  if (std::string_view(prompt.text).substr(0, skip + 1).find("<|") != std::string_view::npos) {
    *why = "the prompt's text before the resume point holds '<|', which may be a special token "
           "written literally that the tokenizer counts as one token, not one per byte";
    return std::nullopt;
  }
  PromptPart part;
  part.text = std::string_view(prompt.text).substr(skip);
  while (!part.text.empty() && (static_cast<unsigned char>(part.text[0]) & 0xC0) == 0x80) {
    part.ids.push_back(static_cast<unsigned char>(part.text[0]));
    part.text.remove_prefix(1);
  }
  return part;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die(absl::StrCat("cannot open ", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A --token_ids file: whitespace-separated 32-bit integers. Read before
// connecting, so that a file that does not parse needs no server
// (review-tools 2026-11-25 #8).
std::vector<int32_t> ReadTokenIds(const std::string& path) {
  std::vector<int32_t> ids;
  std::istringstream in(ReadFile(path));
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    errno = 0;
    const long long id = std::strtoll(word.c_str(), &end, 10);
    if (end == word.c_str() || *end != '\0' || errno == ERANGE ||
        id < std::numeric_limits<int32_t>::min() || id > std::numeric_limits<int32_t>::max()) {
      Die(absl::StrCat("--token_ids ", path, ": '", word, "' (index ", ids.size(),
                       ") is not a 32-bit integer"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// The first id of a --token_ids file that the server would refuse in the
// Append (outside the vocabulary, the landmark id, the pad id), named with
// its index, checked against GetModelInfo before CreateSession: the server
// refused it only after the client had made a session (review-tools
// 2026-11-25 #8). The same rule as Session::ValidateTokens.
// The sampling the flags ask for: sent with Generate, and with CreateSession
// as the session's defaults. --logit_bias was checked in main, so it parses.
drt::v1::SamplingParams SamplingFromFlags() {
  drt::v1::SamplingParams sampling;
  sampling.set_temperature(absl::GetFlag(FLAGS_temperature));
  sampling.set_top_k(absl::GetFlag(FLAGS_top_k));
  sampling.set_top_p(absl::GetFlag(FLAGS_top_p));
  sampling.set_seed(absl::GetFlag(FLAGS_seed));
  sampling.set_min_p(static_cast<float>(absl::GetFlag(FLAGS_min_p)));
  sampling.set_presence_penalty(static_cast<float>(absl::GetFlag(FLAGS_presence_penalty)));
  sampling.set_frequency_penalty(static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty)));
  // (Kept in a local: a range-for over *ParseLogitBias(...) would walk a map
  // the temporary took with it.)
  const auto bias = ParseLogitBias(absl::GetFlag(FLAGS_logit_bias));
  for (const auto& [token, value] : *bias) (*sampling.mutable_logit_bias())[token] = value;
  return sampling;
}

// --max_tokens and --top_logprobs against the limits GetModelInfo reports
// (0 from a server of before: the server checks them then), before anything
// is sent.
void CheckGenerationLimits(const drt::v1::ModelInfo& info) {
  if (const int32_t n = absl::GetFlag(FLAGS_max_tokens);
      info.max_tokens_limit() > 0 && n > info.max_tokens_limit()) {
    Die(absl::StrFormat("--max_tokens %d is over this server's limit of %d "
                        "(GetModelInfo.max_tokens_limit); nothing was sent",
                        n, info.max_tokens_limit()));
  }
  if (const int32_t n = absl::GetFlag(FLAGS_top_logprobs);
      info.max_top_logprobs() > 0 && n > info.max_top_logprobs()) {
    Die(absl::StrFormat("--top_logprobs %d is over this server's limit of %d "
                        "(GetModelInfo.max_top_logprobs); nothing was sent",
                        n, info.max_top_logprobs()));
  }
}

void CheckTokenIds(const std::string& path, const std::vector<int32_t>& ids,
                   const drt::v1::ModelInfo& info) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    const std::string at = absl::StrCat("--token_ids ", path, ": token ", id, " (index ", i, ")");
    if (id < 0 || id >= info.vocab_size()) {
      Die(absl::StrCat(at, " is outside the model's vocabulary [0, ", info.vocab_size(), ")"));
    }
    if (id == info.chunk_id()) Die(absl::StrCat(at, " is the landmark id, which only the engine inserts"));
    if (id == info.pad_id()) Die(absl::StrCat(at, " is the pad id, which only the engine inserts"));
  }
}

// `prompt_text`: --prompt_file's contents, read and checked before connecting;
// moved in, so that a large file is held once (review-toolsfix3 #5: main kept
// its copy for the whole run beside this one).
// `token_ids`: the --token_ids file's ids, read before connecting.
Prompt MakePrompt(const drt::v1::ModelInfo& info, std::string prompt_text,
                  std::vector<int32_t> token_ids) {
  Prompt prompt;
  const std::string question = absl::GetFlag(FLAGS_question);
  if (const std::string path = absl::GetFlag(FLAGS_prompt_file); !path.empty()) {
    prompt.text = std::move(prompt_text);
    if (info.tokenizer() == "bytes" && question.empty()) prompt.expected_tokens = prompt.text.size();
    prompt.description = absl::StrCat(path, " (", Commas(prompt.text.size()), " bytes)");
    prompt.text += question;
    return prompt;
  }
  if (const std::string path = absl::GetFlag(FLAGS_token_ids); !path.empty()) {
    prompt.ids = std::move(token_ids);
    if (question.empty()) prompt.expected_tokens = prompt.ids.size();
    prompt.description = absl::StrCat(path, " (", Commas(prompt.ids.size()), " token ids)");
    prompt.text = question;
    return prompt;
  }

  prompt.passkey = absl::GetFlag(FLAGS_passkey);
  if (prompt.passkey.empty()) {
    std::random_device random;
    prompt.passkey = std::to_string(std::uniform_int_distribution<int>(10000, 99999)(random));
  }
  const std::string needle = absl::StrCat("The pass key is ", prompt.passkey, ". Remember it. ",
                                          prompt.passkey, " is the pass key.");
  int64_t per_filler, overhead;
  if (info.tokenizer() == "bytes") {
    per_filler = sizeof(kFiller);  // the filler and one space
    overhead = needle.size() + sizeof(kQuestion);
  } else {
    per_filler = kGpt2TokensPerFiller;
    overhead = prompt.passkey.size() + 22;  // the needle and the question; digits split unpredictably
  }
  const int64_t fillers =
      std::max<int64_t>(1, (absl::GetFlag(FLAGS_haystack_tokens) - overhead) / per_filler);
  const int64_t before = std::llround(absl::GetFlag(FLAGS_depth) * fillers);
  std::vector<std::string> parts(before, kFiller);
  parts.push_back(needle);
  parts.insert(parts.end(), fillers - before, kFiller);
  parts.push_back(kQuestion);
  prompt.text = absl::StrJoin(parts, " ");
  prompt.expected_tokens = fillers * per_filler + overhead;
  prompt.description = absl::StrFormat(
      "haystack of ~%s tokens (%s bytes), pass key %s at depth %g",
      Commas(prompt.expected_tokens), Commas(prompt.text.size()), prompt.passkey,
      absl::GetFlag(FLAGS_depth));
  return prompt;
}

// One redrawn line on a terminal; a line every few seconds otherwise.
class ProgressBar {
 public:
  explicit ProgressBar(int64_t total) : total_(total), tty_(isatty(STDERR_FILENO)) {}

  // offset: prompt tokens the session held before this Append call (a
  // resumed Append counts from there).
  void Update(const drt::v1::AppendProgress& p, bool final = false, int64_t offset = 0) {
    const double rate = p.elapsed_seconds() > 0 ? p.tokens_ingested() / p.elapsed_seconds() : 0;
    const int64_t tokens = offset + p.tokens_ingested();
    std::string line = absl::StrFormat(
        "%s tokens  %s chunks  %s tokens/s  %.1f s", Commas(tokens),
        Commas(p.chunks_ingested()), Commas(std::llround(rate)), p.elapsed_seconds());
    if (total_ > 0) {
      const double frac =
          final ? 1.0 : std::min(0.999, static_cast<double>(tokens) / total_);
      const int filled = static_cast<int>(30 * frac);
      line = absl::StrFormat("append [%s%s] %5.1f%%  %s", std::string(filled, '#'),
                             std::string(30 - filled, '.'), 100 * frac, line);
    } else {
      line = "append  " + line;
    }
    if (tty_) {
      std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), final ? "\n" : "");
      drawn_ = !final;
    } else if (final || p.elapsed_seconds() - last_line_ >= 2.0) {
      last_line_ = p.elapsed_seconds();
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

  // Ends a half-drawn line, so that an error message starts on its own.
  void Abort() {
    if (drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }

 private:
  int64_t total_;
  bool tty_;
  bool drawn_ = false;
  double last_line_ = -1e9;
};

class Client {
 public:
  Client(std::shared_ptr<grpc::Channel> channel, std::string token, std::string session_key,
         std::vector<std::string> stops)
      : stub_(drt::v1::Drt::NewStub(channel)),
        token_(std::move(token)),
        session_key_(std::move(session_key)),
        stops_(std::move(stops)) {}

  static std::string Describe(const grpc::Status& status) {
    return absl::StrCat(GrpcCodeName(status.error_code()), ": ", status.error_message());
  }
  // Whether an Append or Generate stream that failed with `status` may have
  // been cut by a server or gateway going away. Directly from drt-server a
  // cut arrives as UNAVAILABLE; through an HTTP/2 proxy (Envoy) a stream
  // whose server died after sending headers is reset, which gRPC reports as
  // INTERNAL ("RST_STREAM") or CANCELLED. The client's own cancellations are
  // not cuts: Ctrl-C/SIGTERM (Interrupts::interrupted()), --idle_timeout and
  // --deadline (DEADLINE_EXCEEDED). Safe to widen: what is sent next is
  // decided by GetSession's count, never by the status.
  static bool StreamCut(const grpc::Status& status) {
    if (Interrupts::interrupted()) return false;
    switch (status.error_code()) {
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::CANCELLED:
        return true;
      case grpc::StatusCode::INTERNAL:
        return absl::StrContains(status.error_message(), "RST_STREAM");
      default:
        return false;
    }
  }
  static void Check(const grpc::Status& status) {
    if (!status.ok()) Die(Describe(status));
  }

  // `call()` (a unary call on a fresh context) until it does not fail with
  // UNAVAILABLE, within --retry_seconds; exits on any other failure.
  template <typename Call>
  void Retried(Retrier& retrier, const std::string& what, Call call) {
    Outage outage(retrier);
    while (true) {
      const grpc::Status status = call();
      if (status.ok()) return;
      // A signal cancelled the call (each registers its context).
      if (Interrupts::interrupted()) std::exit(130);
      std::string why;
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE) {
        Die(absl::StrCat(what, ": ", Describe(status)));
      }
      if (!outage.Wait(what, Describe(status), &why)) {
        if (Interrupts::interrupted()) std::exit(130);
        Die(why);
      }
    }
  }

  drt::v1::ModelInfo GetModelInfo(Retrier& retrier) {
    drt::v1::ModelInfo info;
    Retried(retrier, "GetModelInfo", [&] {
      auto context = NewContext(kUnaryDeadlineSeconds);
      Interrupts interrupts(context.get());
      return stub_->GetModelInfo(context.get(), {}, &info);
    });
    return info;
  }

  drt::v1::TokenizeResponse Tokenize(Retrier& retrier, const drt::v1::TokenizeRequest& request) {
    drt::v1::TokenizeResponse response;
    Retried(retrier, "Tokenize", [&] {
      auto context = NewContext(kUnaryDeadlineSeconds);
      Interrupts interrupts(context.get());
      return stub_->Tokenize(context.get(), request, &response);
    });
    return response;
  }

  drt::v1::DetokenizeResponse Detokenize(Retrier& retrier,
                                         const drt::v1::DetokenizeRequest& request) {
    drt::v1::DetokenizeResponse response;
    Retried(retrier, "Detokenize", [&] {
      auto context = NewContext(kUnaryDeadlineSeconds);
      Interrupts interrupts(context.get());
      return stub_->Detokenize(context.get(), request, &response);
    });
    return response;
  }

  std::string CreateSession(Retrier& retrier) {
    drt::v1::CreateSessionResponse response;
    Retried(retrier, "CreateSession", [&] {
      auto context = NewContext(kUnaryDeadlineSeconds);
      // A signal while a stuck server holds the call cancels it at once
      // (review-tools #9: it waited out the 30 s deadline). If the server
      // made the session anyway, its id never reached the client: it
      // expires after its idle TTL.
      Interrupts interrupts(context.get());
      // The sampling goes with CreateSession too (the session's defaults):
      // the server refuses a bad value now, with Generate's message, not
      // after the whole prompt (review-grpc finding 13).
      drt::v1::CreateSessionRequest request;
      *request.mutable_sampling() = SamplingFromFlags();
      return stub_->CreateSession(context.get(), request, &response);
    });
    return response.session_id();
  }

  // Retried on UNAVAILABLE; NOT_FOUND after a retry means an earlier attempt
  // deleted it (its answer was lost). Empty when deleted, else why not.
  std::string DeleteSession(const std::string& id, Retrier& retrier) {
    Outage outage(retrier);
    for (int attempt = 1;; ++attempt) {
      auto context = NewContext(10);
      Interrupts interrupts(context.get(), /*after_signal_too=*/true);
      drt::v1::DeleteSessionRequest request;
      request.set_session_id(id);
      drt::v1::DeleteSessionResponse response;
      const grpc::Status status = stub_->DeleteSession(context.get(), request, &response);
      if (status.ok() || (status.error_code() == grpc::StatusCode::NOT_FOUND && attempt > 1)) {
        return "";
      }
      std::string why = Describe(status);
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
          !outage.Wait("DeleteSession", Describe(status), &why)) {
        return why;
      }
    }
  }

  // Cancelled by a signal (it runs during an outage, when the wait can be
  // long: a server that accepts connections but does not answer).
  grpc::Status GetSession(const std::string& id, drt::v1::SessionInfo& info) {
    auto context = NewContext(kUnaryDeadlineSeconds);
    Interrupts interrupts(context.get());
    drt::v1::GetSessionRequest request;
    request.set_session_id(id);
    return stub_->GetSession(context.get(), request, &info);
  }

  // The session's info once the server answers and the session is not busy
  // (a call cut by a dropped connection, not by a restart, may still be
  // ending on the server); nullopt with *why when the client gives up. `cut`
  // describes the cut call.
  bool SessionWhenIdle(const std::string& id, Outage& outage, const std::string& cut,
                       drt::v1::SessionInfo& info, std::string* why) {
    while (true) {
      const grpc::Status status = GetSession(id, info);
      // A server shutting down cancels the calls it holds (CANCELLED), and
      // GetSession is read-only, so that is waited out like UNAVAILABLE;
      // a CANCELLED from our own signal is not (the client is stopping).
      const bool going_away =
          status.error_code() == grpc::StatusCode::UNAVAILABLE ||
          (status.error_code() == grpc::StatusCode::CANCELLED && !Interrupts::interrupted());
      if (going_away) {
        if (!outage.Wait("GetSession", Describe(status), why)) return false;
        continue;
      }
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        *why = absl::StrCat(cut, ", and session ", id, " is gone (", status.error_message(),
                            "): the server keeps sessions across a restart only with --state_dir, "
                            "or a gateway routed this call to another replica. Create a new "
                            "session and send the prompt again");
        return false;
      }
      if (!status.ok()) {
        *why = absl::StrCat(cut, "; GetSession: ", Describe(status));
        return false;
      }
      if (!info.busy()) return true;
      if (!outage.Wait("GetSession", "the session is still busy with the cut call", why)) {
        return false;
      }
    }
  }

  // Streams the prompt into a session that held `base_tokens`. An Append cut
  // (StreamCut) is not sent again whole: what the server acknowledged is
  // on disk with --state_dir (and perhaps a little more: a step written whose
  // acknowledgement was lost), so the client waits for the server, asks
  // GetSession how many tokens the session holds and sends the prompt from
  // there. On failure *why says what happened (the call's status for other
  // errors).
  bool AppendResumed(const std::string& session_id, const Prompt& prompt, bool bytes_tokenizer,
                     int64_t base_tokens, Retrier& retrier, drt::v1::AppendSummary& summary,
                     double& seconds, int& resumes, std::string* why) {
    const auto start = Clock::now();
    ProgressBar bar(prompt.expected_tokens);
    Outage outage(retrier);
    int64_t held = 0;               // prompt tokens in the session when this call began
    int64_t acked = base_tokens;    // the session's tokens at the last acknowledgement
    resumes = 0;
    PromptPart part = WholePrompt(prompt);
    while (true) {
      // Acknowledgements above what the session held when this call began
      // are this call's progress.
      acked = base_tokens + held;
      const grpc::Status status = AppendOnce(session_id, part, bar, held, acked, summary);
      if (status.ok()) {
        summary.set_tokens_ingested(summary.session_tokens() - base_tokens);
        seconds = Seconds(Clock::now() - start);
        return true;
      }
      if (!StreamCut(status)) {
        *why = Describe(status);
        return false;
      }
      const int64_t acknowledged = acked - base_tokens;
      const std::string cut = absl::StrCat(
          "the Append was cut (", Describe(status), ") after the server acknowledged ",
          Commas(acknowledged), " tokens of this prompt");
      // Progress in the cut call: this outage's bound counts from this cut,
      // not from an earlier one (it counted the time the server was up and
      // taking the prompt too, so a long call between two short outages
      // could end the retries at once).
      if (acknowledged > held) outage.Reset();
      drt::v1::SessionInfo info;
      if (!outage.Wait("Append", Describe(status), why) ||
          !SessionWhenIdle(session_id, outage, cut, info, why)) {
        if (!absl::StrContains(*why, cut)) {
          *why = absl::StrCat(*why, "; ", cut, " (they are in session ", session_id, ")");
        }
        return false;
      }
      const int64_t now_held = info.tokens() - base_tokens;
      if (now_held < acknowledged) {
        std::fprintf(stderr,
                     "drt-client: warning: session %s holds %s tokens of this prompt, fewer than "
                     "the %s acknowledged (the server lost acknowledged tokens); resuming from "
                     "what it holds\n",
                     session_id.c_str(), Commas(now_held).c_str(), Commas(acknowledged).c_str());
      }
      // Progress whose acknowledgement was lost: the next cut's bound counts
      // from that cut.
      if (now_held > held) outage.Reset();
      std::string cannot;
      std::optional<PromptPart> rest = PromptAfter(prompt, now_held, bytes_tokenizer, &cannot);
      if (!rest) {
        *why = absl::StrCat(cut, "; session ", session_id, " holds ", Commas(now_held),
                            " of them now and cannot be resumed: ", cannot,
                            ". Append the rest yourself from there (--keep_session keeps the "
                            "session), or start again");
        return false;
      }
      held = now_held;
      ++resumes;
      std::fprintf(stderr,
                   "drt-client: resuming the Append at prompt token %s (session %s holds %s "
                   "tokens; %s of the prompt were acknowledged before the cut)\n",
                   Commas(held).c_str(), session_id.c_str(), Commas(info.tokens()).c_str(),
                   Commas(acknowledged).c_str());
      std::fflush(stderr);
      if (rest->ids.empty() && rest->text.empty()) {
        // All of it was in before the cut: only the summary was lost.
        summary.Clear();
        summary.set_tokens_ingested(held);
        summary.set_session_tokens(info.tokens());
        summary.set_session_chunks(info.chunks());
        seconds = Seconds(Clock::now() - start);
        return true;
      }
      part = *std::move(rest);
    }
  }

  // Scored tokens and their summed logprob over the prompt's Append calls
  // (--prompt_logprobs); NaN marks a token with no logits before it.
  int64_t scored_tokens() const { return scored_tokens_; }
  double logprob_sum() const { return logprob_sum_; }
  void NotePromptLogprobs(const drt::v1::PromptLogprobs& scores) {
    for (int k = 0; k < scores.token_ids_size(); ++k) {
      const float logprob = scores.logprobs(k);
      if (!std::isnan(logprob)) {
        ++scored_tokens_;
        logprob_sum_ += logprob;
      }
      if (!absl::GetFlag(FLAGS_print_logprobs)) continue;
      std::string top;
      if (k < scores.top_logprobs_size()) {
        for (const auto& alternative : scores.top_logprobs(k).alternatives()) {
          absl::StrAppendFormat(&top, " %d:%.4f", alternative.token_id(), alternative.logprob());
        }
      }
      std::printf("logprob %lld %d %.6f%s\n",
                  static_cast<long long>(scores.first_token_index() + k), scores.token_ids(k),
                  logprob, top.c_str());
    }
  }

  // One Append call of `part`; `acked` follows the session's tokens as the
  // server acknowledges them.
  grpc::Status AppendOnce(const std::string& session_id, const PromptPart& part, ProgressBar& bar,
                          int64_t offset, int64_t& acked, drt::v1::AppendSummary& summary) {
    auto context = NewContext(absl::GetFlag(FLAGS_deadline));
    Interrupts interrupts(context.get());
    IdleWatchdog watchdog(context.get(), absl::GetFlag(FLAGS_idle_timeout));
    auto stream = stub_->Append(context.get());
    // The sync API allows one thread writing while another reads.
    std::thread writer([&] {
      drt::v1::AppendRequest request;
      request.set_session_id(session_id);
      if (absl::GetFlag(FLAGS_prompt_logprobs) >= 0) {
        request.set_prompt_logprobs(absl::GetFlag(FLAGS_prompt_logprobs));
      }
      const size_t piece_tokens = absl::GetFlag(FLAGS_piece_tokens);
      for (size_t i = 0; i < part.ids.size(); i += piece_tokens) {
        const size_t n = std::min(piece_tokens, part.ids.size() - i);
        request.mutable_tokens()->mutable_ids()->Assign(part.ids.begin() + i,
                                                        part.ids.begin() + i + n);
        if (!stream->Write(request)) return;  // the server ended the call; Finish says why
        request.clear_session_id();
        request.clear_prompt_logprobs();
      }
      std::string_view rest = part.text;
      while (!rest.empty()) {
        const size_t n = Utf8Cut(rest, absl::GetFlag(FLAGS_piece_bytes));
        request.set_text(std::string(rest.substr(0, n)));
        rest.remove_prefix(n);
        if (!stream->Write(request)) return;
        request.clear_session_id();
        request.clear_prompt_logprobs();
      }
      stream->WritesDone();
    });
    drt::v1::AppendResponse response;
    drt::v1::AppendProgress last;
    bool any_progress = false;
    bool any_summary = false;
    while (stream->Read(&response)) {
      watchdog.Poke();
      if (response.has_progress()) {
        last = response.progress();
        acked = last.session_tokens();
        any_progress = true;
        bar.Update(last, /*final=*/false, offset);
      } else if (response.has_summary()) {
        summary = response.summary();
        acked = summary.session_tokens();
        any_summary = true;
      } else if (response.has_prompt_logprobs()) {
        NotePromptLogprobs(response.prompt_logprobs());
      }
    }
    writer.join();
    grpc::Status status = watchdog.Explain(stream->Finish());
    if (status.ok() && !any_summary) {
      status =
          grpc::Status(grpc::StatusCode::INTERNAL, "the Append stream ended without a summary");
    }
    if (!status.ok()) {
      bar.Abort();
    } else if (any_progress) {
      bar.Update(last, /*final=*/true, offset);
    }
    return status;
  }

  struct Answer {
    std::string text;
    drt::v1::GenerateDone done;
    int64_t tokens = 0;
    int64_t pieces = 0;  // piece messages that reached the client
    double ttft = NAN, tpot = NAN;
    // --top_logprobs: one line per generated token, printed after the answer.
    std::vector<std::string> logprob_lines;
  };

  // Generate, sent again after a cut (StreamCut) only when that is the same as the
  // first try: the session holds exactly its `base_tokens` (a durable server
  // continues a session exactly, so the same request and seed give the same
  // answer). A durable server writes a Generate all or nothing when it ends
  // (docs/api.md, "Durable sessions"): a crash during it leaves the session
  // as it was, even after pieces reached the client, and those are then not
  // printed twice. A Generate that ended (a drain, the server seeing the
  // cut) leaves its tokens in the session, and generating again would
  // continue after them: not repeated.
  bool GenerateRetried(const std::string& session_id, int64_t base_tokens, Retrier& retrier,
                       Answer& answer, std::string* why) {
    Outage outage(retrier);
    std::string printed;  // the answer's text an earlier try printed
    // However it returns, `answer.text` holds at least what was printed, so
    // the caller closes the answer's line before an error also when the
    // last try printed nothing but an earlier one did (each try resets it).
    struct KeepPrinted {
      Answer& answer;
      const std::string& printed;
      ~KeepPrinted() {
        if (answer.text.size() < printed.size()) answer.text = printed;
      }
    } keep{answer, printed};
    while (true) {
      answer = Answer();
      std::string differs;
      const grpc::Status status = Generate(session_id, answer, printed, &differs);
      if (status.ok()) return true;
      if (!differs.empty()) {
        *why = differs;
        return false;
      }
      if (answer.text.size() > printed.size()) printed = answer.text;
      if (!StreamCut(status)) {
        *why = Describe(status);
        return false;
      }
      std::string cut = absl::StrCat("the Generate was cut (", Describe(status), ")");
      if (answer.pieces > 0) {
        absl::StrAppend(&cut, " after ", answer.pieces, " answer piece",
                        answer.pieces == 1 ? "" : "s", " reached the client");
      }
      drt::v1::SessionInfo info;
      if (!outage.Wait("Generate", Describe(status), why) ||
          !SessionWhenIdle(session_id, outage, cut, info, why)) {
        return false;
      }
      if (info.tokens() < base_tokens) {
        *why = absl::StrCat(cut, "; session ", session_id, " holds ", Commas(info.tokens()),
                            " tokens, fewer than the ", Commas(base_tokens),
                            " acknowledged before it (the server lost acknowledged tokens: ",
                            "the last ", Commas(base_tokens - info.tokens()),
                            " of the prompt are gone), so generating again would answer a shorter "
                            "prompt: not retried");
        return false;
      }
      if (info.tokens() != base_tokens) {
        *why = absl::StrCat(cut, "; session ", session_id, " now holds ",
                            Commas(info.tokens() - base_tokens),
                            " tokens more than before it (the Generate's padding and generated "
                            "tokens, written as it ended), so generating again would not repeat "
                            "it: not retried");
        return false;
      }
      std::fprintf(stderr,
                   "drt-client: %s; session %s holds what it held before the Generate (%s "
                   "tokens); sending the Generate again\n",
                   cut.c_str(), session_id.c_str(), Commas(info.tokens()).c_str());
      std::fflush(stderr);
    }
  }

  // `printed`: the answer's text an earlier try of the same Generate printed;
  // this one's repeats it (same request, seed and session state), and only
  // what follows it is printed. A different start ends the call (ABORTED)
  // and says so in `differs`.
  grpc::Status Generate(const std::string& session_id, Answer& answer,
                        const std::string& printed, std::string* differs) {
    drt::v1::GenerateRequest request;
    request.set_session_id(session_id);
    request.set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
    *request.mutable_sampling() = SamplingFromFlags();
    for (const std::string& stop : stops_) request.add_stop(stop);
    if (const std::string pad = absl::GetFlag(FLAGS_pad_to_chunk_boundary); pad != "model") {
      request.set_pad_to_chunk_boundary(pad == "true");
    }
    if (const int32_t top = absl::GetFlag(FLAGS_top_logprobs); top > 0) {
      request.set_return_logprobs(true);
      request.set_top_logprobs(top);
    }
    answer.logprob_lines.clear();  // a try sent again repeats the answer from its start

    auto context = NewContext(absl::GetFlag(FLAGS_deadline));
    Interrupts interrupts(context.get());
    IdleWatchdog watchdog(context.get(), absl::GetFlag(FLAGS_idle_timeout));
    Clock::time_point first, last;
    const auto start = Clock::now();
    auto stream = stub_->Generate(context.get(), request);
    drt::v1::GenerateResponse response;
    while (stream->Read(&response)) {
      watchdog.Poke();
      if (response.has_piece()) {
        ++answer.pieces;
        const auto now = Clock::now();
        if (response.piece().token_ids_size() > 0) {
          if (answer.tokens == 0) first = now;
          last = now;
          answer.tokens += response.piece().token_ids_size();
        }
        const auto& tops = response.piece().top_logprobs();
        for (int i = 0; i < tops.size() && i < response.piece().token_ids_size() &&
                        i < response.piece().logprobs_size();
             ++i) {
          std::string line = absl::StrFormat(
              "  %6d %10s %9.4f  top:", response.piece().token_ids(i),
              absl::StrCat("\"", absl::CHexEscape(tops[i].token_bytes()), "\""),
              response.piece().logprobs(i));
          for (const drt::v1::TokenLogprob& alternative : tops[i].alternatives()) {
            absl::StrAppendFormat(&line, " \"%s\"=%.4f", absl::CHexEscape(alternative.token_bytes()),
                                  alternative.logprob());
          }
          answer.logprob_lines.push_back(std::move(line));
        }
        const std::string& piece = response.piece().text();
        const size_t at = answer.text.size();
        answer.text += piece;
        // What an earlier try printed already is not printed again.
        const size_t repeated =
            at < printed.size() ? std::min(piece.size(), printed.size() - at) : 0;
        if (repeated > 0 && piece.compare(0, repeated, printed, at, repeated) != 0) {
          *differs = "the Generate sent again answered differently from its first try: the "
                     "session did not hold what it held before the first try";
          context->TryCancel();
          while (stream->Read(&response)) {}
          (void)stream->Finish();
          return grpc::Status(grpc::StatusCode::ABORTED, *differs);
        }
        std::fwrite(piece.data() + repeated, 1, piece.size() - repeated, stdout);
        std::fflush(stdout);
      } else if (response.has_done()) {
        answer.done = response.done();
      }
    }
    if (answer.tokens > 0) answer.ttft = Seconds(first - start);
    if (answer.tokens > 1) answer.tpot = Seconds(last - first) / (answer.tokens - 1);
    grpc::Status status = watchdog.Explain(stream->Finish());
    // A failed call leaves the line open: a retry continues it.
    if (status.ok()) std::printf("\n");
    return status;
  }

 private:
  static std::string GrpcCodeName(grpc::StatusCode code) {
    static const char* const kNames[] = {
        "OK",      "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",   "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
    const int i = static_cast<int>(code);
    return i >= 0 && i < 17 ? kNames[i] : absl::StrCat("code ", i);
  }

  // No call may hang forever: a gateway that accepts the connection while
  // its upstream hangs, or a wedged server, must not hold the client (and
  // the scripts that run it). Unary calls get this deadline; the streams get
  // an IdleWatchdog and, with --deadline, a total deadline.
  static constexpr double kUnaryDeadlineSeconds = 30;

  // deadline_seconds 0: no deadline.
  std::unique_ptr<grpc::ClientContext> NewContext(double deadline_seconds) {
    auto context = std::make_unique<grpc::ClientContext>();
    if (deadline_seconds > 0) {
      context->set_deadline(std::chrono::system_clock::now() +
                            std::chrono::microseconds(static_cast<int64_t>(deadline_seconds * 1e6)));
    }
    if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
    context->AddMetadata(kSessionHeader, session_key_);
    return context;
  }

  std::unique_ptr<drt::v1::Drt::Stub> stub_;
  int64_t scored_tokens_ = 0;   // NotePromptLogprobs
  double logprob_sum_ = 0.0;
  std::string token_;
  std::string session_key_;
  std::vector<std::string> stops_;  // --stop, each verbatim
};

// `prompt_text`: --prompt_file's contents (empty without one); `token_ids`:
// --token_ids's ids (empty without one); `stops`: every --stop.
int Run(std::string prompt_text, std::vector<int32_t> token_ids, std::vector<std::string> stops) {
  std::string session_key = absl::GetFlag(FLAGS_session_key);
  if (session_key.empty()) session_key = RandomSessionKey();
  if (!IsValidSessionKey(session_key)) {
    Die("--session_key: must be printable ASCII (it is sent as gRPC metadata)");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (const std::string ca = absl::GetFlag(FLAGS_tls_ca); !ca.empty()) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ReadFile(ca);
    credentials = grpc::SslCredentials(options);
  }
  const std::string server = absl::GetFlag(FLAGS_server);
  // gRPC reconnects a lost connection by itself, waiting longer after each
  // failed attempt (up to 120 s by default); calls made meanwhile fail at
  // once with UNAVAILABLE. Capped at the client's own longest retry delay, so
  // that a server back after a long outage is found within about that.
  grpc::ChannelArguments channel_args;
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                      static_cast<int>(kRetryMaxDelaySeconds * 1000));
  auto channel = grpc::CreateCustomChannel(server, credentials, channel_args);
  const double timeout = absl::GetFlag(FLAGS_connect_timeout);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::milliseconds(std::llround(1000 * timeout)))) {
    // One call that does not wait for the connection says why there is none
    // (connection refused, no such host, TLS, ...); should it succeed, the
    // server came up just now.
    grpc::ClientContext probe;
    probe.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(kConnectProbeSeconds));
    drt::v1::ModelInfo info;
    const grpc::Status why = drt::v1::Drt::NewStub(channel)->GetModelInfo(
        &probe, drt::v1::GetModelInfoRequest(), &info);
    if (!why.ok()) {
      Die(absl::StrFormat("cannot reach drt-server at %s within %g s: %s", server, timeout,
                          why.error_message()));
    }
  }
  std::string token = absl::GetFlag(FLAGS_token);
  if (const char* env = std::getenv("DRT_BEARER_TOKEN"); token.empty() && env != nullptr) token = env;
  Client client(channel, token, session_key, std::move(stops));
  Retrier retrier(absl::GetFlag(FLAGS_retry_seconds), server);

  if (absl::GetFlag(FLAGS_tokenize)) {
    drt::v1::TokenizeRequest request;
    request.set_text_bytes(std::move(prompt_text));
    request.set_count_only(absl::GetFlag(FLAGS_count_only));
    const drt::v1::TokenizeResponse response = client.Tokenize(retrier, request);
    std::printf("%lld tokens (context limit %lld)\n", static_cast<long long>(response.count()),
                static_cast<long long>(response.max_context_tokens()));
    if (!request.count_only()) {
      std::string line;
      for (int i = 0; i < response.ids_size(); ++i) {
        absl::StrAppend(&line, i > 0 ? " " : "", response.ids(i));
      }
      std::printf("%s\n", line.c_str());
    }
    return 0;
  }
  if (absl::GetFlag(FLAGS_detokenize)) {
    drt::v1::DetokenizeRequest request;
    request.mutable_ids()->Add(token_ids.begin(), token_ids.end());
    const drt::v1::DetokenizeResponse response = client.Detokenize(retrier, request);
    std::fwrite(response.text_bytes().data(), 1, response.text_bytes().size(), stdout);
    if (response.ids_without_text() > 0) {
      std::fprintf(stderr, "drt-client: %lld ids have no text (end-of-text, or not spelled by the "
                   "tokenizer)\n", static_cast<long long>(response.ids_without_text()));
    }
    return 0;
  }
  const drt::v1::ModelInfo info = client.GetModelInfo(retrier);
  std::printf("model: %s on %s, vocab %s (%s), chunks of %lld, top-k %lld, window %lld, "
              "context limit %s tokens\n",
              info.name().c_str(), info.device().c_str(), Commas(info.vocab_size()).c_str(),
              info.tokenizer().c_str(), static_cast<long long>(info.enc_chunk_size()),
              static_cast<long long>(info.chunk_topk()), static_cast<long long>(info.slide_window()),
              Commas(info.max_context_tokens()).c_str());
  if (const std::string path = absl::GetFlag(FLAGS_token_ids); !path.empty()) {
    CheckTokenIds(path, token_ids, info);
  }
  CheckGenerationLimits(info);
  const Prompt prompt = MakePrompt(info, std::move(prompt_text), std::move(token_ids));
  std::printf("prompt: %s\n", prompt.description.c_str());

  const std::string session_id = client.CreateSession(retrier);
  std::printf("session: %s (%s: %s)\n", session_id.c_str(), kSessionHeader, session_key.c_str());
  std::fflush(stdout);
  // Deletes the session however Run returns.
  struct Cleanup {
    Client& client;
    const std::string& id;
    Retrier& retrier;
    ~Cleanup() {
      if (absl::GetFlag(FLAGS_keep_session)) return;
      if (const std::string why = client.DeleteSession(id, retrier); !why.empty()) {
        std::fprintf(stderr, "drt-client: could not delete session %s: %s\n", id.c_str(),
                     why.c_str());
      }
    }
  } cleanup{client, session_id, retrier};

  drt::v1::AppendSummary summary;
  double append_seconds = 0;
  int resumes = 0;
  std::string why;
  // A new session holds no tokens.
  if (!client.AppendResumed(session_id, prompt, info.tokenizer() == "bytes", /*base_tokens=*/0,
                            retrier, summary, append_seconds, resumes, &why)) {
    if (Interrupts::interrupted()) return 130;
    std::fprintf(stderr, "drt-client: %s\n", why.c_str());
    return 1;
  }
  std::printf("append: %s tokens, %s chunks in %.2f s: %s tokens/s (server: %s tokens/s%s)%s\n",
              Commas(summary.tokens_ingested()).c_str(), Commas(summary.session_chunks()).c_str(),
              append_seconds, Commas(std::llround(summary.tokens_ingested() / append_seconds)).c_str(),
              Commas(std::llround(summary.tokens_per_second())).c_str(),
              resumes > 0 ? " in its last call" : "",
              resumes > 0 ? absl::StrFormat(", resumed %d time%s after a cut", resumes,
                                            resumes == 1 ? "" : "s").c_str()
                          : "");
  if (absl::GetFlag(FLAGS_prompt_logprobs) >= 0) {
    const int64_t count = client.scored_tokens();
    std::printf("prompt logprobs: %s tokens scored, sum %.4f, perplexity %.4f\n",
                Commas(count).c_str(), client.logprob_sum(),
                count > 0 ? std::exp(-client.logprob_sum() / count) : std::nan(""));
  }
  std::printf("answer: ");
  std::fflush(stdout);
  Client::Answer answer;
  if (!client.GenerateRetried(session_id, summary.session_tokens(), retrier, answer, &why)) {
    if (!answer.text.empty()) std::printf("\n");  // (the answer's line, left open)
    if (Interrupts::interrupted()) return 130;
    std::fprintf(stderr, "drt-client: %s\n", why.c_str());
    return 1;
  }

  std::string reason = drt::v1::FinishReason_Name(answer.done.finish_reason());
  reason = absl::AsciiStrToLower(absl::StripPrefix(reason, "FINISH_REASON_"));
  const drt::v1::GenerateTimings& t = answer.done.timings();
  std::printf("generate: %lld tokens, finish reason %s\n", static_cast<long long>(answer.tokens),
              reason.c_str());
  std::printf("  time to first token:   %s (server: %s)\n", Ms(answer.ttft).c_str(),
              Ms(t.time_to_first_token_seconds()).c_str());
  std::printf("  time per output token: %s (server: %s)\n", Ms(answer.tpot).c_str(),
              Ms(t.time_per_output_token_seconds()).c_str());
  if (const int32_t top = absl::GetFlag(FLAGS_top_logprobs); top > 0) {
    std::printf("logprobs (temperature 1; token id, its bytes, its logprob, the %d most likely):\n",
                top);
    for (const std::string& line : answer.logprob_lines) std::printf("%s\n", line.c_str());
  }
  if (prompt.passkey.empty()) return 0;
  // Right means: the first number in the answer is the pass key.
  const size_t begin = answer.text.find_first_of("0123456789");
  const std::string answered =
      begin == std::string::npos
          ? "no number"
          : answer.text.substr(begin, answer.text.find_first_not_of("0123456789", begin) - begin);
  const bool found = answered == prompt.passkey;
  std::printf("answer correct: %s (pass key %s, answered %s)\n", found ? "yes" : "no",
              prompt.passkey.c_str(), answered.c_str());
  return absl::GetFlag(FLAGS_require_passkey) && !found ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> stops = TakeStops(argc, argv);
  const std::vector<char*> rest = drt::cli::ParseCommandLine(
      {"drt-client",
       "streams a long prompt (a haystack with a hidden pass key, a text file or token ids) "
       "into a drt-server session with a progress bar, then streams the answer and prints "
       "timings.\n"
       "  drt-client --server 127.0.0.1:50051 --haystack_tokens 100000 --max_tokens 64",
       {"client_examples/cpp/drt_client.cc"}},
      argc, argv);
  if (rest.size() > 1) Die(absl::StrCat("unexpected argument '", rest[1], "'"));
  const double depth = absl::GetFlag(FLAGS_depth);
  if (depth < 0 || depth > 1) Die("--depth must be within [0, 1]");
  if (absl::GetFlag(FLAGS_haystack_tokens) < 1 || absl::GetFlag(FLAGS_piece_bytes) < 4 ||
      absl::GetFlag(FLAGS_piece_tokens) < 1 || absl::GetFlag(FLAGS_max_tokens) < 1) {
    Die("--haystack_tokens, --piece_bytes (>= 4), --piece_tokens and --max_tokens must be positive");
  }
  if (const int32_t top = absl::GetFlag(FLAGS_top_logprobs); top < 0 || top > 20) {
    Die(absl::StrCat("--top_logprobs must be in [0, 20], got ", top));
  }
  // The tokenizer modes' flags, before anything is read or connected (the
  // tokenize/detokenize paths make no Generate request).
  if (absl::GetFlag(FLAGS_tokenize) && absl::GetFlag(FLAGS_detokenize)) {
    Die("--tokenize and --detokenize exclude each other");
  }
  if (absl::GetFlag(FLAGS_tokenize) && absl::GetFlag(FLAGS_prompt_file).empty()) {
    Die("--tokenize needs --prompt_file (the text to tokenize)");
  }
  if (absl::GetFlag(FLAGS_detokenize) && absl::GetFlag(FLAGS_token_ids).empty()) {
    Die("--detokenize needs --token_ids (the ids to spell)");
  }
  if (absl::GetFlag(FLAGS_count_only) && !absl::GetFlag(FLAGS_tokenize)) {
    Die("--count_only goes with --tokenize");
  }
  // Checked here, before any session is created: the server would refuse it
  // only after the client made one.
  if (const int32_t top = absl::GetFlag(FLAGS_prompt_logprobs); top < -1 || top > 20) {
    Die(absl::StrCat("--prompt_logprobs must be in [0, 20] or -1 (off), got ", top));
  }
  if (!absl::GetFlag(FLAGS_prompt_file).empty() && !absl::GetFlag(FLAGS_token_ids).empty()) {
    Die("--prompt_file and --token_ids exclude each other");
  }
  if (const std::string pad = absl::GetFlag(FLAGS_pad_to_chunk_boundary);
      pad != "model" && pad != "true" && pad != "false") {
    Die(absl::StrCat("--pad_to_chunk_boundary must be true, false or model, got '", pad, "'"));
  }
  if (auto bias = ParseLogitBias(absl::GetFlag(FLAGS_logit_bias)); !bias.ok()) {
    Die(std::string(bias.status().message()));
  }
  const std::string passkey = absl::GetFlag(FLAGS_passkey);
  if (passkey.find_first_not_of("0123456789") != std::string::npos) Die("--passkey must be digits");
  if (!(absl::GetFlag(FLAGS_deadline) >= 0)) Die("--deadline must be positive, or 0 for none");
  if (!(absl::GetFlag(FLAGS_idle_timeout) > 0)) Die("--idle_timeout must be positive");
  if (!(absl::GetFlag(FLAGS_retry_seconds) >= 0)) {
    Die("--retry_seconds must be positive, or 0 for no retries");
  }
  // The haystack's options mean nothing with a prompt of one's own; a script
  // that passes --require_passkey there would pass whatever the answer.
  if (!absl::GetFlag(FLAGS_prompt_file).empty() || !absl::GetFlag(FLAGS_token_ids).empty()) {
    const auto changed = [](const absl::CommandLineFlag& flag) {
      return flag.CurrentValue() != flag.DefaultValue();
    };
    for (const absl::CommandLineFlag* flag :
         {&absl::GetFlagReflectionHandle(FLAGS_require_passkey),
          &absl::GetFlagReflectionHandle(FLAGS_passkey), &absl::GetFlagReflectionHandle(FLAGS_depth),
          &absl::GetFlagReflectionHandle(FLAGS_haystack_tokens)}) {
      if (changed(*flag)) {
        Die(absl::StrCat("--", flag->Name(),
                         " needs the generated haystack (no --prompt_file or --token_ids)"));
      }
    }
  }
  // Bad input is refused before anything is sent, as the Python client does.
  if (const std::string from_flagfile = absl::GetFlag(FLAGS_stop); !from_flagfile.empty()) {
    stops.push_back(from_flagfile);
  }
  for (const std::string& stop : stops) {
    // The server refuses both, but only at the Generate, after the Append.
    if (stop.empty()) Die("--stop: a stop sequence must not be empty");
    if (const auto bad = FirstInvalidUtf8(stop)) {
      Die(absl::StrFormat("--stop: not UTF-8 at byte %d (%s)", bad->offset, bad->reason));
    }
  }
  if (const auto bad = FirstInvalidUtf8(absl::GetFlag(FLAGS_question))) {
    Die(absl::StrFormat("--question: not UTF-8 at byte %d (%s)", bad->offset, bad->reason));
  }
  std::string prompt_text;
  if (const std::string path = absl::GetFlag(FLAGS_prompt_file); !path.empty()) {
    prompt_text = ReadFile(path);
    if (const auto bad = FirstInvalidUtf8(prompt_text)) {
      Die(absl::StrFormat("--prompt_file %s: not UTF-8 at byte %s (%s); the server takes text as "
                          "UTF-8",
                          path, Commas(bad->offset), bad->reason));
    }
  }
  std::vector<int32_t> token_ids;
  if (const std::string path = absl::GetFlag(FLAGS_token_ids); !path.empty()) {
    token_ids = ReadTokenIds(path);
  }
  // A session prompt with nothing in it: the server refused the first Append
  // with "Append needs at least one message naming the session", after the
  // client had made the session (review-tools 2026-11-25 #8).
  const bool session_mode = !absl::GetFlag(FLAGS_tokenize) && !absl::GetFlag(FLAGS_detokenize);
  if (session_mode && absl::GetFlag(FLAGS_question).empty()) {
    if (const std::string path = absl::GetFlag(FLAGS_prompt_file); !path.empty() && prompt_text.empty()) {
      Die(absl::StrCat("--prompt_file ", path, " is empty (and no --question): there is no prompt to send"));
    }
    if (const std::string path = absl::GetFlag(FLAGS_token_ids); !path.empty() && token_ids.empty()) {
      Die(absl::StrCat("--token_ids ", path, " holds no token ids (and no --question): there is no prompt "
                       "to send"));
    }
  }
  Interrupts::Install();
  return Run(std::move(prompt_text), std::move(token_ids), std::move(stops));
}
