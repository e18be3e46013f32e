#include "engine/cuda/cuda_decode_graph.h"

#include "engine/cuda/status_macros.h"
#include "kernels/cuda_check.h"

namespace drt::cuda {

absl::StatusOr<GraphExec> CaptureGraph(cudaStream_t stream,
                                       const std::function<absl::Status()>& record) {
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                           "cudaStreamBeginCapture");
  const absl::Status recorded = record();
  cudaGraph_t graph = nullptr;
  // Ends the capture whatever happened, so that the stream is usable again.
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!recorded.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return recorded;
  }
  DRT_CUDA_RETURN_IF_ERROR(ended, "cudaStreamEndCapture (a call in the captured step is not "
                                  "allowed during stream capture)");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  DRT_CUDA_RETURN_IF_ERROR(instantiated, "cudaGraphInstantiate");
  return GraphExec(exec);
}

absl::StatusOr<DecodeGraphs> DecodeGraphs::Create() {
  DecodeGraphs g;
  auto host = PinnedArray<int64_t>::Create(1, "the decode graphs' position (pinned)");
  if (!host.ok()) return host.status();
  auto device = DeviceArray<int64_t>::Create(1, "the decode graphs' position");
  if (!device.ok()) return device.status();
  g.host_position_ = *std::move(host);
  g.device_position_ = *std::move(device);
  return g;
}

const GraphExec* DecodeGraphs::Find(const DecodeGraphKey& key) const {
  for (const auto& [k, exec] : graphs_) {
    if (k == key) return &exec;
  }
  return nullptr;
}

bool DecodeGraphs::WarmedUp(const DecodeGraphKey& key) {
  for (const DecodeGraphKey& k : warmed_) {
    if (k == key) return true;
  }
  warmed_.push_back(key);
  return false;
}

void DecodeGraphs::Add(const DecodeGraphKey& key, GraphExec exec) {
  graphs_.emplace_back(key, std::move(exec));
}

}  // namespace drt::cuda
