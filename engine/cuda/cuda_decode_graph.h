// CUDA graphs of a session's decode steps (CudaBackendOptions::decode_graphs;
// docs/cuda.md, "Decode graphs"): the RAII owner of an instantiated graph,
// stream capture into one, and the per-session set of graphs with the device
// scalar they read the step's position from. What a graph holds and when it
// replays: engine/cuda/host/decode_graph_plan.h; the capture and replay of a
// step: CudaSession::LaunchDecodeGraph (cuda_session_graph.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/cuda_resources.h"
#include "engine/cuda/host/decode_graph_plan.h"
#include "engine/cuda/host/graph_capture_retry.h"

namespace drt::cuda {

// An instantiated graph (cudaGraphExec_t), destroyed with its owner.
class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(cudaGraphExec_t exec) : exec_(exec) {}
  GraphExec(GraphExec&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  GraphExec& operator=(GraphExec&& o) noexcept {
    if (this != &o) {
      Reset();
      exec_ = std::exchange(o.exec_, nullptr);
    }
    return *this;
  }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  ~GraphExec() { Reset(); }
  cudaGraphExec_t get() const { return exec_; }

 private:
  void Reset() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
  }
  cudaGraphExec_t exec_ = nullptr;
};

// Captures what `record` queues on `stream` (cudaStreamCaptureModeThreadLocal:
// other threads' CUDA calls are not affected) and instantiates it. The
// capture is always ended, also when `record` fails (its error is returned
// then) or made an illegal call (the runtime's capture error is). Nothing
// runs on the device here.
absl::StatusOr<GraphExec> CaptureGraph(cudaStream_t stream,
                                       const std::function<absl::Status()>& record);

// A session's decode graphs, one per DecodeGraphKey, and what they read at
// run time besides the session's own buffers: the step's first position, a
// device scalar that the head of every graph copies from a pinned one (the
// token ids come the same way, through SessionBuffers::ids_host and ids).
class DecodeGraphs {
 public:
  static absl::StatusOr<DecodeGraphs> Create();

  // The pinned scalar the host writes before each launch, and the device
  // scalar the kernels read (kernels' device_first_pos).
  int64_t* host_position() const { return host_position_.get(); }
  const int64_t* device_position() const { return device_position_.get(); }
  int64_t* mutable_device_position() const { return device_position_.get(); }

  // The graph of `key`, or nullptr when none is captured.
  const GraphExec* Find(const DecodeGraphKey& key) const;
  void Add(const DecodeGraphKey& key, GraphExec exec);
  // Whether a step of `key` may replay (or capture) its graph now: once a
  // step of that shape has run eagerly since the graphs were last cleared.
  // The first call for a key answers false and remembers the key: that
  // step runs kernel by kernel, so that every kernel module and cuBLAS's
  // per-shape state are loaded before any capture (the warm-up CUDA graph
  // capture is usually given; nothing then gets loaded inside a capture).
  bool WarmedUp(const DecodeGraphKey& key);
  // Forgets every graph and warm-up (a captured pointer or shape may have
  // changed).
  void Clear() {
    graphs_.clear();
    warmed_.clear();
  }
  size_t size() const { return graphs_.size(); }
  // Whether a step may replay or capture now (GraphCaptureRetry: paused for
  // some eager steps after a failed capture, off for good after several in
  // a row). Clear() keeps this.
  bool MayCapture() { return retry_.MayCapture(); }
  // After a capture or instantiation failed (a failed capture is not a
  // failed step; docs/cuda.md, "Decode graphs"): every graph and warm-up
  // forgotten, capturing paused (GraphCaptureRetry). Answers whether the
  // graphs are now off for the session's life.
  bool CaptureFailed() {
    Clear();
    retry_.CaptureFailed();
    return retry_.off_for_good();
  }
  void CaptureSucceeded() { retry_.CaptureSucceeded(); }

 private:
  PinnedArray<int64_t> host_position_;
  DeviceArray<int64_t> device_position_;
  std::vector<std::pair<DecodeGraphKey, GraphExec>> graphs_;
  std::vector<DecodeGraphKey> warmed_;
  GraphCaptureRetry retry_;
};

}  // namespace drt::cuda
