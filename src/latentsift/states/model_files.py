"""Whether a model path holds a model, checked before anything loads it (one line otherwise).

A ``.gguf`` file must start with GGUF's magic, and the tensor data its header describes must fit in
the file (a file cut short, a download that stopped, is refused here rather than by a reshape deep
inside transformers). The header is walked here: ``gguf.GGUFReader`` builds a Python object for every
element of the vocabulary arrays (13-18 s for the 98 MB default model on 2 busy cores); the walk reads
only the lengths it needs, with the ``gguf`` package's tables of value and tensor types (~0.2 s).
A Hugging Face model directory must hold a readable ``config.json`` and weights
(``*.safetensors`` or ``*.bin``).
"""
from __future__ import annotations

import functools
import json
import math
import mmap
import os
import struct
from pathlib import Path

from .._core.validation import LatentSiftError

#: What every refusal ends with: what a model path may be.
_WANTED = "pass a .gguf file or a Hugging Face model directory (config.json and weights)"
WEIGHT_PATTERNS = ("*.safetensors", "*.bin")


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
    """(bytes the GGUF file's tensors need, from its header; the file's size). Raises ``ValueError``
    (not GGUF, an unknown type) or ``EOFError`` (the header itself is cut short)."""
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
        alignment = gguf.GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key, vtype = h.string(), h.u32()
            value = h.skip_value(vtype, scalar_sizes)
            if key == "general.alignment" and value:
                alignment = int(value)
        end = 0
        for _ in range(n_tensors):
            h.skip(h.u64())
            dims = [h.u64() for _ in range(h.u32())]
            kind, offset = h.u32(), h.u64()
            if kind not in gguf.GGML_QUANT_SIZES:
                raise ValueError(f"an unknown tensor type {kind}")
            block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
            end = max(end, offset + math.prod(dims) // block * block_bytes)
        start = -(-h.pos // alignment) * alignment
    return start + end, size


@functools.lru_cache(maxsize=16)
def _walked(path: str, size: int, mtime_ns: int) -> tuple[int, int]:
    """:func:`gguf_data_end` once per file version (its size and modification time) in this process: a command
    checks ``--model`` and then loads it (which checks it again), a test session loads the model many times."""
    return gguf_data_end(Path(path))


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
            if not isinstance(json.loads((p / "config.json").read_text(encoding="utf-8")), dict):
                raise ValueError
        except (OSError, ValueError):
            raise LatentSiftError(f"{name}: its config.json is not a JSON object, so the folder is not a model; "
                                  f"{_WANTED}.") from None
        if not any(next(p.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
            raise LatentSiftError(f"{name} is a folder without weights (*.safetensors or *.bin): {_WANTED}.")
        return p
    if p.suffix != ".gguf":
        raise LatentSiftError(f"{name} is not a .gguf file; {_WANTED}.")
    try:
        st = p.stat()
        need, size = _walked(str(p.resolve()), st.st_size, st.st_mtime_ns)
    except EOFError:
        raise LatentSiftError(f"{name} is cut short inside its GGUF header: download or copy it again.") from None
    except (ValueError, OSError) as e:
        raise LatentSiftError(f"{name} is not a GGUF model ({e}); {_WANTED}.") from None
    if need > size:
        raise LatentSiftError(f"{name} is cut short: its tensors need {need:,} bytes, the file has {size:,}; "
                              "download or copy it again.")
    return p
