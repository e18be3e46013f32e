#include "engine/cpu/chunk_kv.h"

#include <cblas.h>

#include <algorithm>

#include "engine/model_rules.h"

namespace drt::cpu {

void MakeChunkKeysValues(const ModelConfig& config, const ModelWeights& weights,
                         const float* encoder_rows, float* keys, float* values) {
  const int64_t rows = config.enc_chunk_size;
  const int64_t d = config.hidden_size;
  // The real-token rows are rows 0..S'-1 of the chunk and the landmark is
  // the last row (LandmarkRowInChunk), so the S' rows map to rows 0..S'-1.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, d, d, 1.f, encoder_rows, d,
              weights.chunk_k_proj.data(), d, 0.f, keys, d);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, d, d, 1.f, encoder_rows, d,
              weights.chunk_v_proj.data(), d, 0.f, values, d);
  // The landmark's key and value are zero: the off-by-one of GCA's softmax
  // (Forward pass 7).
  const int64_t landmark = LandmarkRowInChunk(config);
  std::fill_n(keys + landmark * d, d, 0.f);
  std::fill_n(values + landmark * d, d, 0.f);
}

}  // namespace drt::cpu
