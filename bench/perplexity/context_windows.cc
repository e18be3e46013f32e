#include "bench/perplexity/context_windows.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_format.h"
#include "engine/session.h"

namespace drt::ppl {

absl::Status CheckContext(int64_t context) {
  if (context < 0 || context == 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--context must be 0 (the whole document) or at least 2 (a window's first token is not "
        "scored), got %d",
        context));
  }
  return absl::OkStatus();
}

absl::StatusOr<WindowsScored> ScoreInWindows(Backend& backend, absl::Span<const int32_t> tokens,
                                             int64_t context, int64_t piece,
                                             const ScoreCallbacks& callbacks) {
  if (absl::Status s = CheckContext(context); !s.ok()) return s;
  if (piece < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("--piece must be at least 1, got %d", piece));
  }
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t window = context == 0 ? std::max<int64_t>(total, 1) : context;

  WindowsScored done;
  for (int64_t begin = 0; begin < total; begin += window) {
    const int64_t n = std::min(window, total - begin);
    absl::StatusOr<std::unique_ptr<Session>> session = Session::Create(backend);
    if (!session.ok()) return session.status();
    // The whole document is checked in the first session, so that a bad id
    // in a late window fails before the early windows run.
    if (begin == 0) {
      if (absl::Status s = (*session)->ValidateTokens(tokens); !s.ok()) return s;
    }
    ScoreCallbacks shifted;
    if (callbacks.on_scored) {
      shifted.on_scored = [&](int64_t position, double nll) { callbacks.on_scored(begin + position, nll); };
    }
    if (callbacks.on_piece) {
      shifted.on_piece = [&](int64_t tokens_done) { callbacks.on_piece(begin + tokens_done); };
    }
    if (absl::Status s = ScoreTokens(**session, tokens.subspan(begin, n), piece, shifted); !s.ok()) {
      return s;
    }
    ++done.windows;
    done.retrievals += (*session)->retrievals();
  }
  return done;
}

}  // namespace drt::ppl
