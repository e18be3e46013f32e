// A Backend that runs another backend's sessions unchanged but lets a test
// make the per-session hooks answer as a GPU backend's may: refuse one
// session in Backend::PrepareSessionForStep (the CUDA device tier's store
// finding no room to grow) or report host bytes a fork may allocate
// (BackendSession::fork_host_bytes_at_most, the CUDA auto tier), or report
// scripted memory figures (BackendSession::memory), or run a hook as a
// session is freed (WrappedSession::on_destroyed). Everything else, durable
// state included (ExportState, ImportState, the disk tier's MapChunks), is
// the wrapped backend's own work, so results can be compared with it to the
// bit.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend.h"

namespace drt::testing {

class WrappedSession final : public BackendSession {
 public:
  explicit WrappedSession(std::unique_ptr<BackendSession> inner) : inner_(std::move(inner)) {}
  // Runs on_destroyed first (on the thread that frees the session).
  ~WrappedSession() override {
    if (on_destroyed) on_destroyed();
  }

  // Called as the session is freed, before its memory goes.
  std::function<void()> on_destroyed;

  BackendSession& inner() { return *inner_; }
  // What memory() answers from now on (nullopt: the inner session's).
  void set_memory(std::optional<SessionMemory> memory) { memory_ = memory; }
  // What fork_host_bytes_at_most() answers.
  void set_fork_host_bytes(int64_t bytes) { fork_host_bytes_ = bytes; }

  int64_t position() const override { return inner_->position(); }
  int64_t num_chunks() const override { return inner_->num_chunks(); }
  SessionMemory memory() const override { return memory_ ? *memory_ : inner_->memory(); }
  std::vector<Retrieval> current_retrieval() const override {
    return inner_->current_retrieval();
  }
  void set_retrieval_observer(RetrievalObserver observer) override {
    inner_->set_retrieval_observer(std::move(observer));
  }
  bool has_retrieval_observer() const override { return inner_->has_retrieval_observer(); }
  absl::StatusOr<std::unique_ptr<BackendSession>> Fork() const override {
    auto fork = inner_->Fork();
    if (!fork.ok()) return fork.status();
    return std::unique_ptr<BackendSession>(new WrappedSession(*std::move(fork)));
  }
  int64_t fork_host_bytes_at_most() const override { return fork_host_bytes_; }
  BackendSessionStats stats() const override { return inner_->stats(); }
  // Durable state and the disk tier: the inner session's (so that a state
  // store can write and restore wrapped sessions).
  absl::Status ExportState(BackendSessionState& out) const override {
    return inner_->ExportState(out);
  }
  absl::Status ReadChunk(int64_t chunk, ChunkData& out) const override {
    return inner_->ReadChunk(chunk, out);
  }
  absl::Status ImportState(const BackendSessionState& state, int64_t num_chunks,
                           const ChunkReader& read, const ChunkMapper& map = nullptr) override {
    return inner_->ImportState(state, num_chunks, read, map);
  }
  int64_t chunk_map_unit() const override { return inner_->chunk_map_unit(); }
  absl::Status MapChunks(std::shared_ptr<const MappedChunks> chunks) override {
    return inner_->MapChunks(std::move(chunks));
  }

 private:
  std::unique_ptr<BackendSession> inner_;
  int64_t fork_host_bytes_ = 0;
  std::optional<SessionMemory> memory_;
};

class WrappingBackend final : public Backend {
 public:
  explicit WrappingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  // PrepareSessionForStep answers `status` for `session` from now on.
  void Refuse(const BackendSession* session, absl::Status status) {
    refused_[session] = std::move(status);
  }
  // PrepareSessionForStep runs the wrapped backend's for `session` on its
  // next `calls` calls, then answers `status` (a step that refuses the
  // session in its second forward: `calls` 1).
  void RefuseAfter(const BackendSession* session, int calls, absl::Status status) {
    refused_after_[session] = {calls, std::move(status)};
  }
  // PrepareSessionForStep runs the wrapped backend's for `session` again.
  void Allow(const BackendSession* session) {
    refused_.erase(session);
    refused_after_.erase(session);
  }
  // Every PrepareSessionForStep call: the session and the end position.
  const std::vector<std::pair<const BackendSession*, int64_t>>& prepared() const {
    return prepared_;
  }

  std::string name() const override { return "wrapped " + inner_->name(); }
  const ModelConfig& config() const override { return inner_->config(); }
  absl::StatusOr<std::unique_ptr<BackendSession>> NewSession() override {
    auto session = inner_->NewSession();
    if (!session.ok()) return session.status();
    return std::unique_ptr<BackendSession>(new WrappedSession(*std::move(session)));
  }
  int64_t max_step_positions() const override { return inner_->max_step_positions(); }
  int64_t host_bytes_per_chunk() const override { return inner_->host_bytes_per_chunk(); }
  bool runs_lower_only_forwards() const override { return inner_->runs_lower_only_forwards(); }
  bool runs_mixed_lower_only_forwards() const override {
    return inner_->runs_mixed_lower_only_forwards();
  }
  int64_t upper_layer_reach() const override { return inner_->upper_layer_reach(); }
  bool exports_sessions_concurrently() const override {
    return inner_->exports_sessions_concurrently();
  }
  absl::Status Step(const StepPlan& plan, absl::Span<BackendSession* const> sessions,
                    absl::Span<float> logits) override {
    std::vector<BackendSession*> inner(sessions.size());
    for (size_t i = 0; i < sessions.size(); ++i) {
      inner[i] = &static_cast<WrappedSession*>(sessions[i])->inner();
    }
    return inner_->Step(plan, inner, logits);
  }
  absl::Status PrepareSessionForStep(BackendSession& session, int64_t end_position) override {
    prepared_.emplace_back(&session, end_position);
    auto it = refused_.find(&session);
    if (it != refused_.end()) return it->second;
    if (auto later = refused_after_.find(&session); later != refused_after_.end()) {
      if (later->second.first == 0) return later->second.second;
      --later->second.first;
    }
    return inner_->PrepareSessionForStep(static_cast<WrappedSession&>(session).inner(),
                                         end_position);
  }

 private:
  std::unique_ptr<Backend> inner_;
  std::map<const BackendSession*, absl::Status> refused_;
  std::map<const BackendSession*, std::pair<int, absl::Status>> refused_after_;
  std::vector<std::pair<const BackendSession*, int64_t>> prepared_;
};

}  // namespace drt::testing
