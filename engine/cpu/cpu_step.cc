#include "engine/cpu/cpu_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cpu/chunk_kv.h"
#include "engine/cpu/retrieval.h"
#include "engine/model_rules.h"

namespace drt::cpu {
namespace {

// Window keys and values of at most this many positions are gathered at
// once (the windows of several slices), so that a step of many sessions does
// not need one copy of every session's window at the same time.
constexpr int64_t kMaxGatheredKeyRows = 16384;

}  // namespace

CpuStep::CpuStep(const ModelConfig& config, const ModelWeights& weights, ThreadPool& pool,
                 absl::Span<CpuSession* const> sessions, CpuStepScratch& scratch)
    : config_(config),
      weights_(weights),
      pool_(pool),
      sessions_(sessions),
      h_(scratch.h),
      x_(scratch.x),
      q_(scratch.q),
      k_new_(scratch.k_new),
      v_new_(scratch.v_new),
      attn_(scratch.attn),
      residual_(scratch.residual),
      gca_q_(scratch.gca_q),
      gca_out_(scratch.gca_out),
      mixed_(scratch.mixed),
      gate_(scratch.gate),
      up_(scratch.up),
      window_keys_(scratch.window_keys),
      window_values_(scratch.window_values),
      closed_rows_(scratch.closed_rows),
      encoded_(scratch.encoded) {}

const LayerWeights& CpuStep::Layer(DecoderLayerId layer) const {
  if (layer.group < 0) return weights_.lower_layers[layer.within];
  return weights_.upper_layers[layer.group][layer.within].base;
}

absl::Status CpuStep::Embed(const StepPlan& plan) {
  const int64_t d = config_.hidden_size;
  const int64_t n = plan.num_rows;
  // The first op of a step: the selections it will make start empty.
  made_.assign(plan.slices.size(), std::vector<std::vector<Retrieval>>(config_.num_groups()));
  h_.resize(n * d);
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(h_.data() + i * d,
                weights_.embed_tokens.data() + static_cast<int64_t>(plan.ids[i]) * d,
                d * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status CpuStep::Attention(const StepPlan& plan, DecoderLayerId layer_id) {
  const int64_t d = config_.hidden_size;
  // An upper layer runs over the slices that are not lower-only: the first
  // upper_slices() slices, rows [0, upper_rows()) (StepPlan).
  const bool upper = layer_id.group >= 0;
  const int64_t n = upper ? plan.upper_rows() : plan.num_rows;
  const size_t num_slices = upper ? static_cast<size_t>(plan.upper_slices()) : plan.slices.size();
  const int64_t kv_width = config_.num_key_value_heads * config_.head_dim();
  const LayerWeights& layer = Layer(layer_id);
  x_.resize(n * d);
  q_.resize(n * d);
  attn_.resize(n * d);
  k_new_.resize(n * kv_width);
  v_new_.resize(n * kv_width);
  RmsNorm(h_.data(), n, d, layer.input_layernorm.data(), static_cast<float>(config_.rms_norm_eps),
          x_.data(), pool_);
  Linear(x_.data(), n, d, layer.self_attn.q_proj.data(), d, q_.data(), pool_);
  Linear(x_.data(), n, d, layer.self_attn.k_proj.data(), kv_width, k_new_.data(), pool_);
  Linear(x_.data(), n, d, layer.self_attn.v_proj.data(), kv_width, v_new_.data(), pool_);
  // Each slice's queries see its own session's window, then its own new
  // rows. A slice of few rows (a decode row, a small prefill piece) pushes
  // its rows into its window first and reads window and rows where they lie
  // (WindowCache::RecentKeys: one stretch, as the GEMM path would have
  // gathered them); a larger slice's window is gathered with its new rows
  // into one buffer, a group of slices at a time, and pushed after.
  const int64_t d_kv = kv_width;
  attention_slices_.clear();
  gathered_slices_.clear();
  for (size_t s = 0; s < num_slices; ++s) {
    const SlicePlan& slice = plan.slices[s];
    WindowCache& window = SessionOf(slice).windows_[layer_id.index];
    // Decided before the push, from the push's size alone: a push that
    // CanReadInPlace always leaves window and rows in one stretch, so no
    // check after it can fail with this layer's window already moved on
    // (and earlier layers' too).
    if (slice.num_rows > kInPlaceWindowRows || !window.CanReadInPlace(slice.num_rows)) {
      gathered_slices_.push_back(s);
      continue;
    }
    const int64_t num_keys = window.size() + slice.num_rows;
    window.Push(k_new_.data() + slice.first_row * d_kv, v_new_.data() + slice.first_row * d_kv,
                slice.num_rows);
    WindowAttentionSlice a;
    a.q = q_.data() + slice.first_row * d;
    a.n = slice.num_rows;
    a.keys = window.RecentKeys(num_keys);
    a.values = window.RecentValues(num_keys);
    a.num_keys = num_keys;
    a.out = attn_.data() + slice.first_row * d;
    attention_slices_.push_back(a);
  }
  for (size_t g0 = 0; g0 < gathered_slices_.size() || !attention_slices_.empty();) {
    size_t g1 = g0;
    int64_t gathered = 0;
    key_offsets_.clear();
    while (g1 < gathered_slices_.size()) {
      const SlicePlan& slice = plan.slices[gathered_slices_[g1]];
      const int64_t rows = SessionOf(slice).windows_[layer_id.index].size() + slice.num_rows;
      if (g1 > g0 && gathered + rows > kMaxGatheredKeyRows) break;
      key_offsets_.push_back(gathered);
      gathered += rows;
      ++g1;
    }
    window_keys_.resize(gathered * d_kv);
    window_values_.resize(gathered * d_kv);
    pool_.ParallelFor(static_cast<int64_t>(g1 - g0), [&](int64_t i) {
      const SlicePlan& slice = plan.slices[gathered_slices_[g0 + i]];
      const WindowCache& window = SessionOf(slice).windows_[layer_id.index];
      float* keys = window_keys_.data() + key_offsets_[i] * d_kv;
      float* values = window_values_.data() + key_offsets_[i] * d_kv;
      window.CopyOut(keys, values);
      const int64_t past = window.size();
      std::memcpy(keys + past * d_kv, k_new_.data() + slice.first_row * d_kv,
                  slice.num_rows * d_kv * sizeof(float));
      std::memcpy(values + past * d_kv, v_new_.data() + slice.first_row * d_kv,
                  slice.num_rows * d_kv * sizeof(float));
    });
    for (size_t i = 0; i < g1 - g0; ++i) {
      const SlicePlan& slice = plan.slices[gathered_slices_[g0 + i]];
      WindowAttentionSlice a;
      a.q = q_.data() + slice.first_row * d;
      a.n = slice.num_rows;
      a.keys = window_keys_.data() + key_offsets_[i] * d_kv;
      a.values = window_values_.data() + key_offsets_[i] * d_kv;
      a.num_keys = SessionOf(slice).windows_[layer_id.index].size() + slice.num_rows;
      a.out = attn_.data() + slice.first_row * d;
      attention_slices_.push_back(a);
    }
    // The slices read in place go with the first group.
    WindowAttention(attention_slices_, config_.num_attention_heads, config_.num_key_value_heads,
                    config_.head_dim(), config_.slide_window, pool_);
    attention_slices_.clear();
    pool_.ParallelFor(static_cast<int64_t>(g1 - g0), [&](int64_t i) {
      const SlicePlan& slice = plan.slices[gathered_slices_[g0 + i]];
      SessionOf(slice).windows_[layer_id.index].Push(k_new_.data() + slice.first_row * d_kv,
                                                    v_new_.data() + slice.first_row * d_kv,
                                                    slice.num_rows);
    });
    g0 = g1;
  }
  Linear(attn_.data(), n, d, layer.self_attn.o_proj.data(), d, x_.data(), pool_);
  AddInPlace(h_.data(), x_.data(), n * d);
  return absl::OkStatus();
}

void CpuStep::MlpBlock(const LayerWeights& layer, const float* residual,
                       const float* normed_input, float* h, int64_t n) {
  const int64_t d = config_.hidden_size;
  const int64_t f = config_.intermediate_size;
  x_.resize(n * d);
  gate_.resize(n * f);
  up_.resize(n * f);
  RmsNorm(normed_input, n, d, layer.post_attention_layernorm.data(),
          static_cast<float>(config_.rms_norm_eps), x_.data(), pool_);
  Linear(x_.data(), n, d, layer.mlp.gate_proj.data(), f, gate_.data(), pool_);
  Linear(x_.data(), n, d, layer.mlp.up_proj.data(), f, up_.data(), pool_);
  SwiGlu(gate_.data(), up_.data(), n * f, gate_.data(), pool_);
  Linear(gate_.data(), n, f, layer.mlp.down_proj.data(), d, x_.data(), pool_);
  if (residual != h) std::memcpy(h, residual, n * d * sizeof(float));
  AddInPlace(h, x_.data(), n * d);
}

absl::Status CpuStep::Mlp(const StepPlan& plan, DecoderLayerId layer) {
  MlpBlock(Layer(layer), h_.data(), h_.data(), h_.data(), plan.num_rows);
  return absl::OkStatus();
}

absl::Status CpuStep::CloseChunks(const StepPlan& plan) {
  const int64_t S = config_.chunk_positions();
  const int64_t d = config_.hidden_size;
  // The lower-layer rows of every chunk the step closes, in the plan's
  // encoder order: each slice's open chunk fills up row by row.
  std::vector<float>& closed_rows = closed_rows_;
  closed_rows.resize(plan.num_encoded_chunks * S * d);
  for (const SlicePlan& slice : plan.slices) {
    std::vector<float>& open = SessionOf(slice).open_chunk_;
    int64_t closed = slice.first_encoded;
    for (int64_t i = 0; i < slice.num_rows; ++i) {
      const int64_t slot = (slice.first_position + i) % S;
      std::memcpy(open.data() + slot * d, h_.data() + (slice.first_row + i) * d,
                  d * sizeof(float));
      if (slot == S - 1) {
        std::copy(open.begin(), open.end(), closed_rows.begin() + closed * S * d);
        ++closed;
      }
    }
  }
  if (plan.num_encoded_chunks == 0) return absl::OkStatus();
  EncodeChunks(config_, weights_, closed_rows.data(), plan.num_encoded_chunks, pool_, encoded_);
  // The store keeps C: its landmark row and its real-token rows 0..S'-1,
  // which precede the landmark row (LandmarkRowInChunk is the last).
  const int64_t landmark = LandmarkRowInChunk(config_);
  for (const SlicePlan& slice : plan.slices) {
    ChunkStore& store = SessionOf(slice).store_;
    for (size_t j = 0; j < slice.landmarks.size(); ++j) {
      const int64_t c = slice.first_encoded + static_cast<int64_t>(j);
      store.Append(encoded_.output.data() + (c * S + landmark) * d,
                   encoded_.output.data() + c * S * d);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuStep::Retrieve(const StepPlan& plan, int64_t group) {
  const int64_t d = config_.hidden_size;
  // Lower-only slices (after the first upper_slices()) retrieve nothing.
  for (size_t s = 0, upper = static_cast<size_t>(plan.upper_slices()); s < upper; ++s) {
    const SlicePlan& slice = plan.slices[s];
    CpuSession& session = SessionOf(slice);
    std::vector<const float*> rows;
    std::vector<int64_t> chunks;
    for (const PlannedLandmark& landmark : slice.landmarks) {
      rows.push_back(h_.data() + landmark.row * d);
      chunks.push_back(landmark.chunk);
    }
    std::vector<Retrieval>& made = made_[s][group];
    made = RetrieveAtLandmarks(session.store_, weights_.lmk_norms[group].data(), rows, chunks, d,
                               config_.chunk_topk, pool_);
    if (session.observer_) {
      for (size_t i = 0; i < made.size(); ++i) session.observer_(chunks[i], group, made[i]);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuStep::AwaitSelections(const StepPlan& plan, int64_t group) {
  return absl::OkStatus();
}

const Retrieval& CpuStep::RunSelection(const StepPlan& plan, size_t slice, const GcaRun& run,
                                       int64_t group) const {
  return run.made_at == GcaRun::kInForce ? SessionOf(plan.slices[slice]).selection_[group]
                                         : made_[slice][group][run.made_at];
}

std::vector<int64_t> CpuStep::ChunksInForceAfter(const StepPlan& plan, size_t slice) const {
  const CpuSession& session = SessionOf(plan.slices[slice]);
  std::vector<int64_t> chunks;
  for (int64_t g = 0; g < config_.num_groups(); ++g) {
    const std::vector<Retrieval>& made = made_[slice][g];
    const Retrieval& r = made.empty() ? session.selection_[g] : made.back();
    chunks.insert(chunks.end(), r.chunks.begin(), r.chunks.end());
  }
  return chunks;
}

void CpuStep::MakeMissingKeysValues(const StepPlan& plan, int64_t group) {
  // First the K/V the groups before read in this step go, but for the
  // chunks this group reads and those that will be in force after the step
  // (and the cache's reserve): one group's chunks at a time, so that a step
  // of many landmarks does not hold K/V for every selection of every group
  // at once.
  for (size_t s = 0, upper = static_cast<size_t>(plan.upper_slices()); s < upper; ++s) {
    std::vector<int64_t> keep = ChunksInForceAfter(plan, s);
    for (const GcaRun& run : plan.slices[s].runs) {
      const std::vector<int64_t>& read = RunSelection(plan, s, run, group).chunks;
      keep.insert(keep.end(), read.begin(), read.end());
    }
    SessionOf(plan.slices[s]).kv_cache_.Trim(keep);
  }
  // Every chunk the group's runs read whose K/V its session has not made
  // yet: an entry is added for each (once per session), then all are filled
  // in parallel, one chunk per task (MakeChunkKeysValues is the same for a
  // chunk however the work is split).
  struct Missing {
    const ChunkStore* store;
    int64_t chunk;
    ChunkKv* kv;
  };
  std::vector<Missing> missing;
  const int64_t floats = config_.chunk_positions() * config_.hidden_size;
  for (size_t s = 0, upper = static_cast<size_t>(plan.upper_slices()); s < upper; ++s) {
    CpuSession& session = SessionOf(plan.slices[s]);
    for (const GcaRun& run : plan.slices[s].runs) {
      for (int64_t c : RunSelection(plan, s, run, group).chunks) {
        if (session.kv_cache_.Contains(c)) {
          ++session.stats_.kv_cache_hits;
          continue;
        }
        missing.push_back({&session.store_, c, &session.kv_cache_.Add(c, floats)});
        ++session.stats_.kv_made_chunks;
      }
    }
  }
  pool_.ParallelFor(static_cast<int64_t>(missing.size()), [&](int64_t i) {
    const Missing& m = missing[i];
    MakeChunkKeysValues(config_, weights_, m.store->encoder_rows(m.chunk), m.kv->keys.data(),
                        m.kv->values.data());
  });
}

absl::Status CpuStep::PrepareGca(const StepPlan& plan, int64_t group) {
  run_chunks_.clear();
  gca_blocks_.clear();
  gca_first_row_.clear();
  MakeMissingKeysValues(plan, group);
  // The cache keeps every entry until the next group's PrepareGca or Finish
  // trims it, so these pointers hold through the group's GcaMlp calls.
  for (size_t s = 0, upper = static_cast<size_t>(plan.upper_slices()); s < upper; ++s) {
    const SlicePlan& slice = plan.slices[s];
    CpuSession& session = SessionOf(slice);
    for (const GcaRun& run : slice.runs) {
      const Retrieval& r = RunSelection(plan, s, run, group);
      RunChunks chunks;
      for (int64_t c : r.chunks) {
        const ChunkKv* kv = session.kv_cache_.Use(c);
        chunks.k.push_back(kv->keys.data());
        chunks.v.push_back(kv->values.data());
      }
      run_chunks_.push_back(std::move(chunks));
      GcaBlock block;
      block.n = run.num_rows;
      block.weights = r.weights.data();
      block.num_chunks = static_cast<int64_t>(r.chunks.size());
      gca_blocks_.push_back(block);
      gca_first_row_.push_back(run.first_row);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuStep::GcaMlp(const StepPlan& plan, DecoderLayerId layer_id) {
  const int64_t d = config_.hidden_size;
  const int64_t n = plan.upper_rows();  // the rows of the slices that are not lower-only
  const UpperLayerWeights& layer = weights_.upper_layers[layer_id.group][layer_id.within];
  residual_.assign(h_.begin(), h_.begin() + n * d);
  mixed_.resize(n * d);
  gca_q_.resize(n * d);
  gca_out_.resize(n * d);
  attn_.resize(n * d);
  // GCA (drt-model.md, Forward pass 7) on the post-attention stream.
  RmsNorm(h_.data(), n, d, layer.gca.pre_norm.data(), static_cast<float>(config_.rms_norm_eps),
          mixed_.data(), pool_);
  Linear(mixed_.data(), n, d, layer.gca.q_proj.data(), d, gca_q_.data(), pool_);
  for (size_t b = 0; b < gca_blocks_.size(); ++b) {
    gca_blocks_[b].q = gca_q_.data() + gca_first_row_[b] * d;
    gca_blocks_[b].out = attn_.data() + gca_first_row_[b] * d;
    gca_blocks_[b].chunk_k = run_chunks_[b].k.data();
    gca_blocks_[b].chunk_v = run_chunks_[b].v.data();
  }
  GroupedCrossAttention(gca_blocks_, GcaRowsPerChunk(config_), config_.num_attention_heads,
                        config_.head_dim(), pool_);
  Linear(attn_.data(), n, d, layer.gca.o_proj.data(), d, gca_out_.data(), pool_);
  // Forward pass 6: h = r + MLP(RMSNorm2(r + GCA(h))).
  std::memcpy(mixed_.data(), residual_.data(), n * d * sizeof(float));
  AddInPlace(mixed_.data(), gca_out_.data(), n * d);
  MlpBlock(layer.base, residual_.data(), mixed_.data(), h_.data(), n);
  return absl::OkStatus();
}

absl::Status CpuStep::CommitSelections(const StepPlan& plan) {
  for (size_t s = 0, upper = static_cast<size_t>(plan.upper_slices()); s < upper; ++s) {
    CpuSession& session = SessionOf(plan.slices[s]);
    for (int64_t g = 0; g < config_.num_groups(); ++g) {
      if (!made_[s][g].empty()) session.selection_[g] = std::move(made_[s][g].back());
    }
  }
  return absl::OkStatus();
}

absl::Status CpuStep::Logits(const StepPlan& plan, absl::Span<float> logits) {
  const int64_t d = config_.hidden_size;
  const int64_t m = static_cast<int64_t>(plan.logit_rows.size());
  if (m == 0) return absl::OkStatus();
  x_.resize(m * d);
  for (int64_t i = 0; i < m; ++i) {
    std::memcpy(x_.data() + i * d, h_.data() + plan.logit_rows[i].row * d, d * sizeof(float));
    ++SessionOf(plan.slices[plan.logit_rows[i].slice]).stats_.logit_rows;
  }
  RmsNorm(x_.data(), m, d, weights_.norm.data(), static_cast<float>(config_.rms_norm_eps),
          x_.data(), pool_);
  Linear(x_.data(), m, d, weights_.output_embedding().data(), config_.vocab_size, logits.data(),
         pool_);
  return absl::OkStatus();
}

absl::Status CpuStep::Finish(const StepPlan& plan) {
  for (const SlicePlan& slice : plan.slices) {
    CpuSession& session = SessionOf(slice);
    session.position_ += slice.num_rows;
    // A lower-only slice computed no rows of the upper layers' windows and
    // made no selection: those stay stale until the rows of the next
    // UpperLayerReach positions overwrite them. The windows move past the
    // skipped positions all the same (WindowCache::Skip).
    if (slice.lower_only) {
      for (size_t l = config_.num_lower_layers(); l < session.windows_.size(); ++l) {
        session.windows_[l].Skip(slice.num_rows);
      }
      session.stats_.upper_rows_skipped += slice.num_rows;
    }
    // K/V of the chunks the selections in force name stay made (each step
    // reads them), and the cache's reserve of the others.
    std::vector<int64_t> in_force;
    for (const Retrieval& r : session.selection_) {
      in_force.insert(in_force.end(), r.chunks.begin(), r.chunks.end());
    }
    session.kv_cache_.Trim(in_force);
  }
  return absl::OkStatus();
}

}  // namespace drt::cpu
