// Which slices of a step replay their session's CUDA decode graph
// (CudaBackendOptions::decode_graphs, engine/cuda/cuda_decode_graph.h) and
// which run eagerly, kernel by kernel, as without graphs; and the one-slice
// plan a graph is captured from. Plain C++, tested without a GPU
// (tests/decode_graph_plan_test.cc).
//
// A graph holds the device work of a slice whose launches are the same at
// every step but for values it reads from device memory at run time (the
// token id, the position; kernels/window_attention.h and gca_attention.h
// `device_first_pos`): one row that is not a landmark. Everything that
// varies in shape or needs the host inside the step stays eager: a landmark
// row (the chunk encoder, the top-k whose answer the host reads back, the
// prefetch of the new selection), several rows (prefill; their grids and
// the open-chunk rows they close vary), a selection made in the step and
// serving it (AwaitSelections). What a replayed step still does on the host,
// before the launch, is the work eager PrepareGca does there anyway: which
// chunks serve, their fetch if any, the slot table written to pinned
// staging; the graph uploads that staging. So neither the position within
// the window nor a selection that newly serves keeps a step from replaying
// (docs/cuda.md, "Decode graphs").
#pragma once

#include <cstdint>

#include "engine/step_plan.h"

namespace drt::cuda {

// Why a slice runs eagerly.
enum class EagerReason {
  kNone,             // it replays a graph
  kLowerOnly,        // the plan is a lower-only forward (no upper layers, no logits)
  kSeveralRows,      // more than one row: prefill, or several tokens at once
  kLandmark,         // its row is a landmark: it closes a chunk and retrieves
  kSelectionOfStep,  // a run is served by a selection made in this step
  kLogitRows,        // its logit rows are not exactly its one row
};

// A printable name of `reason` ("several rows", ...).
const char* EagerReasonName(EagerReason reason);

// What differs between the graphs of one session: the launches of a step
// depend on the options (fixed per session) and on the slice's row count.
// Only one-row slices replay today, so a session holds one graph.
struct DecodeGraphKey {
  int64_t rows = 0;

  bool operator==(const DecodeGraphKey&) const = default;
};

struct DecodeGraphDecision {
  EagerReason eager = EagerReason::kNone;  // kNone: replay the graph of `key`
  DecodeGraphKey key;

  bool replays() const { return eager == EagerReason::kNone; }
};

// The decision for plan.slices[slice] (a valid index of a plan made by
// PlanStep).
DecodeGraphDecision DecideDecodeGraph(const StepPlan& plan, int64_t slice);

// The plan of plan.slices[slice] alone, as if its session were the only one
// of the step: request 0, its rows from row 0 (ids, landmarks, runs and logit
// rows moved with them). A graph is captured by running the forward over it
// (its values at capture time are never read by the replays: the token id
// and the position come from device memory).
StepPlan SingleSlicePlan(const StepPlan& plan, int64_t slice);

}  // namespace drt::cuda
