"""Whether a model path holds a model, checked before anything loads it (one line otherwise).

A ``.gguf`` file must start with GGUF's magic, and the tensor data its header describes must fit in
the file (a file cut short, a download that stopped, is refused here rather than by a reshape deep
inside transformers). The header is walked here: ``gguf.GGUFReader`` builds a Python object for every
element of the vocabulary arrays (13-18 s for the 98 MB default model on 2 busy cores); the walk reads
only the lengths it needs, with the ``gguf`` package's tables of value and tensor types (~0.2 s).
A tensor's data must also end where the next one's begins (after the file's alignment): a shape edited
in the header makes its data overlap the next tensor's or leave a gap, and is refused here.

A Hugging Face model directory must hold a ``config.json`` that names its ``model_type``, and
safetensors weights whose headers are whole and whose data fit in their files. Pickle weights
(``*.bin``, ``*.pt``, ...) are never read: unpickling a file can run any code in it, so a folder
with only those is refused (beside safetensors ones they are ignored: the loader is told to read
safetensors only). The weights must then be the model the config builds (:func:`check_weights_fit`:
the config's model is built on the meta device, no memory, and its parameters' names and shapes
compared with the safetensors headers), so that another model's ``config.json`` is refused before a
load that would fail deep inside transformers, or build the other model with random weights.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import mmap
import os
import struct
import warnings
from pathlib import Path

from .._core.validation import LatentSiftError

#: What every refusal ends with: what a model path may be.
_WANTED = "pass a .gguf file or a Hugging Face model directory (config.json and safetensors weights)"
WEIGHT_PATTERNS = ("*.safetensors",)
#: At most this many bytes per token in the tokenizers we know (SmolLM2's longest token: 81 bytes, a run of
#: spaces 64 per token): a text of more bytes than this times a context cannot fit it, told before tokenising.
MAX_TOKEN_BYTES = 256
#: Weights stored as Python pickles: reading one can run any code it holds, so they are never read.
PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class _Header:
    """A little-endian reader of a GGUF header mapped in memory, refusing to read past the file's end.
    The vocabulary's ~50,000 strings are skipped by their lengths alone (one read call each took 1-3 s)."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def skip(self, n: int) -> int:
        """Move past ``n`` bytes; where they start."""
        start = self.pos
        if start + n > self.size:
            raise EOFError
        self.pos = start + n
        return start

    def u32(self) -> int:
        return _U32.unpack_from(self.buf, self.skip(4))[0]

    def u64(self) -> int:
        return _U64.unpack_from(self.buf, self.skip(8))[0]

    def string(self) -> str:
        n = self.u64()
        start = self.skip(n)
        return self.buf[start:start + n].decode("utf-8", errors="replace")

    def skip_value(self, vtype: int, scalar_sizes: dict) -> object:
        """Skip one metadata value; returns it when it is a scalar (``general.alignment`` is needed)."""
        import gguf

        if vtype == gguf.GGUFValueType.STRING:
            self.skip(self.u64())
            return None
        if vtype == gguf.GGUFValueType.ARRAY:
            item, count = self.u32(), self.u64()
            if item in scalar_sizes:
                self.skip(count * scalar_sizes[item])
            elif item == gguf.GGUFValueType.STRING:
                for _ in range(count):
                    self.skip(self.u64())
            else:
                for _ in range(count):
                    self.skip_value(item, scalar_sizes)
            return None
        if vtype not in scalar_sizes:
            raise ValueError(f"unknown metadata value type {vtype}")
        start = self.skip(scalar_sizes[vtype])
        return int.from_bytes(self.buf[start:start + scalar_sizes[vtype]], "little")


def gguf_data_end(path: Path) -> tuple[int, int]:
    """(bytes the GGUF file's tensors need, from its header; the file's size): :func:`gguf_layout`'s first two."""
    return gguf_layout(path)[:2]


def gguf_layout(path: Path) -> tuple[int, int, int | None]:
    """(bytes the GGUF file's tensors need, from its header; the file's size; its context in tokens, the
    header's ``<architecture>.context_length``, or None). Raises ``DamagedHeader``
    (the tensors' shapes do not tile the data: each must end where the next begins, after the alignment),
    ``ValueError`` (not GGUF, an unknown type) or ``EOFError`` (the header itself is cut short)."""
    import gguf

    scalar_sizes = {int(t): v(0).itemsize for t, v in gguf.GGUFReader.gguf_scalar_to_np.items()}
    size = path.stat().st_size
    if size == 0:
        raise EOFError
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        h = _Header(buf, size)
        if h.u32() != gguf.GGUF_MAGIC:
            raise ValueError("it does not start with GGUF's magic bytes")
        if h.u32() not in (2, 3):
            raise ValueError("an unknown GGUF version")
        n_tensors, n_kv = h.u64(), h.u64()
        alignment, context = gguf.GGUF_DEFAULT_ALIGNMENT, None
        for _ in range(n_kv):
            key, vtype = h.string(), h.u32()
            value = h.skip_value(vtype, scalar_sizes)
            if key == "general.alignment" and value:
                alignment = int(value)
            elif key.endswith(".context_length") and value:
                context = int(value)
        tensors = []   # (offset, bytes, name, dims)
        for _ in range(n_tensors):
            name = h.string()
            dims = [h.u64() for _ in range(h.u32())]
            kind, offset = h.u32(), h.u64()
            if kind not in gguf.GGML_QUANT_SIZES:
                raise ValueError(f"an unknown tensor type {kind}")
            block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
            tensors.append((offset, math.prod(dims) // block * block_bytes, name, dims))
        start = _aligned(h.pos, alignment)
    tensors.sort()
    for (offset, n, name, dims), (following, *_) in zip(tensors, tensors[1:] + [(None,)]):
        if following is not None and _aligned(offset + n, alignment) != following:
            raise DamagedHeader(f"tensor {name!r} of shape {dims} needs {n:,} bytes, and "
                                f"{following - offset:,} lie before the next tensor")
    end = tensors[-1][0] + tensors[-1][1] if tensors else 0
    if _aligned(start + end, alignment) < size:
        raise DamagedHeader(f"its tensors need {start + end:,} bytes and the file has {size:,}")
    return start + end, size, context


class DamagedHeader(ValueError):
    """A GGUF header whose tensors do not tile the file's data (a shape edited, a file patched)."""


def _aligned(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@functools.lru_cache(maxsize=16)
def _walked(path: str, size: int, mtime_ns: int) -> tuple[int, int, int | None]:
    """:func:`gguf_layout` once per file version (its size and modification time) in this process: a command
    checks ``--model`` and then loads it (which checks it again), a test session loads the model many times."""
    return gguf_layout(Path(path))


def _layout(p: Path) -> tuple[int, int, int | None]:
    st = p.stat()
    return _walked(str(p.resolve()), st.st_size, st.st_mtime_ns)


def context_length_of(path: Path) -> int | None:
    """The context in tokens of the model at ``path`` (checked by :func:`check_model_path`), read from its files
    without loading it: a GGUF header's ``<architecture>.context_length``, a config.json's
    ``max_position_embeddings`` (its ``text_config``'s for a multimodal one); None when they do not say."""
    if path.is_file():
        return _layout(path)[2]
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    value = (config.get("text_config") or config).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def check_model_path(path: str | os.PathLike, option: str | None = "--model") -> Path:
    """``path`` as a ``Path`` when it holds a model (see the module docstring), else one line saying
    what is wrong with it, naming it by ``option`` (the embedded default: ``None``, by its path)."""
    p = Path(path)
    name = f"{option} {str(p)!r}" if option else f"The model {str(p)!r}"
    if not p.exists():
        raise LatentSiftError(f"{name} does not exist. Pass a local Hugging Face model directory or a .gguf file "
                              "(no hub downloads are made).")
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise LatentSiftError(f"{name} is a folder without a config.json: {_WANTED}.")
        try:
            config = json.loads((p / "config.json").read_text(encoding="utf-8"))
            if not isinstance(config, dict):
                raise ValueError
        except (OSError, ValueError):
            raise LatentSiftError(f"{name}: its config.json is not a JSON object, so the folder is not a model; "
                                  f"{_WANTED}.") from None
        if not isinstance(config.get("model_type"), str) or not config["model_type"]:
            raise LatentSiftError(f"{name}: its config.json names no model_type, so it is no model's config; "
                                  f"{_WANTED}.")
        weights = sorted(f for pattern in WEIGHT_PATTERNS for f in p.glob(pattern))
        if not weights:
            pickles = sorted(f.name for pattern in PICKLE_PATTERNS for f in p.glob(pattern))
            if pickles:
                raise LatentSiftError(f"{name} holds pickle weights ({', '.join(pickles)}), which can run any code "
                                      "when read and are never loaded: convert them to safetensors.")
            raise LatentSiftError(f"{name} is a folder without weights (*.safetensors): {_WANTED}.")
        for f in weights:
            problem = safetensors_problem(f)
            if problem:
                raise LatentSiftError(f"{name}: {f.name} {problem}.")
        key = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in [p / "config.json", *weights])
        problem = _weights_fit(str(p.resolve()), key)
        if problem:
            raise LatentSiftError(f"{name}: {problem}.")
        return p
    if p.suffix != ".gguf":
        raise LatentSiftError(f"{name} is not a .gguf file; {_WANTED}.")
    try:
        need, size, _ = _layout(p)
    except EOFError:
        raise LatentSiftError(f"{name} is cut short inside its GGUF header: download or copy it again.") from None
    except DamagedHeader as e:
        raise LatentSiftError(f"{name}: its GGUF header does not describe its data ({e}): the file was edited or "
                              "damaged; download or copy it again.") from None
    except (ValueError, OSError) as e:
        raise LatentSiftError(f"{name} is not a GGUF model ({e}); {_WANTED}.") from None
    if need > size:
        raise LatentSiftError(f"{name} is cut short: its tensors need {need:,} bytes, the file has {size:,}; "
                              "download or copy it again.")
    return p


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` cannot be read whole (its header, then its tensors' data), or None."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            n = _U64.unpack(f.read(8))[0] if size >= 8 else None
            if n is None or 8 + n > size:
                return "is cut short inside its header: download or copy it again"
            header = json.loads(f.read(n))
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return "is not a safetensors file (its header does not read)"
    need = 8 + n + max(ends, default=0)
    if need > size:
        return f"is cut short: its tensors need {need:,} bytes, the file has {size:,}; download or copy it again"
    return None


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from a safetensors file's header (checked by :func:`safetensors_problem`)."""
    with open(path, "rb") as f:
        header = json.loads(f.read(_U64.unpack(f.read(8))[0]))
    return {k: tuple(t["shape"]) for k, t in header.items() if k != "__metadata__"}


@contextlib.contextmanager
def _quiet():
    """transformers' warnings about a config (its token ids, its defaults) silenced: the check says what matters."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


@functools.lru_cache(maxsize=16)
def _weights_fit(path: str, files: tuple) -> str | None:
    """:func:`check_weights_fit` once per version of the folder's files (names, sizes, times) in this process."""
    return check_weights_fit(Path(path))


def check_weights_fit(path: Path) -> str | None:
    """Why the safetensors weights of the model folder ``path`` are not the model its ``config.json`` builds,
    or None. The config's causal LM is built on the meta device (no memory, no weights read) and its
    parameters compared with the safetensors headers, names without the model's base prefix (a checkpoint
    of the bare decoder loads into its LM): a shape that differs is refused, and so are weights of which
    fewer than half of the parameters are found (another model's config). A few missing (tied ones, a
    renamed layer transformers converts) are left to the loader."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = None
    try:
        with _quiet():
            config = AutoConfig.from_pretrained(str(path), local_files_only=True)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - whatever transformers raises, the config is not one it builds
        what = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if config is None:
            return f"its config.json does not read as a transformers {transformers.__version__} config ({what})"
        return (f"its config.json (model_type {config.model_type!r}) is not a causal language model transformers "
                f"{transformers.__version__} can build ({what})")
    prefix = f"{model.base_model_prefix}." if model.base_model_prefix else ""

    def bare(name: str) -> str:
        return name.removeprefix(prefix)

    have = {bare(k): (shape, f.name) for f in sorted(path.glob("*.safetensors"))
            for k, shape in safetensors_shapes(f).items()}
    groups: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for k, v in model.named_parameters(remove_duplicate=False):   # tied parameters: one group
        groups.setdefault(id(v), []).append((bare(k), tuple(v.shape)))
    found = 0
    for names in groups.values():
        hit = next(((k, want) for k, want in names if k in have), None)
        if hit is None:
            continue
        found += 1
        k, want = hit
        if have[k][0] != want:
            return (f"its weights do not fit its config.json: {have[k][1]} holds {k!r} of shape {list(have[k][0])}, "
                    f"the config's {type(model).__name__} wants {list(want)}; the config or the weights were edited "
                    "or are another model's")
    if found * 2 < len(groups):
        missing = next(names[0][0] for names in groups.values() if not any(k in have for k, _ in names))
        return (f"its weights are not the model its config.json builds: {found} of the {len(groups)} weights of "
                f"{type(model).__name__} are in its safetensors files (no {missing!r}); the config.json is "
                "another model's")
    return None
