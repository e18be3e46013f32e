// Internal to kernels/: the split decode kernel of the window attention
// (kernels/window_split_decode.cu), which LaunchWindowAttention runs for
// n <= kRowKernelMaxN when params.decode_splits > 0. Not part of the API.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/window_attention.h"

namespace drt::kernels::detail {

// Whether `splits` is a decode_splits value the split kernel has (1, 2, 4, 8).
inline bool ValidDecodeSplits(int splits) {
  return splits == 1 || splits == 2 || splits == 4 || splits == 8;
}

// p has been validated by LaunchWindowAttention, 1 <= p.n <= kRowKernelMaxN and
// ValidDecodeSplits(p.decode_splits). Returns cudaErrorNotSupported for
// decode_splits > 1 on a device below compute capability 9.0 (no thread
// block clusters), launching nothing.
template <typename T>
cudaError_t LaunchWindowSplitDecode(const WindowAttentionParams<T>& p, cudaStream_t stream);

}  // namespace drt::kernels::detail
