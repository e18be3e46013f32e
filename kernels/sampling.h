// Token selection on the device: greedy argmax and temperature/top-k/top-p sampling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace drt::kernels {

// Greedy: out[r] = argmax over vocab of logits[r] ([rows][vocab] fp32), ids in
// banned[0..num_banned) (device memory) excluded. Ties: lowest id. NaN logits
// are skipped; a row with no eligible id gives -1.
cudaError_t LaunchArgmax(const float* logits, int rows, int vocab, const int32_t* banned,
                         int num_banned, int32_t* out, cudaStream_t stream);

// One row: temperature, top_k (0 = off), top_p (1 = off), `uniform` in [0,1)
// drawn by the caller; banned ids excluded. out is one int32 on the device.
// The rule of drt::Sampler::Sample (engine/sampler.cc) without its min_p,
// penalties and logit_bias (the server samples on the host, through Sampler,
// so this kernel serves none of them): candidates sorted by
// logit (ties: lower id), top_k, weights exp((l - best) / T), the smallest
// prefix whose mass reaches top_p, then the first candidate whose running
// weight exceeds uniform * mass. temperature == 0 is LaunchArgmax (no workspace
// needed). workspace: SampleWorkspaceBytes(vocab) bytes, 256-byte aligned.
cudaError_t LaunchSample(const float* logits, int vocab, float temperature, int top_k, float top_p,
                         float uniform, const int32_t* banned, int num_banned, void* workspace,
                         size_t workspace_bytes, int32_t* out, cudaStream_t stream);
// Needs a CUDA device (asks CUB); 0 on error.
size_t SampleWorkspaceBytes(int vocab);

}  // namespace drt::kernels
