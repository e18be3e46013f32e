"""Minimal numpy-only reader/writer for the safetensors format.

File layout: 8-byte little-endian header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the data section. Writing: tensors sorted by name, stored contiguously,
header padded with spaces so the data section starts at a multiple of 8.

Supported dtypes: F32, F16, BF16, I32, I64. numpy has no bfloat16: BF16 data is
converted from float arrays with round-to-nearest-even on write and widened
(exactly) to float32 on read.
"""
import json
import struct

import numpy as np

_NP_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
}
_DEFAULT_NAMES = {
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int32"): "I32",
    np.dtype("int64"): "I64",
}
FLOAT_DTYPES = ("F32", "F16", "BF16")


def f32_to_bf16_bits(x):
    """float array -> uint16 bfloat16 bit patterns, round to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():  # keep NaN a (quiet) NaN: rounding could carry it into inf
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def to_storage(array, dtype):
    """`array` as the elements the file holds for `dtype`: little-endian
    float32 or float16, bfloat16 bit patterns (uint16), int32 or int64. The
    one conversion a tensor needs: save_file(..., stored=True) writes the
    result as it is, and storage_finite() checks it (weights_tools/export.py
    uses both, so that it converts each tensor once). An f16 overflow warns
    as numpy's cast does; the result holds inf there."""
    if dtype not in _NP_DTYPES:
        raise ValueError(f"unsupported safetensors dtype {dtype!r}")
    a = np.asarray(array)
    if dtype in FLOAT_DTYPES:
        if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
            raise TypeError(f"cannot store {a.dtype} as {dtype}")
        if dtype == "BF16":
            return f32_to_bf16_bits(a.astype(np.float32, copy=False)).astype("<u2", copy=False)
        # A value beyond f16's range becomes inf, and numpy warns ("overflow
        # encountered in cast") unless the caller silenced it: export.py does,
        # around this call only, because it checks storage_finite() after.
        return a.astype(_NP_DTYPES[dtype], copy=False)
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"cannot store {a.dtype} as {dtype}")
    info = np.iinfo(_NP_DTYPES[dtype])
    if a.size and (a.min() < info.min or a.max() > info.max):
        raise ValueError(f"integer values out of range for {dtype}")
    return a.astype(_NP_DTYPES[dtype], copy=False)


def storage_finite(stored, dtype):
    """Whether every element of to_storage(x, dtype) is finite (no inf or
    NaN); read from the stored elements themselves, without widening them
    (bfloat16: the exponent bits all set)."""
    if dtype == "BF16":
        return not bool(((np.asarray(stored) & np.uint16(0x7F80)) == np.uint16(0x7F80)).any())
    if dtype in FLOAT_DTYPES:
        return bool(np.isfinite(stored).all())
    return True


def save_file(tensors, path, metadata=None, dtypes=None, stored=False):
    """Writes `tensors` (name -> numpy array) to `path`.

    dtypes: optional name -> safetensors dtype ("F32", "F16", "BF16", "I32",
    "I64"); by default the dtype follows the array (float32, float16, int32,
    int64; anything else must be given explicitly). metadata: str -> str.
    stored: the arrays are to_storage() results for the dtypes given (every
    tensor's dtype then given), written without another conversion.
    """
    dtypes = dict(dtypes or {})
    header = {}
    arrays = []
    offset = 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved")
        array = np.asarray(tensors[name])
        dtype = dtypes.pop(name, None) or (None if stored else _DEFAULT_NAMES.get(array.dtype))
        if dtype is None:
            raise TypeError(f"{name}: no default safetensors dtype for {array.dtype}; pass dtypes")
        if stored:
            if array.dtype != _NP_DTYPES[dtype]:
                raise TypeError(f"{name}: stored=True needs {_NP_DTYPES[dtype]} elements for {dtype}, "
                                f"got {array.dtype}")
            data = np.ascontiguousarray(array)
        else:
            data = np.ascontiguousarray(to_storage(array, dtype))
        header[name] = {"dtype": dtype, "shape": [int(s) for s in array.shape],
                        "data_offsets": [offset, offset + data.nbytes]}
        arrays.append(data)
        offset += data.nbytes
    if dtypes:
        raise KeyError(f"dtypes given for unknown tensors: {sorted(dtypes)}")
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata must map str to str")
        header = {"__metadata__": dict(metadata), **header}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in arrays:
            f.write(data.reshape(-1).view(np.uint8).data)


def read_header(path):
    """Returns (header without __metadata__, metadata dict, data section start)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: too short for a safetensors file")
        (n,) = struct.unpack("<Q", raw)
        text = f.read(n)
        if len(text) != n:
            raise ValueError(f"{path}: header length {n} exceeds file size")
    header = json.loads(text.decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    return header, metadata, 8 + n


def load_file(path, with_dtypes=False):
    """Reads every tensor of `path` into numpy arrays (BF16 widened to float32).

    Returns {name: array}, or ({name: array}, {name: dtype}, metadata) when
    with_dtypes is true.
    """
    header, metadata, start = read_header(path)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    tensors, dtypes = {}, {}
    for name, info in header.items():
        dtype = info["dtype"]
        if dtype not in _NP_DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        npd = _NP_DTYPES[dtype]
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= begin <= end <= len(data) or end - begin != count * npd.itemsize:
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {info['data_offsets']}")
        array = np.frombuffer(data, dtype=npd, count=count, offset=begin).reshape(shape)
        if dtype == "BF16":
            array = bf16_bits_to_f32(array)
        tensors[name] = array.astype(array.dtype.newbyteorder("="), copy=True)
        dtypes[name] = dtype
    if with_dtypes:
        return tensors, dtypes, metadata
    return tensors
