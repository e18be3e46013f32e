"""DRT config.json handling and the parameter names/shapes a config implies.

Pure Python (no numpy, no torch) so every tool can use it. Names are those of
the reference DRTForCausalLM state_dict (ant-research/long-context-modeling,
model/DRT.py). Model-directory convention: `lm_head.weight` is stored only when
tie_word_embeddings is false; when tied the engine uses model.embed_tokens.weight.
"""
import copy
import json

# Every key of the reference config (config/DRT/config_63.json), with the
# values of the paper's 128M model. Keys the forward pass does not read are
# kept so that the reference training code can load our config.json.
REFERENCE_CONFIG = {
    "activation_function": "gelu_new",
    "architectures": ["DRTForCausalLM"],
    "pad_id": 50257,
    "bos_id": 50256,
    "eos_id": 50256,
    "chunk_id": 50264,
    "mask_id": 50263,
    "attention_bias": False,
    "hidden_act": "silu",
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 2048,
    "max_position_embeddings": -1,
    "model_type": "llama",
    "num_attention_heads": 12,
    "num_hidden_layers": -1,
    "mask_probability": 0.15,
    "num_key_value_heads": 12,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.35.2",
    "use_cache": True,
    "vocab_size": 50265,
    "output_hidden_states": "True",
    "hidden_dropout_prob": 0.2,
    "chunk_topk": 8,
    "chunk_window": -1,
    "slide_window": 512,
    "encoder_layers": 2,
    "decoder_layers": [6, 6],
    "hcca_per_nlayers": 1,
    "enc_chunk_size": 63,
    "chunk_causal_window": 16,
    "enable_alibi": True,
    "enable_softmax_one": True,
    "enable_causal_chunk_attn": True,
    "_flash_attn_2_enabled": True,
    "_triton_gca": True,
}

# Constants of the reference that are not config keys (see docs/weights_tools.md).
ENCODER_RMS_EPS = 1e-6      # encoder LlamaConfig does not pass rms_norm_eps
ENCODER_ROPE_THETA = 10000.0  # nor rope_theta
LMK_NORM_EPS = 1e-5         # flash_attn RMSNorm default, lmk_norms get no eps

STORAGE_DTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}
TORCH_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def make_config(**overrides):
    cfg = copy.deepcopy(REFERENCE_CONFIG)
    for key, value in overrides.items():
        cfg[key] = value
    check_config(cfg)
    return cfg


def load_config(path):
    with open(path) as f:
        cfg = json.load(f)
    if cfg.get("num_key_value_heads") is None:  # LlamaConfig's default
        cfg["num_key_value_heads"] = cfg.get("num_attention_heads")
    check_config(cfg)
    return cfg


def save_config(cfg, path):
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def check_config(cfg):
    """Raises ValueError listing every problem that makes `cfg` unusable."""
    problems = []
    ints = ["vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "encoder_layers", "enc_chunk_size", "chunk_topk",
            "slide_window", "chunk_id", "pad_id"]
    for key in ints:
        if not isinstance(cfg.get(key), int) or isinstance(cfg.get(key), bool):
            problems.append(f"{key} must be an integer, got {cfg.get(key)!r}")
    layers = cfg.get("decoder_layers")
    if not (isinstance(layers, list) and len(layers) >= 2
            and all(isinstance(n, int) and n >= 0 for n in layers)):
        problems.append(f"decoder_layers must be [N_lower, n_1, ...] (>= 1 group), got {layers!r}")
    if problems:
        raise ValueError("bad config: " + "; ".join(problems))
    d, h, hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if h <= 0 or d % h:
        problems.append(f"hidden_size {d} not divisible by num_attention_heads {h}")
    if hkv <= 0 or h % hkv:
        problems.append(f"num_attention_heads {h} not divisible by num_key_value_heads {hkv}")
    if (cfg["enc_chunk_size"] + 1) % 64:
        # The reference zeroes the landmark row of chunk K/V only in this case.
        problems.append(f"enc_chunk_size + 1 must be a multiple of 64, got {cfg['enc_chunk_size']}")
    if cfg["chunk_topk"] < 1 or cfg["slide_window"] < 0 or cfg["encoder_layers"] < 0:
        problems.append("chunk_topk >= 1, slide_window >= 0, encoder_layers >= 0 required")
    for key in ("chunk_id", "pad_id"):
        if not 0 <= cfg[key] < cfg["vocab_size"]:
            problems.append(f"{key} {cfg[key]} outside the vocabulary")
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        problems.append(f"hidden_act {cfg.get('hidden_act')!r}: only silu (SwiGLU) is supported")
    if cfg.get("attention_bias", False):
        problems.append("attention_bias true is not supported")
    if cfg.get("gpt2_mlp", False):
        problems.append("gpt2_mlp true is not supported")
    if problems:
        raise ValueError("bad config: " + "; ".join(problems))


def _block(prefix, d, heads, kv_heads, ffn):
    dh = d // heads
    return [
        (f"{prefix}.input_layernorm.weight", [d]),
        (f"{prefix}.post_attention_layernorm.weight", [d]),
        (f"{prefix}.self_attn.q_proj.weight", [heads * dh, d]),
        (f"{prefix}.self_attn.k_proj.weight", [kv_heads * dh, d]),
        (f"{prefix}.self_attn.v_proj.weight", [kv_heads * dh, d]),
        (f"{prefix}.self_attn.o_proj.weight", [d, heads * dh]),
        (f"{prefix}.mlp.gate_proj.weight", [ffn, d]),
        (f"{prefix}.mlp.up_proj.weight", [ffn, d]),
        (f"{prefix}.mlp.down_proj.weight", [d, ffn]),
    ]


def expected_tensors(cfg, with_lm_head=None):
    """[(name, shape)] in a stable order. with_lm_head defaults to
    `not tie_word_embeddings` (the model-directory convention)."""
    d, h, hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    ffn, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    if with_lm_head is None:
        with_lm_head = not cfg.get("tie_word_embeddings", True)
    out = [("model.embed_tokens.weight", [vocab, d])]
    for i in range(cfg["decoder_layers"][0]):
        out += _block(f"model.lower_layers.{i}", d, h, hkv, ffn)
    for g, n in enumerate(cfg["decoder_layers"][1:]):
        for j in range(n):
            p = f"model.upper_layers.{g}.{j}"
            out += _block(p, d, h, hkv, ffn)
            out += [(f"{p}.gca.pre_norm.weight", [d]),
                    (f"{p}.gca.q_proj.weight", [d, d]),
                    (f"{p}.gca.o_proj.weight", [d, d])]
    out += [(f"model.lmk_norms.{g}.weight", [d]) for g in range(len(cfg["decoder_layers"]) - 1)]
    out.append(("model.enc_prenorm.weight", [d]))
    for e in range(cfg["encoder_layers"]):
        out += _block(f"model.encoder.layers.{e}", d, h, h, ffn)
    out += [("model.encoder.norm.weight", [d]),
            ("model.chunk_k_proj.weight", [d, d]),
            ("model.chunk_v_proj.weight", [d, d]),
            ("model.norm.weight", [d])]
    if with_lm_head:
        out.append(("lm_head.weight", [vocab, d]))
    return out


def is_norm_weight(name):
    return name.endswith("norm.weight") or ".lmk_norms." in name
