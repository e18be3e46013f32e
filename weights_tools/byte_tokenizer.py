"""tokenizer.json (Hugging Face `tokenizers` format) for a byte-level model:
id = byte value for 0..255, no merges, then the pad and landmark ids as added
special tokens. A GPT-2 ByteLevel BPE with an empty merge list maps every byte
to its own id, so this file tokenizes exactly like the engine's built-in byte
tokenizer while letting Hugging Face tools (and our loader) read the model
directory like any other.

The pad and landmark entries are there so that their ids decode. Text never
encodes to them: drt-server leaves them out of its added-token split
(docs/tokenizer.md, "Ids text never gives"), so "<|pad|>" in a prompt is its
7 bytes, as the training code encodes text (passkey_data.encode: UTF-8
bytes). Hugging Face `tokenizers` splits them out by default, so a Python
client that counts tokens should count bytes, as the server does.

    /usr/bin/python3 weights_tools/byte_tokenizer.py --out models/drt-passkey-byte/tokenizer.json
"""
import argparse
import json


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def byte_tokenizer_json(pad_id=256, chunk_id=257):
    alphabet = bytes_to_unicode()
    added = [{"id": pad_id, "content": "<|pad|>"}, {"id": chunk_id, "content": "<|chunk|>"}]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [dict(t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
                         for t in added],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": {alphabet[b]: b for b in range(256)}, "merges": []},
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--pad_id", type=int, default=256)
    p.add_argument("--chunk_id", type=int, default=257)
    args = p.parse_args(argv)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(byte_tokenizer_json(args.pad_id, args.chunk_id), f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
