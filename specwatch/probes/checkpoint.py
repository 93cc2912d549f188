"""Read a draft checkpoint and a target model from disk: configs, tensor headers, bounded samples.

Tensor names, dtypes and shapes come from the safetensors headers (`safe_open(...,
framework="numpy")`, `get_slice(name).get_shape()`), so nothing is loaded; values are read only
for the few tensors a probe asks for, and then only a bounded sample of rows. numpy has no
bfloat16, so BF16/F8 samples are read from the file at the offsets of the header (parsed here,
the only place this module reads the format itself), as is the explanation when the library
refuses a header: a header that lies (length past the end of the file, truncated JSON, offsets
that overlap or leave gaps) becomes a `problem` string, never a traceback.

`pytorch_model.bin` is read only through `torch.load(weights_only=True)` when torch is
installed; without torch it is not read at all (never unpickled) and a problem says so.

Formats: `speculators` (`speculators_model_type` / `transformer_layer_config`;
speculators/models/eagle3/config.py 0.9.0), `sglang` (flat, `architectures[0]` an `…Eagle3`
class; SpecForge 0.2.0 `export/to_sglang.py`), `eagle` (SafeAILab/EAGLE: flat `LlamaForCausalLM` +
`draft_vocab_size`, `eagle/traineagle3/config.json`), else `unknown`.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# safetensors refuses headers above 100,000,000 bytes (MAX_HEADER_SIZE, safetensors/src/tensor.rs).
MAX_HEADER_BYTES = 100_000_000
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2")
_NUMPY_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
                 "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16",
                 "F32": "float32", "F64": "float64"}
# A VLM wrapper keeps its language model's config under one of these keys.
TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config")


class CheckpointError(Exception):
    """The path cannot be used at all (not a directory, no config). Bad usage, not a finding."""


OUTSIDE = "outside the checkpoint folder"


def checkpoint_bounds(root: Path) -> Path:
    """The resolved folder every file of checkpoint `root` must resolve into: `root` itself,
    or for a Hugging Face cache snapshot (`models--ORG--NAME/snapshots/REV/`, whose files are
    links to `../../blobs/`) the repo folder `models--ORG--NAME/`."""
    real = root.resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent
    return real


def inside(bounds: Path, path: Path) -> bool:
    """`path`, every link and `..` resolved, is `bounds` or within it (a name from the
    checkpoint, such as a weight_map entry `/etc/shadow` or `../x`, or a link out of the
    folder, is not)."""
    real = path.resolve()
    return real == bounds or bounds in real.parents


def outside_problem(name: str, what: str = "") -> str:
    """The problem line for a file that resolves outside the checkpoint folder (never opened)."""
    return f"{name}: {what + ' ' if what else ''}resolves {OUTSIDE}: not read"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its header declares it. shape: PyTorch order `[out, in]` for weights."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class RawHeader:
    """A validated safetensors header: tensors name → (dtype, shape, (begin, end)) and where the
    data section starts (bytes from the start of the file)."""

    data_start: int
    entries: dict[str, tuple[str, tuple[int, ...], tuple[int, int]]]


def read_raw_header(path: Path) -> RawHeader:
    """Parse and check a safetensors header without trusting it.

    Layout: 8-byte little-endian length N, N bytes of JSON, then the data. Checks: N within the
    file and under 100 MB; JSON object; every entry a known dtype, non-negative shape and
    `data_offsets` whose length is numel × dtype size; entries contiguous from 0, without
    overlap, ending at the end of the file. Raises ValueError naming the first lie found.
    """
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"file is {size} bytes, shorter than the 8-byte header length")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES:
            raise ValueError(f"header length {n} bytes is over the 100 MB safetensors limit (file is {size} bytes)")
        if 8 + n > size:
            raise ValueError(f"header length {n} bytes runs past the end of the file ({size} bytes): truncated or corrupt")
        blob = f.read(n)
    try:
        doc = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"header is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError("header is not a JSON object")
    entries: dict[str, tuple[str, tuple[int, ...], tuple[int, int]]] = {}
    for name, entry in doc.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"entry {name!r} is not an object")
        dtype, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"tensor {name!r}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)
                or offs[0] < 0 or offs[1] < offs[0]):
            raise ValueError(f"tensor {name!r}: bad data_offsets {offs!r}")
        want = math.prod(shape) * DTYPE_BYTES[dtype]
        if offs[1] - offs[0] != want:
            raise ValueError(f"tensor {name!r}: data_offsets {offs} hold {offs[1] - offs[0]} bytes, "
                             f"but {dtype} {shape} needs {want}")
        entries[name] = (dtype, tuple(shape), (offs[0], offs[1]))
    pos = 0
    for name, (_, _, (b, end)) in sorted(entries.items(), key=lambda kv: kv[1][2]):
        if b != pos:
            what = "overlaps the previous tensor" if b < pos else f"leaves a gap of {b - pos} bytes"
            raise ValueError(f"tensor {name!r} starts at byte {b} and {what} (inconsistent offsets)")
        pos = end
    if 8 + n + pos != size:
        raise ValueError(f"tensors end at byte {8 + n + pos} but the file has {size} bytes "
                         f"({'truncated' if 8 + n + pos > size else 'trailing data'})")
    return RawHeader(8 + n, entries)


def _read_json(path: Path, bounds: Path | None = None) -> tuple[dict | None, str | None]:
    """(the JSON object, None) or (None, the problem). With `bounds`, a file resolving outside
    it is not opened."""
    if bounds is not None and path.exists() and not inside(bounds, path):
        return None, outside_problem(path.name)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"{path} not found (give the model folder, or its config.json)"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{path.name} is not readable JSON ({e})"
    if not isinstance(doc, dict):
        return None, f"{path.name} is not a JSON object"
    return doc, None


class TensorStore:
    """Tensor headers of a model directory, and bounded reads of their values.

    `tensors`: name → TensorInfo. `problems`: one line per file or index entry that could not be
    read (each is an error finding for the probes); `outside`: those of them naming a file that
    resolves outside the folder (`checkpoint_bounds`), which is never opened. Reads
    `*.safetensors` (sharded through `model.safetensors.index.json` when present), else
    `pytorch_model.bin` through torch.
    """

    def __init__(self, root: Path):
        self.root = root
        self.bounds = checkpoint_bounds(root)
        self.tensors: dict[str, TensorInfo] = {}
        self.problems: list[str] = []
        self.outside: list[str] = []
        self.format: str | None = None  # "safetensors" | "bin" | None (no weights)
        self._raw: dict[str, RawHeader] = {}
        self._bin: dict[str, Any] = {}
        self._scan()

    # -- headers -----------------------------------------------------------------------------
    def _scan(self) -> None:
        index_path = self.root / "model.safetensors.index.json"
        files = sorted(p.name for p in self.root.glob("*.safetensors"))
        self._globbed = set(files)
        expected: dict[str, str] = {}
        if index_path.exists():
            index, err = _read_json(index_path, self.bounds)
            wmap = (index or {}).get("weight_map")
            if err or not isinstance(wmap, dict):
                self.problems.append(f"model.safetensors.index.json: {err or 'no weight_map object'}")
            else:
                expected = {str(k): str(v) for k, v in wmap.items()}
                files = sorted(set(expected.values()))
        if files:
            self.format = "safetensors"
            for name in files:
                self._scan_safetensors(name)
            for key, fname in expected.items():
                info = self.tensors.get(key)
                if info is None and not any(p.startswith(fname) for p in self.problems) and (self.root / fname).exists():
                    self.problems.append(f"model.safetensors.index.json maps {key!r} to {fname}, which has no such tensor")
            return
        bins = sorted(p.name for p in self.root.glob("*.bin"))
        if bins:
            self.format = "bin"
            for name in bins:
                self._scan_bin(name)

    def _refused(self, fname: str, what: str = "") -> bool:
        """True (and the problem recorded) when `fname` resolves outside the folder."""
        if inside(self.bounds, self.root / fname):
            return False
        problem = outside_problem(fname, what)
        self.problems.append(problem)
        self.outside.append(problem)
        return True

    def _scan_safetensors(self, fname: str) -> None:
        path = self.root / fname
        if self._refused(fname, "listed in model.safetensors.index.json," if fname not in self._globbed else ""):
            return
        if not path.is_file():
            self.problems.append(f"{fname}: listed in model.safetensors.index.json but missing")
            return
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                for key in f.keys():
                    sl = f.get_slice(key)
                    self._add(TensorInfo(key, sl.get_dtype(), tuple(sl.get_shape()), fname))
        except Exception as e:  # SafetensorError, OSError: explain it with our own parse
            try:
                read_raw_header(path)
                reason = str(e)
            except (ValueError, OSError) as why:
                reason = str(why)
            self.problems.append(f"{fname}: unreadable safetensors header: {reason}")

    def _scan_bin(self, fname: str) -> None:
        if self._refused(fname):
            return
        try:
            import torch
        except ImportError:
            self.problems.append(
                f"{fname}: a pickle file; specwatch reads it only with torch.load(weights_only=True) and "
                "torch is not installed here (it never unpickles otherwise). Install torch, or convert the "
                "draft to safetensors")
            return
        try:
            state = torch.load(str(self.root / fname), map_location="cpu", weights_only=True)
        except Exception as e:  # weights_only refuses arbitrary objects: report, never retry unsafely
            self.problems.append(f"{fname}: torch.load(weights_only=True) refused it: {e}")
            return
        if not isinstance(state, dict):
            self.problems.append(f"{fname}: not a state dict")
            return
        names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
                 torch.int64: "I64", torch.int32: "I32", torch.bool: "BOOL", torch.uint8: "U8"}
        for key, t in state.items():
            if hasattr(t, "shape") and hasattr(t, "dtype"):
                self._bin[key] = t
                self._add(TensorInfo(key, names.get(t.dtype, str(t.dtype)), tuple(t.shape), fname))

    @property
    def unread(self) -> str | None:
        """Why the weights were not (all) read: the problems joined, or `no weights`; None when
        every tensor the folder declares was read."""
        if self.problems:
            return "; ".join(self.problems)
        return "no weights: neither `*.safetensors` nor `pytorch_model.bin`" if self.format is None else None

    def _add(self, info: TensorInfo) -> None:
        if info.name in self.tensors:
            self.problems.append(f"tensor {info.name!r} is in both {self.tensors[info.name].file} and {info.file}")
        self.tensors[info.name] = info

    # -- values ------------------------------------------------------------------------------
    def values(self, name: str, max_elements: int | None = None):
        """The tensor as a numpy array; floats as float32 (BF16 widened exactly).

        With `max_elements`, a bounded sample: up to 4 blocks of whole rows (along dim 0)
        spread over the tensor, flattened, at most `max_elements` values (one whole row when a
        row alone is longer). Raises KeyError
        for an unknown name, ValueError for a dtype numpy cannot represent (F8).
        """
        import numpy as np

        info = self.tensors[name]
        if info.name in self._bin:
            t = self._bin[name]
            arr = (t.float() if t.is_floating_point() else t).numpy()
            return arr.reshape(-1)[:max_elements] if max_elements else arr
        if not info.shape or max_elements is None or info.numel <= max_elements:
            return self._read_rows(info, 0, info.shape[0] if info.shape else 1)
        rows = info.shape[0]
        row_elems = max(1, info.numel // rows)
        blocks = min(4, max(1, max_elements // row_elems))  # at least one whole row
        per_block = max(1, max_elements // (blocks * row_elems))
        starts = sorted({int(s) for s in np.linspace(0, rows - per_block, blocks)})
        return np.concatenate([self._read_rows(info, s, s + per_block).reshape(-1) for s in starts])

    def raw(self, name: str) -> tuple[str, tuple[int, ...], bytes]:
        """(dtype code, shape, little-endian bytes) of a whole tensor, for copying it unchanged."""
        info = self.tensors[name]
        if name in self._bin:
            import torch

            t = self._bin[name].contiguous().reshape(-1)
            return info.dtype, info.shape, t.view(torch.uint8).numpy().tobytes()
        path = self.root / info.file
        hdr = self._raw.get(info.file) or self._raw.setdefault(info.file, read_raw_header(path))
        _, _, (begin, end) = hdr.entries[name]
        with open(path, "rb") as f:
            f.seek(hdr.data_start + begin)
            return info.dtype, info.shape, f.read(end - begin)

    def _read_rows(self, info: TensorInfo, a: int, b: int):
        import numpy as np

        path = self.root / info.file
        if info.dtype in _NUMPY_DTYPES:
            from safetensors import safe_open

            with safe_open(str(path), framework="numpy") as f:
                sl = f.get_slice(info.name)
                arr = sl[a:b] if info.shape else f.get_tensor(info.name)
            return arr.astype(np.float32) if info.dtype in ("F16", "F64") else arr
        if info.dtype != "BF16":
            raise ValueError(f"{info.name}: dtype {info.dtype} has no numpy equivalent")
        raw = self._raw.get(info.file) or self._raw.setdefault(info.file, read_raw_header(path))
        _, shape, (begin, _) = raw.entries[info.name]
        row_elems = math.prod(shape[1:]) if len(shape) > 1 else 1
        count = (b - a) * row_elems if shape else 1
        half = np.fromfile(path, dtype="<u2", count=count, offset=raw.data_start + begin + a * row_elems * 2)
        return (half.astype(np.uint32) << 16).view(np.float32).reshape((b - a, *shape[1:]) if shape else ())


@dataclass
class DraftCheckpoint:
    """A draft model directory: `config.json` plus weights.

    config: the raw `config.json` (empty when unreadable, see `config_problem`). flat: the config
    a flat SGLang/HF reader would need — for speculators the `transformer_layer_config` merged
    under the top-level EAGLE-3 fields. format: `speculators` | `sglang` | `eagle` | `unknown`.
    """

    path: Path
    config: dict
    config_problem: str | None
    store: TensorStore
    flat: dict = field(default_factory=dict)
    format: str = "unknown"

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        return self.store.tensors

    def values(self, name: str, max_elements: int | None = None):
        return self.store.values(name, max_elements)

    # Convenience reads of the flat config, with HF defaults (transformers LlamaConfig).
    @property
    def hidden_size(self) -> int | None:
        return _int(self.flat.get("hidden_size"))

    @property
    def target_hidden_size(self) -> int | None:
        """Ht: `target_hidden_size` when set, else H (`hidden_size_in`, llama_eagle3.py@0.5.23)."""
        return _int(self.flat.get("target_hidden_size")) or self.hidden_size

    @property
    def vocab_size(self) -> int | None:
        return _int(self.flat.get("vocab_size"))

    @property
    def draft_vocab_size(self) -> int | None:
        """Vd as SGLang reads it: `draft_vocab_size`, None meaning "the target's lm_head"."""
        return _int(self.flat.get("draft_vocab_size"))

    @property
    def num_hidden_layers(self) -> int:
        return _int(self.flat.get("num_hidden_layers")) or 1

    @property
    def head_dim(self) -> int | None:
        hd = _int(self.flat.get("head_dim"))
        h, nh = self.hidden_size, _int(self.flat.get("num_attention_heads"))
        return hd or (h // nh if h and nh else None)

    def eagle_config(self) -> dict:
        ec = self.config.get("eagle_config")
        return ec if isinstance(ec, dict) else {}


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def detect_format(config: dict) -> str:
    """speculators | sglang | eagle | unknown (the formats in this module's docstring)."""
    if "speculators_model_type" in config or "transformer_layer_config" in config or "speculators_config" in config:
        return "speculators"
    arch = (config.get("architectures") or [""])[0] if isinstance(config.get("architectures"), list) else ""
    if "Eagle3" in str(arch):
        return "sglang"
    if "draft_vocab_size" in config or arch == "LlamaForCausalLM":
        return "eagle"
    return "unknown"


def flatten_config(config: dict) -> dict:
    """A flat view of the draft config. speculators: `transformer_layer_config` with the
    top-level EAGLE-3 fields over it (speculators/models/eagle3/config.py 0.9.0); other formats: the
    config itself."""
    inner = config.get("transformer_layer_config")
    if not isinstance(inner, dict):
        return dict(config)
    flat = dict(inner)
    for k, v in config.items():
        if k not in ("transformer_layer_config", "speculators_config", "architectures"):
            flat[k] = v
    flat["architectures"] = config.get("architectures")
    return flat


def load_draft(path: str | Path) -> DraftCheckpoint:
    """Read a draft directory. Raises CheckpointError when `path` is not a directory; every other
    defect (no config, unreadable weights) is recorded for the probes to report."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{path}: not a directory (give the draft checkpoint folder)")
    config, problem = _read_json(root / "config.json", checkpoint_bounds(root))
    config = config or {}
    return DraftCheckpoint(root, config, problem, TensorStore(root), flatten_config(config), detect_format(config))


@dataclass
class TargetModel:
    """The target (verifier): its config and, when the directory holds weights, their headers.

    architectures: the top-level class names SGLang instantiates (a VLM wrapper for multimodal
    models). text: the language model's config (`text_config` & co. for VLMs, else the config).
    """

    path: Path
    config: dict
    text: dict
    store: TensorStore | None

    @property
    def architecture(self) -> str | None:
        a = self.config.get("architectures")
        return str(a[0]) if isinstance(a, list) and a else None

    def get(self, key: str):
        """A text-config field, falling back to the top level (wrappers repeat some)."""
        return self.text[key] if key in self.text else self.config.get(key)

    @property
    def hidden_size(self) -> int | None:
        return _int(self.get("hidden_size"))

    @property
    def vocab_size(self) -> int | None:
        return _int(self.get("vocab_size"))

    @property
    def num_hidden_layers(self) -> int | None:
        return _int(self.get("num_hidden_layers"))

    def lm_head_name(self) -> str | None:
        """The tensor holding the target's output rows [V, Ht] (the embedding when tied), if present."""
        if self.store is None:
            return None
        names = ["lm_head.weight", "language_model.lm_head.weight", "model.language_model.lm_head.weight"]
        if self.get("tie_word_embeddings"):
            names += ["model.embed_tokens.weight", "language_model.model.embed_tokens.weight"]
        return next((n for n in names if n in self.store.tensors), None)


def load_target(path: str | Path) -> TargetModel:
    """Read a target model directory, or its `config.json`: the same model either way (a file
    named `config.json` stands for its folder, whose weights are read when present; any other
    JSON file is a config alone). Raises CheckpointError when the config is missing or unreadable
    (the target's config is an input the user gave)."""
    p = Path(path)
    cfg_path = p / "config.json" if p.is_dir() else p
    folder = p if p.is_dir() else p.parent if p.name == "config.json" else None  # the same model either way
    config, problem = _read_json(cfg_path, checkpoint_bounds(folder) if folder is not None else None)
    if config is None:
        raise CheckpointError(f"{path}: target config: {problem}")
    if p.name == "config.json" and p.is_file():
        p = p.parent
    text = next((config[k] for k in TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)), None)
    if text is None and isinstance(config.get("thinker_config"), dict):
        text = config["thinker_config"].get("text_config")
    store = TensorStore(p) if p.is_dir() and any(p.glob("*.safetensors")) else None
    return TargetModel(p, config, text if isinstance(text, dict) else config, store)
