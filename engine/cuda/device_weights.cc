#include "engine/cuda/device_weights.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "kernels/cuda_check.h"

namespace drt::cuda {
namespace {

// Offsets are rounded up to 256 bytes (cuBLAS's preferred alignment).
constexpr size_t kAlignElements = 128;

// Lays tensors out in one host buffer of the storage type's bits; records each
// offset so that device pointers can be set once the arena exists.
template <typename T>
class ArenaBuilder {
 public:
  // Appends the concatenation of `parts` as one tensor; returns its slot.
  size_t Add(std::initializer_list<const std::vector<float>*> parts) {
    host_.resize((host_.size() + kAlignElements - 1) / kAlignElements * kAlignElements);
    const size_t offset = host_.size();
    for (const std::vector<float>* part : parts) {
      for (float x : *part) host_.push_back(StorageTraits<T>::FromFloat(x));
    }
    offsets_.push_back(offset);
    return offsets_.size() - 1;
  }
  size_t offset(size_t slot) const { return offsets_[slot]; }
  const std::vector<HostElement<T>>& host() const { return host_; }

 private:
  std::vector<HostElement<T>> host_;
  std::vector<size_t> offsets_;
};

struct LayerSlots {
  size_t input_norm, post_norm, qkv, o, gate_up, down;
  size_t q_elements, k_elements;  // where k and v start within qkv
};

template <typename T>
LayerSlots AddLayer(ArenaBuilder<T>& b, const LayerWeights& l) {
  LayerSlots s;
  s.input_norm = b.Add({&l.input_layernorm});
  s.post_norm = b.Add({&l.post_attention_layernorm});
  s.qkv = b.Add({&l.self_attn.q_proj, &l.self_attn.k_proj, &l.self_attn.v_proj});
  s.q_elements = l.self_attn.q_proj.size();
  s.k_elements = l.self_attn.k_proj.size();
  s.o = b.Add({&l.self_attn.o_proj});
  s.gate_up = b.Add({&l.mlp.gate_proj, &l.mlp.up_proj});
  s.down = b.Add({&l.mlp.down_proj});
  return s;
}

}  // namespace

template <typename T>
absl::StatusOr<std::unique_ptr<DeviceWeights<T>>> DeviceWeights<T>::Upload(
    const ModelConfig& config, const ModelWeights& w) {
  ArenaBuilder<T> b;
  const size_t embed = b.Add({&w.embed_tokens});
  const bool separate_head = !w.lm_head.empty();
  const size_t head = separate_head ? b.Add({&w.lm_head}) : embed;
  const size_t norm = b.Add({&w.norm});
  std::vector<LayerSlots> lower;
  for (const LayerWeights& l : w.lower_layers) lower.push_back(AddLayer(b, l));
  struct UpperSlots {
    LayerSlots base;
    size_t pre_norm, q, o;
  };
  std::vector<std::vector<UpperSlots>> upper;
  for (const auto& group : w.upper_layers) {
    upper.emplace_back();
    for (const UpperLayerWeights& l : group) {
      UpperSlots s;
      s.base = AddLayer(b, l.base);
      s.pre_norm = b.Add({&l.gca.pre_norm});
      s.q = b.Add({&l.gca.q_proj});
      s.o = b.Add({&l.gca.o_proj});
      upper.back().push_back(s);
    }
  }
  std::vector<size_t> lmk;
  for (const auto& n : w.lmk_norms) lmk.push_back(b.Add({&n}));
  const size_t enc_prenorm = b.Add({&w.enc_prenorm});
  std::vector<LayerSlots> encoder;
  for (const LayerWeights& l : w.encoder_layers) encoder.push_back(AddLayer(b, l));
  const size_t enc_norm = b.Add({&w.encoder_norm});
  const size_t chunk_k = b.Add({&w.chunk_k_proj});
  const size_t chunk_v = b.Add({&w.chunk_v_proj});

  auto out = std::unique_ptr<DeviceWeights<T>>(new DeviceWeights<T>());
  auto arena = DeviceArray<T>::Create(b.host().size(), "the model weights");
  if (!arena.ok()) return arena.status();
  out->arena_ = *std::move(arena);
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpy(out->arena_.get(), b.host().data(),
                                      b.host().size() * sizeof(T), cudaMemcpyHostToDevice),
                           "copying the weights to the device");
  const T* base = out->arena_.get();
  auto at = [&](size_t slot) { return base + b.offset(slot); };
  auto layer = [&](const LayerSlots& s) {
    DeviceLayer<T> d;
    d.input_norm = at(s.input_norm);
    d.post_norm = at(s.post_norm);
    d.qkv = at(s.qkv);
    d.q = d.qkv;
    d.k = d.q + s.q_elements;
    d.v = d.k + s.k_elements;
    d.o = at(s.o);
    d.gate_up = at(s.gate_up);
    d.down = at(s.down);
    return d;
  };
  out->embed_tokens = at(embed);
  out->lm_head = at(head);
  out->norm = at(norm);
  for (const LayerSlots& s : lower) out->lower.push_back(layer(s));
  for (const auto& group : upper) {
    out->upper.emplace_back();
    for (const UpperSlots& s : group) {
      DeviceUpperLayer<T> d;
      d.base = layer(s.base);
      d.gca_pre_norm = at(s.pre_norm);
      d.gca_q = at(s.q);
      d.gca_o = at(s.o);
      out->upper.back().push_back(d);
    }
  }
  for (size_t s : lmk) out->lmk_norms.push_back(at(s));
  out->enc_prenorm = at(enc_prenorm);
  for (const LayerSlots& s : encoder) out->encoder.push_back(layer(s));
  out->encoder_norm = at(enc_norm);
  out->chunk_k_proj = at(chunk_k);
  out->chunk_v_proj = at(chunk_v);
  (void)config;
  return out;
}

template class DeviceWeights<bf16>;
template class DeviceWeights<float>;

}  // namespace drt::cuda
