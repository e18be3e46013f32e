#include "engine/cuda/step_buffers.h"

#include <algorithm>

#include "engine/cuda/status_macros.h"

namespace drt::cuda {

template <typename T>
absl::StatusOr<std::unique_ptr<StepBuffers<T>>> StepBuffers<T>::Create(const SessionSizes& sizes) {
  auto buffers = std::unique_ptr<StepBuffers>(new StepBuffers(sizes));
  auto stream = Stream::Create();
  if (!stream.ok()) return stream.status();
  buffers->stream_ = *std::move(stream);
  auto gemm = kernels::CublasGemm::Create();
  if (!gemm.ok()) return gemm.status();
  buffers->gemm_ = std::make_unique<kernels::CublasGemm>(*std::move(gemm));
  auto event = Event::Create();
  if (!event.ok()) return event.status();
  buffers->step_done_ = *std::move(event);
  return buffers;
}

template <typename T>
StepBuffers<T>::~StepBuffers() {
  // Kernels of the last step may still read the buffers. Errors cannot be
  // reported here.
  if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
}

template <typename T>
absl::Status StepBuffers<T>::Reserve(int64_t rows, int64_t logit_rows, int64_t sessions) {
  while (static_cast<int64_t>(session_done_.size()) < sessions) {
    auto event = Event::Create();
    if (!event.ok()) return event.status();
    session_done_.push_back(*std::move(event));
  }
  const int64_t wanted_logits = std::clamp<int64_t>(logit_rows, 1, kMaxLogitRows);
  if (rows <= capacity_ && wanted_logits <= logit_capacity_) return absl::OkStatus();
  // Doubling, but never past a whole step (sizes_.max_rows: CheckStepRows
  // refuses larger plans before this is called).
  int64_t grown = std::max<int64_t>(capacity_, 64);
  while (grown < rows) grown *= 2;
  grown = std::max(rows, std::min(grown, sizes_.max_rows));
  int64_t grown_logits = std::max<int64_t>(logit_capacity_, 16);
  while (grown_logits < wanted_logits) grown_logits *= 2;
  grown_logits = std::min(grown_logits, kMaxLogitRows);
  const bool rows_grow = grown > capacity_;
  const bool logits_grow = grown_logits > logit_capacity_;
  // The previous step's kernels and copies may still use the old buffers.
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()),
                           "waiting before the step's buffers grow");
  const SessionSizes& s = sizes_;
  const size_t n = static_cast<size_t>(grown);
#define DRT_GROW(field, Type, count)                                 \
  {                                                                  \
    auto made = Type::Create(count, "batched step " #field);         \
    if (!made.ok()) return made.status();                            \
    field = *std::move(made);                                        \
  }
  // Only the buffers whose size changes (the logits ones are large: about
  // 200 KB per row at a 50K vocabulary, device and pinned host). A failure
  // part way leaves the capacities as they were, with some buffers larger.
  if (rows_grow) {
    DRT_GROW(ids, DeviceArray<int32_t>, n);
    DRT_GROW(ids_host, PinnedArray<int32_t>, n);
    DRT_GROW(h, DeviceArray<float>, n * s.d);
    DRT_GROW(mixed, DeviceArray<float>, n * s.d);
    DRT_GROW(x, DeviceArray<T>, n * s.d);
    DRT_GROW(q, DeviceArray<T>, n * s.d);
    DRT_GROW(k_new, DeviceArray<T>, n * s.kv_width);
    DRT_GROW(v_new, DeviceArray<T>, n * s.kv_width);
    DRT_GROW(attn, DeviceArray<T>, n * s.d);
    DRT_GROW(gate_up, DeviceArray<T>, n * 2 * s.f);
    DRT_GROW(act, DeviceArray<T>, n * s.f);
    capacity_ = grown;
  }
  if (logits_grow) {
    const size_t l = static_cast<size_t>(grown_logits);
    DRT_GROW(final_normed, DeviceArray<T>, l * s.d);
    DRT_GROW(logits, DeviceArray<float>, l * s.vocab);
    DRT_GROW(logits_host, PinnedArray<float>, l * s.vocab);
    logit_capacity_ = grown_logits;
  }
#undef DRT_GROW
  return absl::OkStatus();
}

template class StepBuffers<bf16>;
template class StepBuffers<float>;

}  // namespace drt::cuda
