"""Converts a reference DRT training checkpoint into a drt-server model directory.

    /usr/bin/python3 weights_tools/export.py --checkpoint run/pytorch_model.bin \\
        --config run/config.json --tokenizer gpt2/tokenizer.json --out models/drt-128m --dtype bf16

Input: a DRTForCausalLM state dict (pytorch_model.bin / any torch.save file,
read with torch.load; or a .safetensors file, read without torch), its config
JSON and optionally tokenizer.json. Output: config.json, model.safetensors,
tokenizer.json.

Every expected name and shape (derived from the config) is checked; missing,
unexpected and wrong-shape names are all reported and nothing is written.
A "module." prefix (DataParallel/DDP) is stripped. The reference's ALiBi
buffers `*.self_attn.m` are checked against the slopes implied by the config
and dropped. With tie_word_embeddings, lm_head.weight is dropped when it equals
the embedding (the engine uses model.embed_tokens.weight); if it differs the
export fails unless --untie, which keeps it and sets tie_word_embeddings false.
"""
import argparse
import os
import re
import shutil
import sys

import numpy as np

import drt_config
import safetensors_io

_DERIVED_BUFFER = re.compile(r"\.self_attn\.(rotary_emb\.)?(inv_freq|cos_cached|sin_cached)$")
_ALIBI_BUFFER = re.compile(r"^model\.(lower_layers\.\d+|upper_layers\.\d+\.\d+)\.self_attn\.m$")


class ExportError(Exception):
    pass


def load_state(path):
    """name -> float/int numpy array (bf16 widened to float32)."""
    if path.endswith(".safetensors"):
        return safetensors_io.load_file(path)
    import torch  # only needed for torch.save files
    obj = torch.load(path, map_location="cpu")
    for key in ("state_dict", "model_state_dict", "model", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise ExportError(f"{path}: expected a state dict, got {type(obj).__name__}")
    state = {}
    for name, value in obj.items():
        if not torch.is_tensor(value):
            raise ExportError(f"{path}: entry {name!r} is a {type(value).__name__}, not a tensor")
        value = value.detach().cpu()
        state[name] = value.float().numpy() if value.is_floating_point() else value.numpy()
    return state


def strip_prefix(state):
    out = {}
    for name, value in state.items():
        while name.startswith("module."):
            name = name[len("module."):]
        if name in out:
            raise ExportError(f"duplicate name {name!r} after stripping 'module.'")
        out[name] = value
    return out


def alibi_slopes(num_heads):
    base = 2.0 ** (8.0 / num_heads)
    return np.array([1.0 / base ** (h + 1) for h in range(num_heads)])


def drop_buffers(state, cfg, notes):
    """Removes non-learned buffers, checking the ALiBi slopes."""
    want = alibi_slopes(cfg["num_attention_heads"])
    for name in sorted(state):
        if _DERIVED_BUFFER.search(name):
            del state[name]
        elif _ALIBI_BUFFER.match(name):
            m = np.asarray(state.pop(name), dtype=np.float64).reshape(-1)
            if m.shape != want.shape or not np.allclose(m, want, rtol=1e-2, atol=0):
                raise ExportError(f"{name}: ALiBi slopes {m.tolist()} differ from those of "
                                  f"num_attention_heads={cfg['num_attention_heads']}: {want.tolist()}")
            if not np.allclose(m, want, rtol=1e-6, atol=0):
                notes.append(f"warning: {name} differs from the exact slopes by up to "
                             f"{np.max(np.abs(m / want - 1)):.1e} (relative); the engine uses exact ones")


def resolve_lm_head(state, cfg, untie, notes):
    if not cfg.get("tie_word_embeddings", True):
        return
    lm = state.get("lm_head.weight")
    emb = state.get("model.embed_tokens.weight")
    if lm is None or emb is None:
        return
    if lm.shape == emb.shape and np.array_equal(lm, emb):
        del state["lm_head.weight"]
        notes.append("lm_head.weight equals model.embed_tokens.weight (tied): dropped")
    elif untie:
        cfg["tie_word_embeddings"] = False
        notes.append("lm_head.weight differs from the embedding: kept, tie_word_embeddings set to false")
    else:
        raise ExportError("tie_word_embeddings is true but lm_head.weight differs from "
                          "model.embed_tokens.weight; pass --untie to keep a separate lm_head")


def check_names(state, cfg):
    expected = dict(drt_config.expected_tensors(cfg))
    missing = [n for n in expected if n not in state]
    unexpected = sorted(n for n in state if n not in expected)
    wrong = [f"{n}: {list(state[n].shape)}, expected {expected[n]}"
             for n in expected if n in state and list(state[n].shape) != expected[n]]
    not_float = [n for n in expected if n in state and not np.issubdtype(state[n].dtype, np.floating)]
    lines = []
    for title, items in (("missing", missing), ("unexpected", unexpected),
                         ("wrong shape", wrong), ("not floating point", not_float)):
        if items:
            lines.append(f"{len(items)} {title}:")
            lines += [f"  {item}" for item in items]
    if lines:
        raise ExportError("checkpoint does not match the config:\n" + "\n".join(lines))


# The keys engine/model_config.cc reads with OptionalBool: present, each must
# be a JSON boolean; anything else (0, null, "false") the engine refuses with
# "must be true or false, got <type>".
ENGINE_BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "gpt2_mlp", "enable_alibi",
                    "_flash_attn_2_enabled")


def json_type_name(value):
    """The JSON type of a loaded value, named as nlohmann's type_name() does."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def config_notes(cfg):
    """Refuses what the engine refuses (engine/model_config.cc: a boolean key
    that is not a JSON boolean is invalid; _flash_attn_2_enabled or
    enable_alibi false is Unsupported), so that no directory is written that
    drt-server would then refuse; warns when a key is missing, which the
    engine reads as true."""
    notes = []
    for key in ENGINE_BOOL_KEYS:
        if key in cfg and not isinstance(cfg[key], bool):
            raise ExportError(f"key '{key}' must be true or false, got {json_type_name(cfg[key])} "
                              f"({cfg[key]!r}); drt-server refuses this config")
    if cfg.get("_flash_attn_2_enabled") is False:
        raise ExportError("_flash_attn_2_enabled is false: the reference then runs eager decoder attention "
                          "with neither ALiBi nor the sliding window, and drt-server serves only the ALiBi "
                          "sliding-window attention (it refuses this config)")
    if cfg.get("enable_alibi") is False:
        raise ExportError("enable_alibi is false: drt-server's decoder attention uses ALiBi (it refuses "
                          "this config)")
    for key in ("_flash_attn_2_enabled", "enable_alibi"):
        if key not in cfg:
            notes.append(f"warning: the config has no {key}; drt-server reads it as true (the reference's "
                         "flash-attention path with ALiBi and the window). If the checkpoint was trained "
                         "without it, the served model will not behave as trained.")
    return notes


def range_error(name, value, dtype, storage):
    """The refusal of a tensor whose finite values become infinities in
    `storage` (|x| >= 65520 in f16: values up to there round to its largest,
    65504; about 3.39e38 in bf16), which drt-server would then refuse as a
    corrupt or diverged checkpoint (review-tools #4)."""
    largest = float(np.abs(value).max())
    wider = "bf16 or f32" if storage == "F16" else "f32"
    return ExportError(f"{name}: max |x| {largest:.6g} does not fit {dtype} (it would be stored as inf); "
                       f"export with --dtype {wider}")


def export(checkpoint, config_path, out, dtype="f32", tokenizer=None, untie=False):
    cfg = drt_config.load_config(config_path)
    notes = config_notes(cfg)
    state = strip_prefix(load_state(checkpoint))
    drop_buffers(state, cfg, notes)
    resolve_lm_head(state, cfg, untie, notes)
    check_names(state, cfg)
    storage = drt_config.STORAGE_DTYPES[dtype]
    cfg["torch_dtype"] = drt_config.TORCH_DTYPE_NAMES[storage]
    # Each tensor is converted once: the stored elements are checked and
    # then written as they are (it was converted twice, once to check its
    # range and once to save it).
    stored = {}
    for name, value in state.items():
        if not np.isfinite(value).all():
            raise ExportError(f"{name}: contains NaN or inf")
        # numpy's f16 overflow warning is silenced here only: the check
        # below refuses the tensor with its name and max |x| instead.
        with np.errstate(over="ignore"):
            stored[name] = safetensors_io.to_storage(value, storage)
        if not safetensors_io.storage_finite(stored[name], storage):
            raise range_error(name, value, dtype, storage)
    os.makedirs(out, exist_ok=True)
    drt_config.save_config(cfg, os.path.join(out, "config.json"))
    safetensors_io.save_file(stored, os.path.join(out, "model.safetensors"),
                             dtypes={n: storage for n in stored}, stored=True,
                             metadata={"format": "pt", "source": os.path.basename(checkpoint)})
    if tokenizer:
        shutil.copyfile(tokenizer, os.path.join(out, "tokenizer.json"))
    return notes, sum(v.size for v in state.values())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="pytorch_model.bin (torch.save state dict) or .safetensors")
    p.add_argument("--config", required=True, help="the checkpoint's config JSON")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--tokenizer", help="tokenizer.json to copy")
    p.add_argument("--dtype", choices=sorted(drt_config.STORAGE_DTYPES), default="f32",
                   help="storage dtype of model.safetensors (default f32, lossless for fp32 checkpoints)")
    p.add_argument("--untie", action="store_true",
                   help="keep an lm_head.weight that differs from the tied embedding")
    args = p.parse_args(argv)
    try:
        notes, params = export(args.checkpoint, args.config, args.out, args.dtype, args.tokenizer, args.untie)
    except (ExportError, ValueError, OSError) as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    for note in notes:
        print(note, file=sys.stderr)
    print(f"wrote {args.out}: {params / 1e6:.2f}M parameters, {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
