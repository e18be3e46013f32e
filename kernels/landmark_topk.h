// Landmark retrieval: top-k chunks per query (drt-model.md, Forward pass 5).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace drt::kernels {

// Device workspace LaunchLandmarkTopK needs for these maxima (0 for an
// invalid topk or max_queries).
size_t LandmarkTopKWorkspaceBytes(int64_t max_landmarks, int max_queries, int topk);

// For each query r < num_queries: score_c = queries[r].landmarks[c] * scale for
// c < limits[r] (landmarks fp32 [capacity][d], queries fp32 [num_queries][d],
// limits on the device), the top min(topk, limits[r]) by score (ties: lower
// chunk index first), best first, and softmax weights over them. Writes
// out_chunks[r][i] (-1 past the count) and out_weights[r][i] (0 past the
// count), both [num_queries][topk]. 1 <= topk <= 32. limits[r] <= 2^20 and
// no more than the max_landmarks the workspace was sized for (with
// max_queries >= num_queries); a row whose limit exceeds what the workspace
// covers gets chunks -1 and NaN weights instead of a silent wrong answer.
// Ties and order match engine/cpu Retrieve (partial_sort, lower index first).
cudaError_t LaunchLandmarkTopK(const float* landmarks, int d, const float* queries,
                               const int64_t* limits, int num_queries, int topk, float scale,
                               void* workspace, size_t workspace_bytes, int64_t* out_chunks,
                               float* out_weights, cudaStream_t stream);

}  // namespace drt::kernels
