// Session::ExportState and Session::Restore (engine/session_state.h).
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/session.h"

namespace drt {
namespace {

// Names the backend in an UNIMPLEMENTED from a backend without export.
absl::Status NameBackend(absl::Status s, const std::string& backend) {
  if (s.code() != absl::StatusCode::kUnimplemented) return s;
  return absl::UnimplementedError(absl::StrFormat(
      "the %s backend cannot export or import session state (durable sessions, SaveSession "
      "and LoadSession need the cpu backend, or the cuda backend with --cuda_state_export): %s",
      backend, s.message()));
}

}  // namespace

absl::StatusOr<SessionState> Session::ExportState() const {
  // A state holds no record of what is short: only a whole one is exported.
  if (absl::Status s = CheckStateWhole(); !s.ok()) return s;
  SessionState state;
  state.num_tokens = num_tokens_;
  state.last_logits = last_logits_;
  if (absl::Status s = backend_session_->ExportState(state.backend); !s.ok()) {
    // The backend's name is not known here; callers that have the Backend
    // name it (Restore does).
    return s;
  }
  return state;
}

// A mapping `map` refuses is no error here (MapLeadingUnits,
// engine/mapped_chunks.h): its chunks and all after it are read instead, and
// nothing reports it or checks a memory budget for them. A caller that needs
// either watches `map`, as the server's start-up restore does
// (server/restore_mapped.h; the only caller that passes a `map`).
absl::StatusOr<std::unique_ptr<Session>> Session::Restore(Backend& backend,
                                                          const SessionState& state,
                                                          const ChunkReader& read,
                                                          const ChunkMapper& map) {
  if (absl::Status s = ValidateSessionState(state, backend.config()); !s.ok()) return s;
  auto session = Create(backend);
  if (!session.ok()) return session.status();
  if (absl::Status s = (*session)->backend_session_->ImportState(
          state.backend, ClosedChunks(state, backend.config()), read, map);
      !s.ok()) {
    return NameBackend(s, backend.name());
  }
  (*session)->num_tokens_ = state.num_tokens;
  (*session)->last_logits_ = state.last_logits;
  (*session)->logits_tokens_ = state.num_tokens;  // (only whole states are exported)
  return session;
}

}  // namespace drt
