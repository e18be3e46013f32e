// The interface every compute backend implements. The model description
// (ModelConfig + ModelWeights) is shared; a backend decides only how the ops
// execute and where the session state lives. The CPU backend (engine/cpu/) is
// the reference; a CUDA backend plugs in as kernels/ + a factory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model_config.h"
#include "engine/mapped_chunks.h"
#include "engine/model_rules.h"
#include "engine/model_weights.h"
#include "engine/step_plan.h"

namespace drt {

// Chunks chosen at one landmark for one group (drt-model.md, Forward pass 5),
// best score first. Empty for chunk 0's landmark.
struct Retrieval {
  std::vector<int64_t> chunks;
  std::vector<float> weights;  // softmax over the chosen scores
};

// Host bytes a session holds, by kind. Everything but chunk_store and
// landmarks is bounded independently of the context length. A kind the
// backend keeps in GPU memory (the CUDA backend's window rings, open chunk and
// landmarks) counts 0 here and is part of device_bytes instead.
struct SessionMemory {
  size_t window_bytes = 0;       // per-layer sliding-window K/V rings
  size_t open_chunk_bytes = 0;   // lower-layer rows of the open chunk
  size_t landmark_bytes = 0;     // one d-vector per closed chunk
  // Encoder rows of closed chunks (engine/session_state.h, ChunkData; may
  // be shared by forks).
  size_t chunk_store_bytes = 0;
  // GCA keys and values made from the encoder rows of the chunks the
  // selections read (the CPU backend's ChunkKvCache): between steps, the
  // chunks the selections in force name plus the cache's reserve.
  size_t chunk_kv_cache_bytes = 0;
  size_t selection_bytes = 0;    // current retrieval per group
  size_t shared_bytes = 0;       // of chunk_store + landmarks, shared with forks
  // Of chunk_store + landmarks + chunk_kv_cache, the part of the blocks (and
  // cache entries) shared with other sessions that those others count: a
  // block held by n sessions counts 1/n of its size in each (its holder's
  // share), so the shares of all holders add up to the block once.
  size_t shared_elsewhere_bytes = 0;
  // Encoder rows of closed chunks read from memory-mapped files (the disk tier,
  // engine/mapped_chunks.h): the page cache holds what of it is resident,
  // so it is not in total().
  size_t mapped_chunk_bytes = 0;
  // GPU memory the session holds (all kinds and its scratch); not in total(),
  // which is host memory. 0 on the CPU backend.
  size_t device_bytes = 0;
  size_t total() const {
    return window_bytes + open_chunk_bytes + landmark_bytes + chunk_store_bytes +
           chunk_kv_cache_bytes + selection_bytes;
  }
  // total() with each shared block at this session's share of it: summed
  // over sessions, the host memory they hold, shared blocks once (what a
  // server's host budget counts; review-server F2).
  size_t own_share_total() const { return total() - shared_elsewhere_bytes; }
  // What BackendSession::Fork() allocates anew for the copy of this session
  // (it shares the closed chunks, landmarks and chunk K/V cache entries, and
  // copies the rest: the windows, the open chunk, the selections and, on a
  // GPU backend, its host staging). BackendSession::fork_host_bytes_at_most
  // adds what a fork may copy on top.
  size_t fork_copied_bytes() const { return window_bytes + open_chunk_bytes + selection_bytes; }
};

// Counters of a session since it was created (a fork starts at zero). The
// CPU backend copies nothing and reports zeros for the transfers.
struct BackendSessionStats {
  int64_t h2d_bytes = 0;       // retrieved chunks' K/V copied host -> device
  int64_t h2d_chunks = 0;      // chunks copied host -> device
  int64_t mapped_h2d_chunks = 0;  // of those: read from mapped chunk files (the disk tier)
  int64_t d2d_chunks = 0;      // selected chunks copied from the same step's encoder output
  int64_t resident_hits = 0;   // selected chunks found already on the device
  int64_t d2h_bytes = 0;       // closed chunks' K/V copied device -> host store
  // Chunks whose GCA keys and values were made from their encoder rows
  // (the CPU backend's ChunkKvCache misses), and selected chunks whose keys
  // and values were found made already (its hits).
  int64_t kv_made_chunks = 0;
  int64_t kv_cache_hits = 0;
  // Rows run by lower-only forwards or lower-only slices
  // (StepPlan::lower_only, SlicePlan::lower_only): their upper layers,
  // retrievals and logits were skipped.
  int64_t upper_rows_skipped = 0;
  // Rows whose logits the lm_head computed (StepPlan::logit_rows). Counted
  // by the CPU backend only.
  int64_t logit_rows = 0;
  // CUDA decode graphs (CudaBackendOptions::decode_graphs): graphs captured
  // and instantiated, and steps run by launching one (the first launch
  // after a capture included).
  int64_t graph_captures = 0;
  int64_t graph_replays = 0;
  // Fused decode GEMV kernels (CudaBackendOptions::decode_fused_gemv)
  // enqueued for this session's rows: launched eagerly, or recorded into a
  // decode graph while it was captured (a replay adds none: graph_replays
  // counts those; a failed capture's are taken back). A batched step's
  // launch covers every session in it and counts in each. Zero with the
  // option off: the tests' evidence that the option reached the engine.
  int64_t fused_gemv_launches = 0;
  // Not a counter: whether the session keeps its closed chunks in device
  // memory (the CUDA device tier, chosen at creation; kAuto may choose
  // either). False for the host tier and the CPU backend.
  bool chunks_on_device = false;
  // Captures or instantiations that failed: the first disables the
  // session's graphs, which then decodes eagerly.
  int64_t graph_capture_failures = 0;
  // The CUDA backend's test-only stream delays (CudaBackendOptions::
  // debug_stream_delay) queued on this session's streams, and a batched
  // step's delays of its own stream, counted in every session of the step.
  // Zero with the option off. review-cudaprep C3 b: a delay run's evidence
  // that its delays fired.
  int64_t stream_delays = 0;
};

// Called for every landmark a session processes: the chunk whose landmark it
// is, the group, and the selection made there.
// engine/session_state.h
struct BackendSessionState;
struct ChunkData;
using ChunkReader = std::function<absl::Status(int64_t chunk, ChunkData& out)>;

using RetrievalObserver = std::function<void(int64_t chunk, int64_t group, const Retrieval&)>;

class BackendSession {
 public:
  virtual ~BackendSession() = default;

  // Decoder positions processed so far (landmarks included).
  virtual int64_t position() const = 0;
  virtual int64_t num_chunks() const = 0;
  virtual SessionMemory memory() const = 0;
  // The selection currently in force for each group.
  virtual std::vector<Retrieval> current_retrieval() const = 0;
  virtual void set_retrieval_observer(RetrievalObserver observer) = 0;
  // An observer sees every landmark's retrieval, so RunStep never runs such
  // a session through a lower-only forward.
  virtual bool has_retrieval_observer() const = 0;
  // A copy that shares the closed chunks and copies the rest.
  virtual absl::StatusOr<std::unique_ptr<BackendSession>> Fork() const = 0;
  // Host memory a Fork() may allocate that memory() does not count for
  // this session already (so that a server's host budget can refuse the
  // fork first): the CUDA backend's kAuto tier forks a device-tier session
  // onto the host tier when the device has no room for another store, and
  // copies its chunks into pinned host memory then. 0 by default (a fork
  // shares the closed chunks).
  virtual int64_t fork_host_bytes_at_most() const { return 0; }
  virtual BackendSessionStats stats() const { return {}; }

  // Durable state (engine/session_state.h, docs/state_format.md). A backend
  // that cannot export returns UNIMPLEMENTED from all three.
  // The small state: windows, open chunk, selections, position.
  virtual absl::Status ExportState(BackendSessionState& out) const {
    return absl::UnimplementedError("this backend cannot export session state");
  }
  // Closed chunk `chunk` (< num_chunks()).
  virtual absl::Status ReadChunk(int64_t chunk, ChunkData& out) const {
    return absl::UnimplementedError("this backend cannot export session state");
  }
  // Replaces the state of a session that has processed nothing yet with
  // `state` and its `num_chunks` closed chunks read through `read`. With a
  // `map` and a backend that maps chunks (chunk_map_unit() > 0), whole units
  // of chunks are mapped through it instead of read into memory (the disk
  // tier), up to the first unit `map` fails for: that unit and every chunk
  // after it are read through `read`, as at run time after a failed mapping
  // (MapLeadingUnits, engine/mapped_chunks.h). So `read` is called for the
  // chunks from that unit (or the last partial unit) on, in order, after
  // every call of `map`. All or nothing: on error the session is unchanged.
  virtual absl::Status ImportState(const BackendSessionState& state, int64_t num_chunks,
                                   const ChunkReader& read, const ChunkMapper& map = nullptr) {
    return absl::UnimplementedError("this backend cannot import session state");
  }

  // The disk tier (engine/mapped_chunks.h). How many consecutive chunks the
  // backend hands over to a mapping as one unit; 0 when it keeps every
  // chunk in its own memory.
  virtual int64_t chunk_map_unit() const { return 0; }
  // `chunks` (closed chunks of this session, first() and size() multiples
  // of chunk_map_unit(), contents identical to the session's) are read from
  // the mapping from now on, and the session frees its own copy of their
  // encoder rows. Forks that share those chunks keep theirs until they map them too.
  // INVALID_ARGUMENT for a range that is not whole units of closed chunks;
  // nothing changes then.
  virtual absl::Status MapChunks(std::shared_ptr<const MappedChunks> chunks) {
    return absl::UnimplementedError("this backend cannot read chunks from mapped files");
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual absl::StatusOr<std::unique_ptr<BackendSession>> NewSession() = 0;

  // The step size: decoder positions (landmarks included, all sessions of a
  // step together) one forward holds at most. The memory of a forward is
  // proportional to it, never to a prompt's length. At least one chunk
  // (chunk_positions()). RunStep and Session::Append cut tokens by it.
  virtual int64_t max_step_positions() const = 0;

  // Host memory one more closed chunk adds to a session's chunk store: what
  // the server's memory budget expects new tokens to take
  // (SessionManager::CheckBudget). The CPU backend keeps the landmark and
  // encoder rows in fp32; the CUDA backend its pinned record (K/V or encoder
  // rows, in the storage type; landmarks live on the device).
  virtual int64_t host_bytes_per_chunk() const = 0;

  // Whether Step runs lower-only plans (StepPlan::lower_only): RunStep then
  // runs the rows of an entry that lie more than upper_layer_reach()
  // positions before the end of its tokens through the lower layers only
  // (engine/model_rules.h, UpperLayerReach). False by default: a backend
  // that has not been checked with them, or where they are switched off.
  virtual bool runs_lower_only_forwards() const { return false; }
  virtual int64_t upper_layer_reach() const { return UpperLayerReach(config()); }
  // Whether Step also runs plans in which only some slices are lower-only
  // (StepPlan::mixed_lower_only: the upper layers over a prefix of the
  // rows) and plans in which a slice that runs the upper layers asks for no
  // logits (StepPlan::skips_some_logits). RunStep then skips the upper
  // layers per slice, also in a forward that holds a decode row, and
  // computes no logits for an entry with tokens following. False by
  // default (the CUDA backend runs neither); implies
  // runs_lower_only_forwards().
  virtual bool runs_mixed_lower_only_forwards() const { return false; }

  // Whether the durable-state reads of two different sessions made by this
  // backend may run on two threads at once: ExportState, ReadChunk,
  // chunk_map_unit and MapChunks (the disk tier maps a session's chunks as
  // its write ends), each session's calls on one thread, while no Step runs
  // on either of them, also when the two share closed chunks (a session and
  // its fork). The server's group commit writes the sessions of one engine
  // step so (SchedulerOptions::concurrent_writes); without it they are
  // written one after another. False by default (the CUDA backend's device
  // copies from several threads have not been run); a backend that wraps
  // another forwards it.
  virtual bool exports_sessions_concurrently() const { return false; }

  // Runs one forward over `plan` (engine/step_plan.h), which holds at most
  // max_step_positions() rows. sessions[r] is the session of the plan's
  // request r and was made by this backend. Writes the logits of
  // plan.logit_rows to `logits` (logit_rows.size() x vocab_size). A
  // lower-only plan needs runs_lower_only_forwards(). A plan
  // or session CheckStep refuses changes nothing; an error after the work
  // started may leave the step's sessions half updated (the CUDA backend
  // then refuses them further steps).
  virtual absl::Status Step(const StepPlan& plan, absl::Span<BackendSession* const> sessions,
                            absl::Span<float> logits) = 0;

  // Before RunStep puts `session` (made by this backend) into a forward
  // that takes it to `end_position` decoder positions: the per-session
  // preparation that may fail for that session alone (the CUDA backend
  // refuses a session that failed earlier, and grows the device tier's
  // chunk store here, which may find no room). An error keeps the session
  // out of the forward and fails its entry alone, with that error; the
  // other entries run as in a step without it. Nothing a session computes
  // depends on it (room made stays made). OK by default.
  virtual absl::Status PrepareSessionForStep(BackendSession& session, int64_t end_position) {
    return absl::OkStatus();
  }

 protected:
  // The guard a Step makes before any state changes, the same for every
  // backend: the plan fits max_step_positions(), each slice names a distinct
  // one of `sessions` and starts at that session's position, its ids are
  // ones a Session sends and its logit rows lie inside it, off the
  // landmarks (engine/forward_input.h), the plan's rows, landmarks, runs,
  // the flags and counts derived from them and its logit rows agree
  // (engine/step_plan_check.h), `logits_size` floats
  // hold its logit rows, and a lower-only plan (asking for no logits) only
  // where runs_lower_only_forwards(). INVALID_ARGUMENT naming the problem
  // otherwise.
  // Whether the sessions are the backend's own kind is the backend's to
  // check.
  absl::Status CheckStep(const StepPlan& plan, absl::Span<BackendSession* const> sessions,
                         size_t logits_size) const;
};

struct CpuBackendOptions {
  int num_threads = 0;  // 0: the CPUs this process may use (engine/cpu/cpu_threads.h)
  // The step size (Backend::max_step_positions): decoder positions one
  // forward holds, all sessions together; rounded down to whole chunks, at
  // least one chunk. Prefill memory is proportional to it, never to the
  // prompt length.
  int64_t max_step_positions = 1024;
  // Run the rows that cannot change the kept state through the lower layers
  // only (Backend::runs_lower_only_forwards); off: every row runs the whole
  // forward (tests compare the two).
  bool lower_only_forwards = true;
  // With lower_only_forwards: also per slice, in forwards where other slices
  // (a decode row) run every layer, and no logits for entries with tokens
  // following (Backend::runs_mixed_lower_only_forwards); off: a forward
  // skips the upper layers only when every slice may.
  bool mixed_lower_only_forwards = true;
  // The reach those forwards keep (Backend::upper_layer_reach); 0: the
  // model's UpperLayerReach. Only tests set it, to show that a reach too
  // small changes the state.
  int64_t upper_layer_reach = 0;
  // Chunks whose GCA keys and values a session keeps made beyond those its
  // selections in force name, the most recently read first
  // (engine/cpu/chunk_kv_cache.h); each takes 2 x chunk_positions x
  // hidden_size floats. 0: only the chunks in force. Logits do not depend
  // on it, only speed and memory (docs/engine.md, "Chunk store of encoder
  // rows").
  int64_t chunk_kv_reserve = 0;
};

// The model must outlive the backend.
std::unique_ptr<Backend> MakeCpuBackend(const ModelConfig& config, const ModelWeights& weights,
                                        const CpuBackendOptions& options = {});

}  // namespace drt
