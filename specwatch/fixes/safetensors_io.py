"""Write safetensors files through the `safetensors` library, any dtype (BF16 included).

numpy has no bfloat16, so tensors travel as (dtype code, shape, raw little-endian bytes) and are
handed to `safetensors.serialize_file` as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

# safetensors header dtype code → the library's dtype name.
DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64",
               "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32",
               "U64": "uint64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}

RawTensor = tuple[str, tuple[int, ...], bytes]  # (dtype code, shape, data)


def write_safetensors(path: str | Path, tensors: dict[str, RawTensor], metadata: dict[str, str] | None = None,
                      *, mode: int | None = None) -> None:
    """Write `tensors` (name → (dtype code, shape, bytes)) to `path` with permission bits `mode`
    (None: 0666 less the umask, as for any new file; the library alone leaves its 0600 temp
    file's mode). Raises KeyError for an unknown dtype code, ValueError (from the library) when a
    length does not match its shape."""
    import numpy as np
    import safetensors

    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8 takes raw buffers
        keep = {k: np.frombuffer(data, dtype=np.uint8).copy() for k, (_, _, data) in tensors.items()}
        specs = {k: safetensors.TensorSpec(dtype=DTYPE_NAMES[code], shape=tuple(shape),
                                           data_ptr=keep[k].ctypes.data, data_len=len(data))
                 for k, (code, shape, data) in tensors.items()}
        safetensors.serialize_file(specs, str(path), metadata=metadata)
    else:  # safetensors < 0.8 takes dicts; the installed library's stubs type only its own (>= 0.8) form
        safetensors.serialize_file({k: {"dtype": DTYPE_NAMES[code], "shape": list(shape), "data": data}  # type: ignore[misc]
                                    for k, (code, shape, data) in tensors.items()}, str(path), metadata=metadata)
    os.chmod(path, _new_file_mode() if mode is None else mode)


def _new_file_mode() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: restored at once
    os.umask(mask)
    return 0o666 & ~mask


def from_numpy(arr, code: str | None = None) -> RawTensor:
    """A numpy array → RawTensor; `code="BF16"` rounds float32 to bfloat16 (nearest even)."""
    import numpy as np

    if code == "BF16":
        bits = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
        return "BF16", tuple(arr.shape), rounded.tobytes()
    codes = {"float16": "F16", "float32": "F32", "float64": "F64", "int64": "I64", "int32": "I32",
             "bool": "BOOL", "uint8": "U8", "int8": "I8"}
    dtypes = {v: k for k, v in codes.items()}
    a = np.ascontiguousarray(arr, dtype=dtypes[code] if code else None)
    return codes[a.dtype.name], tuple(a.shape), a.astype(a.dtype.newbyteorder("<")).tobytes()
