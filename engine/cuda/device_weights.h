// The model's parameters on the GPU in the backend's storage type T (bf16, or
// float in fp32 precision), converted and uploaded once per backend and read
// by all its sessions. gate_proj and up_proj of every layer
// are fused into one [2F][d] matrix (gate rows first), the layout
// kernels::LaunchSwiGlu reads.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_resources.h"
#include "engine/cuda/storage_type.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "kernels/gemm.h"

namespace drt::cuda {

template <typename T>
struct DeviceLayer {
  const T* input_norm = nullptr;  // [d]
  const T* post_norm = nullptr;   // [d]
  // q, k and v are stacked in one [H*dh + 2*kv_heads*dh][d] matrix, q rows
  // first: the fused decode GEMV reads it in one launch
  // (CudaBackendOptions::decode_fused_gemv), the cuBLAS path reads the three
  // sub-matrices. No extra device bytes: the same weights, adjacent.
  const T* qkv = nullptr;
  const T* q = nullptr;           // [H*dh][d], = qkv
  const T* k = nullptr;           // [kv_heads*dh][d], right after q
  const T* v = nullptr;           // right after k
  const T* o = nullptr;           // [d][d]
  const T* gate_up = nullptr;     // [2F][d]
  const T* down = nullptr;        // [d][F]
};

template <typename T>
struct DeviceUpperLayer {
  DeviceLayer<T> base;
  const T* gca_pre_norm = nullptr;  // [d]
  const T* gca_q = nullptr;         // [d][d]
  const T* gca_o = nullptr;         // [d][d]
};

// Instantiated for bf16 and float (device_weights.cc).
template <typename T>
class DeviceWeights {
 public:
  // The current device receives the weights.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Upload(const ModelConfig& config,
                                                               const ModelWeights& weights);

  const T* embed_tokens = nullptr;  // [V][d]
  const T* lm_head = nullptr;       // [V][d]; the embedding when tied
  const T* norm = nullptr;
  std::vector<DeviceLayer<T>> lower;
  std::vector<std::vector<DeviceUpperLayer<T>>> upper;  // [group][layer]
  std::vector<const T*> lmk_norms;                      // [group] -> [d]
  const T* enc_prenorm = nullptr;
  std::vector<DeviceLayer<T>> encoder;
  const T* encoder_norm = nullptr;
  const T* chunk_k_proj = nullptr;  // [d][d]
  const T* chunk_v_proj = nullptr;

  size_t bytes() const { return arena_.bytes(); }

 private:
  DeviceArray<T> arena_;
};

}  // namespace drt::cuda
