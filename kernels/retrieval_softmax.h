// Softmax weights of a retrieval's chosen scores (drt-model.md, Forward pass
// 5: "softmax over the chosen scores"), shared by the landmark top-k kernel
// (kernels/landmark_topk.cu, on the device) and its unit test on the host
// (tests/retrieval_softmax_test.cc). Plain C++ when not compiled by nvcc.
#pragma once

#include <math.h>

#if defined(__CUDACC__)
#define DRT_HOST_DEVICE __host__ __device__
#else
#define DRT_HOST_DEVICE
#endif

namespace drt::kernels {

// scores[0..count) hold the chosen scores, best first; on return they hold
// the softmax weights exp(s_i - s_0) / sum_j exp(s_j - s_0), computed in fp32
// as engine/cpu Retrieve does. The best score is read once, before the loop
// overwrites scores[0]: every weight is taken against it, not against the
// already written exp(0) = 1 (the bug the H100 run found, issue 9).
DRT_HOST_DEVICE inline void SoftmaxOfBestFirstScores(float* scores, int count) {
  if (count <= 0) return;
  const float best = scores[0];
  float sum = 0.f;
  for (int i = 0; i < count; ++i) {
    scores[i] = expf(scores[i] - best);
    sum += scores[i];
  }
  for (int i = 0; i < count; ++i) scores[i] /= sum;
}

}  // namespace drt::kernels

#undef DRT_HOST_DEVICE
