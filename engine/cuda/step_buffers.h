// The step-wide buffers of a batched CUDA step (engine/cuda/cuda_batched_step.h):
// the activations of every row of every slice as one matrix, the step's own
// stream and cuBLAS handle, and the events that hand work between that
// stream and the sessions' compute streams. Owned by the backend, one for
// all its steps (they run one at a time), grown on demand.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_resources.h"
#include "engine/cuda/session_buffers.h"
#include "engine/cuda/storage_type.h"
#include "kernels/gemm.h"

namespace drt::cuda {

template <typename T>
class StepBuffers {
 public:
  static absl::StatusOr<std::unique_ptr<StepBuffers>> Create(const SessionSizes& sizes);
  ~StepBuffers();

  // Logits are computed in batches of at most this many rows (their
  // device and pinned buffers are rows x vocab floats each: 51 MB at a 50K
  // vocabulary).
  static constexpr int64_t kMaxLogitRows = 256;

  // Makes room for `rows` rows, `logit_rows` logit rows (up to
  // kMaxLogitRows) and `sessions` sessions (the buffers grow by doubling,
  // waiting for the step stream first). Call before a step changes
  // anything: a failed allocation leaves the sessions untouched.
  absl::Status Reserve(int64_t rows, int64_t logit_rows, int64_t sessions);
  // Rows of logits one batch holds (after Reserve).
  int64_t logit_capacity() const { return logit_capacity_; }

  const SessionSizes& sizes() const { return sizes_; }
  cudaStream_t stream() const { return stream_.get(); }
  kernels::CublasGemm& gemm() { return *gemm_; }
  // Recorded on stream() when sessions must wait for the step's work.
  cudaEvent_t step_done() const { return step_done_.get(); }
  // Recorded on session i's compute stream when the step must wait for it.
  cudaEvent_t session_done(size_t i) const { return session_done_[i].get(); }

  // [rows][...] row-major, row r being row r of the plan.
  DeviceArray<int32_t> ids;
  PinnedArray<int32_t> ids_host;
  DeviceArray<float> h;      // residual stream
  DeviceArray<float> mixed;  // r + GCA(h)
  DeviceArray<T> x, q, k_new, v_new, attn;  // [rows][d] (k/v use kv_width of d)
  DeviceArray<T> gate_up;    // [rows][2F]
  DeviceArray<T> act;        // [rows][F]
  DeviceArray<T> final_normed;  // [logit_capacity][d]
  DeviceArray<float> logits;    // [logit_capacity][V]
  PinnedArray<float> logits_host;

 private:
  explicit StepBuffers(const SessionSizes& sizes) : sizes_(sizes) {}

  SessionSizes sizes_;
  int64_t capacity_ = 0;
  int64_t logit_capacity_ = 0;
  Stream stream_;
  // Declared after the stream so that it is destroyed before it.
  std::unique_ptr<kernels::CublasGemm> gemm_;
  Event step_done_;
  std::vector<Event> session_done_;
};

}  // namespace drt::cuda
