#!/usr/bin/env python3
"""weights_tools/export.py refuses a config that drt-server refuses
(engine/model_config.cc: _flash_attn_2_enabled or enable_alibi false is
Unsupported) and writes nothing; it warns when either key is missing, which
the engine reads as true (review-tools 2026-11-24 #18: it used to warn and
write a directory the server then refused).

The checkpoint is a random model from make_random_model.py (numpy only; a
.safetensors checkpoint needs no torch), exported with its own config edited.

    export_refusals_test.py
"""
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = os.path.join(REPO, "weights_tools")
FAILED = []


def expect(ok, what, detail=""):
    print(("ok: " if ok else "FAILED: ") + what + ("" if ok or not detail else f"\n  {detail}"))
    if not ok:
        FAILED.append(what)


def check_storage_range(tmp, source):
    """A weight that is finite in float32 but beyond the storage dtype's
    range is refused, naming the tensor and its max |x|, instead of being
    written as inf that drt-server then blames on a corrupt or diverged
    checkpoint (review-tools #4). Limits: f16's largest finite value is
    65504, and round-to-nearest takes values below 65520 to it; bf16's is
    about 3.3895e38, with values from about 3.3961e38 rounding to inf."""
    sys.path.insert(0, TOOLS)
    import safetensors_io
    base = safetensors_io.load_file(os.path.join(source, "model.safetensors"))
    for value, dtype, fits in ((1e5, "f16", False), (65520.0, "f16", False), (65519.0, "f16", True),
                               (-1e5, "f16", False), (1e5, "bf16", True), (1e5, "f32", True),
                               (3.4e38, "bf16", False), (3.4e38, "f32", True)):
        state = {k: v.copy() for k, v in base.items()}
        state["model.norm.weight"][0] = value
        name = f"range-{value:g}-{dtype}"
        checkpoint = os.path.join(tmp, name + ".safetensors")
        safetensors_io.save_file(state, checkpoint)
        out = os.path.join(tmp, "out-" + name)
        run = subprocess.run([sys.executable, os.path.join(TOOLS, "export.py"), "--checkpoint", checkpoint,
                              "--config", os.path.join(source, "config.json"), "--out", out, "--dtype", dtype],
                             capture_output=True, text=True, timeout=120)
        log = run.stdout + run.stderr
        if fits:
            written = safetensors_io.load_file(os.path.join(out, "model.safetensors")) if run.returncode == 0 else {}
            stored = float(written["model.norm.weight"][0]) if written else None
            expect(run.returncode == 0 and stored is not None and abs(stored - value) <= abs(value) * 2 ** -8,
                   f"model.norm.weight[0] = {value:g} as {dtype}: exported, read back {stored} "
                   "(within bf16's relative rounding, 2^-8)", log[-600:])
        else:
            expect(run.returncode == 1 and f"model.norm.weight: max |x| {abs(value):g} does not fit {dtype}" in log
                   and "Traceback" not in log and "RuntimeWarning" not in log and not os.path.exists(out),
                   f"model.norm.weight[0] = {value:g} as {dtype}: refused, naming the tensor and max |x|, "
                   "no numpy warning, nothing written", log[-600:])


def check_plain_writer_warns(tmp):
    """safetensors_io.save_file of a finite float beyond f16's range still
    gets numpy's overflow warning (review-toolsfix3 #2: to_storage silenced
    it for every caller, while only export.py checks the stored elements)."""
    import warnings
    import numpy as np
    sys.path.insert(0, TOOLS)
    import safetensors_io
    with warnings.catch_warnings(record=True) as caught, np.errstate(over="warn"):
        warnings.simplefilter("always")
        safetensors_io.save_file({"x": np.array([1e6], np.float32)}, os.path.join(tmp, "overflow.safetensors"),
                                 dtypes={"x": "F16"})
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    expect(any("overflow" in m for m in messages),
           "save_file of 1e6 as F16 outside export.py warns of the overflow", f"warnings: {messages}")


def reference_storage(array, storage):
    """The bytes a tensor should be stored as, converted here without
    safetensors_io (review-toolsfix3 #3: comparing export.py with
    save_file compared to_storage with itself): F32 and F16 by numpy's
    astype, BF16 by rounding the float32 bits to nearest, ties to even,
    written out on the two halves of each 32-bit pattern. Finite input only
    (the random model's)."""
    import numpy as np
    x = np.asarray(array, dtype=np.float32)
    if storage == "F32":
        return x.astype("<f4").tobytes()
    if storage == "F16":
        return x.astype("<f2").tobytes()
    bits = x.reshape(-1).view(np.uint32).astype(np.uint64)
    high, low = bits >> 16, bits & 0xFFFF
    up = (low > 0x8000) | ((low == 0x8000) & ((high & 1) == 1))
    return (high + up).astype("<u2").tobytes()


def check_reference_storage():
    """The test's own bf16 rounding on values whose result is known by
    hand: 1 + 2^-8 lies halfway between 1 (0x3F80) and 1 + 2^-7 (0x3F81)
    and goes to the even 0x3F80; 1 + 3*2^-8 is halfway between 0x3F81 and
    0x3F82 and goes to 0x3F82; just above the first halfway rounds up."""
    import numpy as np
    values = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -2.0], np.float32)
    got = list(np.frombuffer(reference_storage(values, "BF16"), "<u2"))
    expect(got == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC000],
           "the test's reference bf16 rounding gives the hand-worked bit patterns", f"got {[hex(g) for g in got]}")


def check_converts_once(tmp, source):
    """export() converts each tensor to its storage type once (it converted
    twice: once to check the range, once to save), and writes the right
    elements. Counted in-process on bf16, whose conversion is
    safetensors_io.f32_to_bf16_bits (one call per tensor); each exported
    tensor's bytes are compared with reference_storage(), the test's own
    conversion, in f16, bf16 and f32."""
    sys.path.insert(0, TOOLS)
    import export as export_module
    import safetensors_io
    tensors = safetensors_io.load_file(os.path.join(source, "model.safetensors"))
    # Random weights almost never sit exactly halfway between two bf16
    # values (1 in 2^16), so the ties of check_reference_storage are put in.
    tensors["model.norm.weight"][:4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 65519.0]
    checkpoint = os.path.join(tmp, "ties.safetensors")
    safetensors_io.save_file(tensors, checkpoint)
    calls = []
    real = safetensors_io.f32_to_bf16_bits
    safetensors_io.f32_to_bf16_bits = lambda x: (calls.append(x.shape), real(x))[1]
    try:
        export_module.export(checkpoint, os.path.join(source, "config.json"), os.path.join(tmp, "once-bf16"),
                             dtype="bf16")
    finally:
        safetensors_io.f32_to_bf16_bits = real
    expect(len(calls) == len(tensors),
           f"bf16 export converts each of the {len(tensors)} tensors once ({len(calls)} conversions)")
    for dtype, storage in (("f16", "F16"), ("bf16", "BF16"), ("f32", "F32")):
        out = os.path.join(tmp, f"same-{dtype}")
        export_module.export(checkpoint, os.path.join(source, "config.json"), out, dtype=dtype)
        path = os.path.join(out, "model.safetensors")
        header, _, start = safetensors_io.read_header(path)
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
        wrong = [n for n in sorted(tensors)
                 if n not in header or header[n]["dtype"] != storage
                 or header[n]["shape"] != list(tensors[n].shape)
                 or data[header[n]["data_offsets"][0]:header[n]["data_offsets"][1]]
                 != reference_storage(tensors[n], storage)]
        expect(sorted(header) == sorted(tensors) and not wrong,
               f"{dtype}: each of the {len(tensors)} exported tensors holds the test's own {storage} conversion",
               f"differing: {wrong[:5]}")


def main():
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("SKIPPED: no numpy for weights_tools")
        return 77
    with tempfile.TemporaryDirectory(prefix="drt-export-refusals-") as tmp:
        source = os.path.join(tmp, "source")
        subprocess.run([sys.executable, os.path.join(TOOLS, "make_random_model.py"), "--out", source,
                        "--vocab-size", "300", "--pad-id", "256", "--bos-id", "256", "--eos-id", "256",
                        "--chunk-id", "257", "--mask-id", "256", "--hidden-size", "32", "--num-heads", "2", "--num-kv-heads", "2",
                        "--intermediate-size", "64"], check=True, capture_output=True)
        with open(os.path.join(source, "config.json")) as f:
            base = json.load(f)
        expect(base.get("_flash_attn_2_enabled") is True and base.get("enable_alibi") is True,
               "the random model's config has both keys true (the served path)")

        def export(name, edit):
            cfg = dict(base)
            edit(cfg)
            cfg_path = os.path.join(tmp, f"{name}.json")
            with open(cfg_path, "w") as f:
                json.dump(cfg, f)
            out = os.path.join(tmp, f"out-{name}")
            run = subprocess.run([sys.executable, os.path.join(TOOLS, "export.py"), "--checkpoint",
                                  os.path.join(source, "model.safetensors"), "--config", cfg_path, "--out", out],
                                 capture_output=True, text=True, timeout=120)
            return run, out

        for key in ("_flash_attn_2_enabled", "enable_alibi"):
            run, out = export(f"{key}-false", lambda c, k=key: c.__setitem__(k, False))
            expect(run.returncode == 1 and f"{key} is false" in run.stderr and "refuses" in run.stderr,
                   f"{key} false: refused, naming the key", run.stderr[-600:])
            expect(not os.path.exists(out), f"{key} false: nothing written")

            run, out = export(f"{key}-missing", lambda c, k=key: c.pop(k))
            expect(run.returncode == 0 and f"the config has no {key}" in (run.stdout + run.stderr),
                   f"{key} missing: exported with a warning", (run.stdout + run.stderr)[-600:])

        # Values that are not JSON booleans: the engine's OptionalBool refuses
        # them ("must be true or false, got <type>"); export.py used to let
        # them through (only a literal false was caught).
        for key in ("_flash_attn_2_enabled", "enable_alibi", "tie_word_embeddings"):
            for value, type_name in ((0, "number"), (1, "number"), (None, "null"), ("false", "string"),
                                     ("true", "string")):
                name = f"{key}-{type_name}-{value}"
                run, out = export(name, lambda c, k=key, v=value: c.__setitem__(k, v))
                expect(run.returncode == 1 and f"key '{key}' must be true or false, got {type_name}" in run.stderr
                       and "Traceback" not in run.stderr,
                       f"{key} = {json.dumps(value)}: refused as the engine does", run.stderr[-600:])
                expect(not os.path.exists(out), f"{key} = {json.dumps(value)}: nothing written")

        run, out = export("served", lambda c: None)
        expect(run.returncode == 0 and os.path.isfile(os.path.join(out, "model.safetensors"))
               and "warning" not in run.stdout + run.stderr,
               "both keys true: exported without a warning", (run.stdout + run.stderr)[-600:])

        check_storage_range(tmp, source)
        check_plain_writer_warns(tmp)
        check_reference_storage()
        check_converts_once(tmp, source)
    print(f"{'FAILED' if FAILED else 'passed'}: {len(FAILED)} failures")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
