#include "engine/session_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/byte_codec.h"
#include "engine/finite_scan.h"
#include "engine/model_rules.h"

namespace drt {
namespace {

int64_t KvWidth(const ModelConfig& c) { return c.num_key_value_heads * c.head_dim(); }
int64_t NumDecoderLayers(const ModelConfig& c) {
  return c.num_lower_layers() + c.num_upper_layers();
}

// An engine state starts with this magic and its version. Version 1 had
// neither: it began with its count of model shape fields, an i64 8, and named
// no head counts and no fingerprint (docs/state_format.md).
constexpr char kEngineStateMagic[8] = {'D', 'R', 'T', 'E', 'N', 'G', 'S', 'T'};
constexpr int64_t kVersion1ShapeFields = 8;

// The model's shape as written at the head of every small state; a state is
// refused by a model of another shape, naming the field, and then by a model
// of another fingerprint (the same shape, other weights or config).
struct ShapeField {
  const char* name;
  int64_t value;
};
std::vector<ShapeField> ModelShape(const ModelConfig& c) {
  return {{"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"decoder_layers", NumDecoderLayers(c)},
          {"num_groups", c.num_groups()},
          {"enc_chunk_size", c.enc_chunk_size},
          {"slide_window", c.slide_window},
          {"chunk_topk", c.chunk_topk}};
}

// The model a state names: its shape fields (in ModelShape's order) and
// its fingerprint.
struct RecordedModel {
  std::vector<int64_t> shape;
  uint32_t fingerprint = 0;
};

// Magic, version, shape and fingerprint, as written at the head of a state
// for a model whose shape has `shape_fields` fields.
absl::StatusOr<RecordedModel> ReadRecordedModel(ByteReader& r, size_t shape_fields) {
  if (r.remaining() >= sizeof(int64_t)) {
    int64_t first = 0;
    std::memcpy(&first, r.rest().data(), sizeof first);
    if (first == kVersion1ShapeFields) {
      return absl::FailedPreconditionError(
          "the state has engine state version 1, which names neither the model's head counts "
          "nor its fingerprint, so it cannot be checked against this model; version 2 is "
          "read (re-ingest the context: send its tokens to a new session)");
    }
  }
  char magic[sizeof kEngineStateMagic] = {};
  if (absl::Status s = r.Raw(magic, sizeof magic, "engine state magic"); !s.ok()) return s;
  if (std::memcmp(magic, kEngineStateMagic, sizeof magic) != 0) {
    return absl::InvalidArgumentError("not an engine session state (its magic is not DRTENGST)");
  }
  uint32_t version = 0;
  if (absl::Status s = r.Get(version, "engine state version"); !s.ok()) return s;
  if (version != kEngineStateVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the state has engine state version %d; this server reads version %d%s", version,
        kEngineStateVersion, version > kEngineStateVersion ? " (written by a newer drt-server?)" : ""));
  }
  int64_t fields = 0;
  if (absl::Status s = r.I64(fields, "model shape"); !s.ok()) return s;
  if (fields != static_cast<int64_t>(shape_fields)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the state names %d model shape fields; this server writes %d", fields, shape_fields));
  }
  RecordedModel model;
  model.shape.resize(shape_fields);
  for (int64_t& v : model.shape) {
    if (absl::Status s = r.I64(v, "model shape field"); !s.ok()) return s;
  }
  if (absl::Status s = r.Get(model.fingerprint, "model fingerprint"); !s.ok()) return s;
  return model;
}

// The first difference between the model a state names and `config`'s: a
// shape field, then (the same shape) the fingerprint; nullopt when none.
absl::StatusOr<std::optional<StateModelMismatch>> CompareModel(const RecordedModel& recorded,
                                                               const ModelConfig& config) {
  const auto shape = ModelShape(config);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (recorded.shape[i] != shape[i].value) {
      return StateModelMismatch{shape[i].name, recorded.shape[i], shape[i].value,
                                recorded.fingerprint};
    }
  }
  const absl::StatusOr<uint32_t> model_fingerprint = config.model_fingerprint();
  if (!model_fingerprint.ok()) return model_fingerprint.status();
  if (recorded.fingerprint != *model_fingerprint) {
    return StateModelMismatch{"fingerprint", recorded.fingerprint, *model_fingerprint,
                              recorded.fingerprint};
  }
  return std::nullopt;
}

// Magic, version, shape and fingerprint: OK when `r` holds a state of this
// engine state version written for `config`'s model.
absl::Status ReadModelHeader(ByteReader& r, const ModelConfig& config) {
  absl::StatusOr<RecordedModel> recorded = ReadRecordedModel(r, ModelShape(config).size());
  if (!recorded.ok()) return recorded.status();
  absl::StatusOr<std::optional<StateModelMismatch>> mismatch = CompareModel(*recorded, config);
  if (!mismatch.ok()) return mismatch.status();
  if (!mismatch->has_value()) return absl::OkStatus();
  const StateModelMismatch& m = **mismatch;
  if (m.field != "fingerprint") {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the state was written for a model with %s %d; this model has %d", m.field,
        m.state_value, m.model_value));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "the state was written for the model with fingerprint %08x; this model's is %08x (the "
      "same shape, but other weights or another config.json: a different checkpoint or a "
      "fine-tune)",
      m.state_value, m.model_value));
}

absl::Status SizeIs(const char* what, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s holds %d floats; the model needs %d", what, got, want));
}

// INVALID_ARGUMENT naming the first NaN or infinity in `values` (`what` of
// layer `layer`, or of no layer when it is negative).
absl::Status AllFinite(const char* what, int64_t layer, const std::vector<float>& values) {
  const int64_t at = FirstNonFinite(reinterpret_cast<const std::byte*>(values.data()),
                                    values.size(), DType::kF32);
  if (at < 0) return absl::OkStatus();
  const std::string where = layer < 0 ? std::string(what) : absl::StrFormat("%s of layer %d", what, layer);
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: float %d is %g; a state's floats must be finite", where, at, values[at]));
}

}  // namespace

std::optional<uint32_t> EngineStateVersionOf(std::string_view bytes) {
  if (bytes.size() >= sizeof(int64_t)) {
    int64_t first = 0;
    std::memcpy(&first, bytes.data(), sizeof first);
    if (first == kVersion1ShapeFields) return 1;
  }
  if (bytes.size() < sizeof kEngineStateMagic + sizeof(uint32_t) ||
      std::memcmp(bytes.data(), kEngineStateMagic, sizeof kEngineStateMagic) != 0) {
    return std::nullopt;
  }
  uint32_t version = 0;  // little-endian, as ByteReader reads it
  std::memcpy(&version, bytes.data() + sizeof kEngineStateMagic, sizeof version);
  return version;
}

std::optional<StateModelMismatch> FindStateModelMismatch(std::string_view bytes,
                                                         const ModelConfig& config) {
  ByteReader r(bytes);
  absl::StatusOr<RecordedModel> recorded = ReadRecordedModel(r, ModelShape(config).size());
  if (!recorded.ok()) return std::nullopt;
  absl::StatusOr<std::optional<StateModelMismatch>> mismatch = CompareModel(*recorded, config);
  if (!mismatch.ok()) return std::nullopt;
  return *mismatch;
}

std::string DescribeStateModelMismatch(const StateModelMismatch& m) {
  if (m.field == "fingerprint") {
    return absl::StrFormat("fingerprint %08x; this model's is %08x (the same shape, other "
                           "weights or another config.json)",
                           m.state_value, m.model_value);
  }
  return absl::StrFormat("%s %d (fingerprint %08x); this model has %s %d", m.field,
                         m.state_value, m.state_fingerprint, m.field, m.model_value);
}

absl::Status ValidateSessionState(const SessionState& state, const ModelConfig& c) {
  const int64_t S = c.chunk_positions();
  const int64_t d = c.hidden_size;
  const BackendSessionState& b = state.backend;
  if (state.num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("num_tokens %d < 0", state.num_tokens));
  }
  // A landmark follows every enc_chunk_size real tokens (design.md, "Session state").
  const int64_t want_position = DecoderPositionsFor(c, state.num_tokens);
  if (b.position != want_position) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "position %d does not match %d tokens (expected %d)", b.position, state.num_tokens,
        want_position));
  }
  if (absl::Status s = SizeIs("last_logits", state.last_logits.size(),
                              state.num_tokens == 0 ? 0 : c.vocab_size);
      !s.ok()) {
    return s;
  }
  // The next token is sampled from these; a NaN or +inf (damaged or
  // hand-made state: a forward that made one fails its sampling step) would
  // make sampling fail later. -inf is a token that cannot be chosen, which
  // the sampler accepts (CheckSamplableLogits), so a state holding one is
  // not refused here either.
  for (size_t i = 0; i < state.last_logits.size(); ++i) {
    const float logit = state.last_logits[i];
    if (std::isnan(logit) || (std::isinf(logit) && logit > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("last_logits[%d] is %s; a state's logits must be finite or -inf", i,
                          std::isnan(logit) ? "NaN" : "+inf"));
    }
  }
  if (static_cast<int64_t>(b.windows.size()) != NumDecoderLayers(c)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d window layers; the model has %d decoder layers", b.windows.size(), NumDecoderLayers(c)));
  }
  const int64_t window_rows = WindowStateRows(c, b.position);
  for (size_t l = 0; l < b.windows.size(); ++l) {
    const WindowState& w = b.windows[l];
    if (w.rows != window_rows) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "window of layer %d holds %d rows; position %d needs %d", l, w.rows, b.position,
          window_rows));
    }
    if (absl::Status s = SizeIs("a window's keys", w.keys.size(), w.rows * KvWidth(c)); !s.ok()) return s;
    if (absl::Status s = SizeIs("a window's values", w.values.size(), w.rows * KvWidth(c)); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = SizeIs("open_chunk", b.open_chunk.size(), (b.position % S) * d); !s.ok()) {
    return s;
  }
  if (static_cast<int64_t>(b.selection.size()) != c.num_groups()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d selections; the model has %d groups", b.selection.size(), c.num_groups()));
  }
  const int64_t chunks = b.position / S;
  for (size_t g = 0; g < b.selection.size(); ++g) {
    const Retrieval& r = b.selection[g];
    if (r.chunks.size() != r.weights.size() || static_cast<int64_t>(r.chunks.size()) > c.chunk_topk) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "selection of group %d has %d chunks and %d weights (top-k %d)", g, r.chunks.size(),
          r.weights.size(), c.chunk_topk));
    }
    for (size_t i = 0; i < r.chunks.size(); ++i) {
      const int64_t chunk = r.chunks[i];
      if (chunk < 0 || chunk >= chunks) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "selection of group %d names chunk %d; the session has %d closed chunks", g, chunk,
            chunks));
      }
      // Retrieval picks top-k distinct chunks (drt-model.md, retrieval).
      for (size_t j = 0; j < i; ++j) {
        if (r.chunks[j] == chunk) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "selection of group %d names chunk %d twice (entries %d and %d)", g, chunk, j, i));
        }
      }
      // A softmax's weights: finite and >= 0 (0 where exp underflowed). A
      // NaN here would reach the logits of the next Append and fail its
      // sampling as if the model had made it.
      const float w = r.weights[i];
      if (!std::isfinite(w) || w < 0.f) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "selection of group %d: weight %d is %g; weights must be finite and >= 0", g, i, w));
      }
    }
  }
  // The window keys/values and the open chunk's rows are read by the next
  // forward; refused here for the reason last_logits are (O(layers * W * d)).
  for (size_t l = 0; l < b.windows.size(); ++l) {
    if (absl::Status s = AllFinite("window keys", l, b.windows[l].keys); !s.ok()) return s;
    if (absl::Status s = AllFinite("window values", l, b.windows[l].values); !s.ok()) return s;
  }
  if (absl::Status s = AllFinite("open_chunk", -1, b.open_chunk); !s.ok()) return s;
  return absl::OkStatus();
}

int64_t WindowStateRows(const ModelConfig& c, int64_t position) {
  return std::min(std::max<int64_t>(1, c.slide_window), position);
}

absl::Status ValidateBackendSessionState(const BackendSessionState& state, int64_t num_chunks,
                                         const ModelConfig& c) {
  const int64_t S = c.chunk_positions();
  SessionState whole;
  whole.backend = state;
  whole.num_tokens = RealTokensFor(c, state.position);
  whole.last_logits.resize(whole.num_tokens == 0 ? 0 : c.vocab_size);
  if (absl::Status s = ValidateSessionState(whole, c); !s.ok()) return s;
  if (num_chunks != state.position / S) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d chunks given; position %d has %d closed chunks", num_chunks,
                        state.position, state.position / S));
  }
  return absl::OkStatus();
}

absl::Status ValidateChunkData(const ChunkData& chunk, const ModelConfig& c) {
  const int64_t d = c.hidden_size;
  if (absl::Status s = SizeIs("a chunk's landmark", chunk.landmark.size(), d); !s.ok()) return s;
  return SizeIs("a chunk's encoder rows", chunk.rows.size(), c.enc_chunk_size * d);
}

absl::StatusOr<std::string> EncodeSessionState(const SessionState& state,
                                               const ModelConfig& config) {
  const absl::StatusOr<uint32_t> model_fingerprint = config.model_fingerprint();
  if (!model_fingerprint.ok()) return model_fingerprint.status();
  std::string out;
  ByteWriter w(out);
  w.Raw(kEngineStateMagic, sizeof kEngineStateMagic);
  w.Put<uint32_t>(kEngineStateVersion);
  const auto shape = ModelShape(config);
  w.I64(static_cast<int64_t>(shape.size()));
  for (const ShapeField& f : shape) w.I64(f.value);
  w.Put<uint32_t>(*model_fingerprint);
  w.I64(state.num_tokens);
  w.Floats(state.last_logits);
  const BackendSessionState& b = state.backend;
  w.I64(b.position);
  w.I64(static_cast<int64_t>(b.windows.size()));
  for (const WindowState& win : b.windows) {
    w.I64(win.rows);
    w.Floats(win.keys);
    w.Floats(win.values);
  }
  w.Floats(b.open_chunk);
  w.I64(static_cast<int64_t>(b.selection.size()));
  for (const Retrieval& r : b.selection) {
    w.I64(static_cast<int64_t>(r.chunks.size()));
    w.Raw(r.chunks.data(), r.chunks.size() * sizeof(int64_t));
    w.Floats(r.weights);
  }
  return out;
}

absl::StatusOr<SessionState> DecodeSessionState(std::string_view bytes, const ModelConfig& config) {
  ByteReader r(bytes);
  if (absl::Status s = ReadModelHeader(r, config); !s.ok()) return s;
  SessionState state;
  BackendSessionState& b = state.backend;
  int64_t count = 0;
  absl::Status s = r.I64(state.num_tokens, "num_tokens");
  if (s.ok()) s = r.Floats(state.last_logits, "last_logits");
  if (s.ok()) s = r.I64(b.position, "position");
  if (s.ok()) s = r.I64(count, "window count");
  if (!s.ok()) return s;
  if (count != NumDecoderLayers(config)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d window layers; the model has %d decoder layers", count, NumDecoderLayers(config)));
  }
  b.windows.resize(count);
  for (WindowState& win : b.windows) {
    s = r.I64(win.rows, "window rows");
    if (s.ok()) s = r.Floats(win.keys, "window keys");
    if (s.ok()) s = r.Floats(win.values, "window values");
    if (!s.ok()) return s;
  }
  s = r.Floats(b.open_chunk, "open chunk");
  if (s.ok()) s = r.I64(count, "selection count");
  if (!s.ok()) return s;
  if (count != config.num_groups()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d selections; the model has %d groups", count, config.num_groups()));
  }
  b.selection.resize(count);
  for (Retrieval& sel : b.selection) {
    int64_t k = 0;
    s = r.I64(k, "selection size");
    if (!s.ok()) return s;
    if (k < 0 || k > config.chunk_topk) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a selection of %d chunks; top-k is %d", k, config.chunk_topk));
    }
    sel.chunks.resize(k);
    s = r.Raw(sel.chunks.data(), k * sizeof(int64_t), "selection chunks");
    if (s.ok()) s = r.Floats(sel.weights, "selection weights");
    if (!s.ok()) return s;
  }
  if (r.remaining() != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d unexpected bytes after the state", r.remaining()));
  }
  if (absl::Status v = ValidateSessionState(state, config); !v.ok()) return v;
  return state;
}

size_t ChunkPayloadBytes(const ModelConfig& c) {
  // The landmark row plus the enc_chunk_size real-token rows of C.
  return static_cast<size_t>(c.chunk_positions() * c.hidden_size) * sizeof(float);
}

void EncodeChunk(const ChunkData& chunk, std::string& out) {
  ByteWriter w(out);
  w.Raw(chunk.landmark.data(), chunk.landmark.size() * sizeof(float));
  w.Raw(chunk.rows.data(), chunk.rows.size() * sizeof(float));
}

absl::Status DecodeChunk(std::string_view bytes, const ModelConfig& c, ChunkData& out) {
  if (bytes.size() != ChunkPayloadBytes(c)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a chunk record holds %d bytes; the model's chunks take %d", bytes.size(),
        ChunkPayloadBytes(c)));
  }
  const int64_t d = c.hidden_size;
  const int64_t rows = c.enc_chunk_size * d;
  // memcpy, not a cast: the bytes need not be aligned for floats.
  out.landmark.resize(d);
  out.rows.resize(rows);
  std::memcpy(out.landmark.data(), bytes.data(), d * sizeof(float));
  std::memcpy(out.rows.data(), bytes.data() + d * sizeof(float), rows * sizeof(float));
  return absl::OkStatus();
}

}  // namespace drt
