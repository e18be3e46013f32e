"""Writes a randomly initialised DRT model directory (numpy only, no torch).

    /usr/bin/python3 weights_tools/make_random_model.py --out models/drt-random \\
        --tokenizer ../shared/reference/gpt2-tokenizer/tokenizer.json

Output: config.json (every key of the reference config), model.safetensors,
tokenizer.json (copied when --tokenizer is given). Defaults give the bundled
default model: GPT-2 vocabulary, d=256, 4 heads, [2,2] decoder layers, one
encoder layer. Init as the reference's _init_weights: linear and embedding
weights N(0, init_std), the pad row of the embedding zero, norm weights one.
"""
import argparse
import os
import shutil
import sys

import numpy as np

import drt_config
import safetensors_io


def random_weights(cfg, seed, std):
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in drt_config.expected_tensors(cfg):
        if drt_config.is_norm_weight(name):
            weights[name] = np.ones(shape, np.float32)
        else:
            weights[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    weights["model.embed_tokens.weight"][cfg["pad_id"]] = 0.0
    return weights


def parse_layers(text):
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", help="tokenizer.json to copy into the model directory")
    p.add_argument("--dtype", choices=sorted(drt_config.STORAGE_DTYPES), default="f32")
    p.add_argument("--init-std", type=float, default=0.02)
    p.add_argument("--vocab-size", type=int, default=50265)
    p.add_argument("--pad-id", type=int, default=50257)
    p.add_argument("--chunk-id", type=int, default=50264)
    p.add_argument("--bos-id", type=int, default=50256)
    p.add_argument("--eos-id", type=int, default=50256)
    p.add_argument("--mask-id", type=int, default=50263)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=4)
    p.add_argument("--intermediate-size", type=int, default=768)
    p.add_argument("--decoder-layers", type=parse_layers, default=[2, 2],
                   help="N_lower,n_1,...,n_G (default 2,2)")
    p.add_argument("--encoder-layers", type=int, default=1)
    p.add_argument("--enc-chunk-size", type=int, default=63)
    p.add_argument("--chunk-topk", type=int, default=8)
    p.add_argument("--slide-window", type=int, default=512)
    p.add_argument("--rms-norm-eps", type=float, default=1e-5)
    p.add_argument("--untied", action="store_true", help="separate lm_head.weight (default: tied)")
    args = p.parse_args(argv)

    storage = drt_config.STORAGE_DTYPES[args.dtype]
    try:
        cfg = drt_config.make_config(
            vocab_size=args.vocab_size, pad_id=args.pad_id, chunk_id=args.chunk_id,
            bos_id=args.bos_id, eos_id=args.eos_id, mask_id=args.mask_id,
            hidden_size=args.hidden_size, num_attention_heads=args.num_heads,
            num_key_value_heads=args.num_kv_heads, intermediate_size=args.intermediate_size,
            decoder_layers=args.decoder_layers, encoder_layers=args.encoder_layers,
            enc_chunk_size=args.enc_chunk_size, chunk_topk=args.chunk_topk,
            slide_window=args.slide_window, rms_norm_eps=args.rms_norm_eps,
            initializer_range=args.init_std, tie_word_embeddings=not args.untied,
            torch_dtype=drt_config.TORCH_DTYPE_NAMES[storage])
    except ValueError as e:
        p.error(str(e))
    if args.tokenizer and not os.path.isfile(args.tokenizer):
        p.error(f"--tokenizer {args.tokenizer}: no such file")

    weights = random_weights(cfg, args.seed, args.init_std)
    os.makedirs(args.out, exist_ok=True)
    drt_config.save_config(cfg, os.path.join(args.out, "config.json"))
    safetensors_io.save_file(weights, os.path.join(args.out, "model.safetensors"),
                             dtypes={n: storage for n in weights},
                             metadata={"format": "pt", "random_init_seed": str(args.seed)})
    if args.tokenizer:
        shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    params = sum(w.size for w in weights.values())
    print(f"wrote {args.out}: {params / 1e6:.2f}M parameters, {args.dtype}"
          + ("" if args.tokenizer else " (no tokenizer.json: pass --tokenizer)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
